"""The audit: `committed_slots` (the store's view) and `check_campaign_dir`,
which re-derives from disk what a run left, for the campaign report."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from dispatchtx.fs import FS, TEMP_PREFIX
from dispatchtx.jobs.workloads.fuzz.campaign_dir import CampaignDir, decode_delta
from dispatchtx.jobs.workloads.fuzz.payload import _ENTRY_NAME, _ITEM_ID
from dispatchtx.jobs.workloads.targets import (
    execute,
    target_of_signature,
)
from dispatchtx.store import ItemState, ItemStatus, object_id_of


def committed_slots(states: Iterable[ItemState]) -> dict[str, int]:
    """The store's view for `check_campaign_dir`: item -> committed slot, for
    items DONE (e.g. `committed_slots(store.items())`)."""
    return {
        state.work_id: state.token
        for state in states
        if state.status is ItemStatus.DONE and state.token is not None
    }


# --------------------------------------------------------------------------
# the audit


@dataclass
class CampaignCheck:
    """What `check_campaign_dir` re-derived from disk."""

    corpus_entries: int = 0
    crash_files: int = 0
    signatures: set[str] = field(default_factory=set)
    deltas: int = 0
    coverage: set[int] = field(default_factory=set)
    temp_files: int = 0  # garbage left by a kill between write_temp and unlink
    problems: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, object]:
        """For the campaign's JSON report."""
        return {
            "consistent": self.consistent,
            "corpus_entries": self.corpus_entries,
            "crash_files": self.crash_files,
            "signatures": sorted(self.signatures),
            "coverage_deltas": self.deltas,
            "coverage_edges": len(self.coverage),
            "temp_files": self.temp_files,
            "problems": list(self.problems),
        }


def check_campaign_dir(
    fs: FS,
    root: str,
    *,
    committed: Mapping[str, int] | None = None,
    coverage: Collection[int] | None = None,
) -> CampaignCheck:
    """Re-derive the campaign from disk and report every inconsistency:

    - every corpus entry is named by the sha256 of its content;
    - every crash file reproduces its signature on its target;
    - every coverage delta parses; coverage is their union (and equals
      `coverage`, the coordinators' triaged view, when given);
    - no item has files under two different commit slots;
    - with `committed` (the store's view, see `committed_slots`): every file
      belongs to the slot the store committed, and every committed fuzz item
      has its delta (no shared effect lost).
    """
    directory = CampaignDir(fs, root)
    report = CampaignCheck()
    problems = report.problems
    slots: dict[str, set[int]] = {}

    def note_entry(where: str, name: str) -> None:
        match = _ENTRY_NAME.fullmatch(name)
        if match is None or _ITEM_ID.fullmatch(match.group(1)) is None:
            problems.append(f"{where}/{name}: not named <item>.<slot>")
            return
        slots.setdefault(match.group(1), set()).add(int(match.group(2)))

    for name in directory.listdir(CampaignDir.CORPUS):
        report.corpus_entries += 1
        content = fs.read(directory.path(CampaignDir.CORPUS, name))
        if object_id_of(content) != name:
            problems.append(f"corpus/{name}: content hashes to {object_id_of(content)}")
    for signature in directory.listdir(CampaignDir.CRASHES):
        target = target_of_signature(signature)
        if target is None:
            problems.append(f"crashes/{signature}: not a crash signature of a bundled target")
            continue
        report.signatures.add(signature)
        for name in directory.listdir(CampaignDir.CRASHES, signature):
            report.crash_files += 1
            note_entry(f"crashes/{signature}", name)
            content = fs.read(directory.path(CampaignDir.CRASHES, signature, name))
            again = execute(target, content).crash
            if again != signature:
                problems.append(f"crashes/{signature}/{name}: reproduces as {again!r}")
    for name in directory.listdir(CampaignDir.DELTAS):
        report.deltas += 1
        note_entry("coverage/deltas", name)
        try:
            _, edges = decode_delta(fs.read(directory.path(CampaignDir.DELTAS, name)))
        except ValueError as error:
            problems.append(f"coverage/deltas/{name}: {error}")
            continue
        report.coverage |= edges
    report.temp_files = sum(
        1 for name in directory.listdir(CampaignDir.TMP) if name.startswith(TEMP_PREFIX)
    )
    for item, item_slots in sorted(slots.items()):
        if len(item_slots) > 1:
            problems.append(f"{item}: files under commit slots {sorted(item_slots)}")
        if committed is not None:
            store_slot = committed.get(item)
            if store_slot is None or item_slots != {store_slot}:
                problems.append(
                    f"{item}: files under slots {sorted(item_slots)}, store committed {store_slot}"
                )
    if committed is not None:
        for item, slot in sorted(committed.items()):
            delta = directory.path(CampaignDir.DELTAS, f"{item}.{slot}")
            if _ITEM_ID.fullmatch(item) is not None and not fs.exists(delta):
                problems.append(f"{item}: committed under slot {slot} but has no coverage delta")
    if coverage is not None and set(coverage) != report.coverage:
        missing = len(set(coverage) - report.coverage)
        extra = len(report.coverage - set(coverage))
        problems.append(
            f"coverage: {missing} triaged edges have no delta, {extra} delta edges were "
            "never triaged"
        )
    return report
