"""What the simulator checks against each item's slot chain once a schedule
has run (docs/design.md, the store's `link()` chain and its fence).

`RecordingStore` is the store a simulated coordinator runs on: it notes
each claim it won and each commit it made, once durable (at the end of a
store batch, for what was published inside one). `check_chains` then
reads every chain from the disk with no faults and finds:

- a chain out of shape: slot n not at position n, a claim whose token is
  not its slot, a commit not right after the claim it names, by that
  claim's owner (a fence that took a token other than the head claim's),
  two commits, a `done` for another token than the commit's;
- a claim a coordinator acted on that the chain gives to another owner, or
  does not hold at all (a claim decided from a read that said "absent");
- a commit a coordinator acted on that the chain does not hold as its own;
- an owner's local effects (a reward, a feedback, a verdict) applied by a
  coordinator that did not claim the commit (a peer rolling it forward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dispatchtx.coordinator.workload import Workload
from dispatchtx.store import (
    Change,
    ClaimOutcome,
    ClaimResult,
    CommitOutcome,
    CompleteOutcome,
    Owner,
    StoreError,
    WorkStore,
)

__all__ = ["Belief", "OwnerEffect", "RecordingStore", "check_chains", "record_owner_effects"]


@dataclass(frozen=True, slots=True)
class Belief:
    """A claim won or a commit made, as the coordinator that acted saw it."""

    kind: str  # "claim" or "commit"
    work_id: str
    token: int
    owner: Owner


@dataclass(frozen=True, slots=True)
class OwnerEffect:
    """Triage run as the item's owner: its local effects were applied."""

    coordinator: str
    work_id: str
    token: int


def record_owner_effects(workload: Workload, coordinator: str, effects: list[OwnerEffect]) -> None:
    """Append to `effects` each triage `workload` runs as the owner."""
    triage = workload.triage

    def recorded(work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        triage(work_id, token, result, owner=owner)
        if owner:
            effects.append(OwnerEffect(coordinator, work_id, token))

    workload.triage = recorded  # type: ignore[method-assign]


class RecordingStore(WorkStore):
    """A `WorkStore` that appends to `beliefs` what it won, once durable."""

    def __init__(
        self,
        *args: Any,
        beliefs: list[Belief],
        before_call: Callable[[str, str], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.beliefs = beliefs
        # Called with "begin_commit" or "complete" and the work id as either
        # starts (the simulator pauses a coordinator there).
        self.before_call = before_call
        self._held: list[Belief] | None = None

    def _note(self, kind: str, work_id: str, token: int) -> None:
        owner = self.owner
        assert owner is not None  # claims and commits need a registered store
        belief = Belief(kind, work_id, token, owner)
        if self._held is not None:
            self._held.append(belief)  # durable only if the batch ends well
        else:
            self.beliefs.append(belief)

    def try_claim(self, work_id: str, now: float | None = None) -> ClaimResult:
        result = super().try_claim(work_id, now)
        if result.outcome is ClaimOutcome.CLAIMED and result.token is not None:
            self._note("claim", work_id, result.token)
        return result

    def begin_commit(self, work_id: str, token: int, result: bytes) -> CommitOutcome:
        if self.before_call is not None:
            self.before_call("begin_commit", work_id)
        outcome = super().begin_commit(work_id, token, result)
        if outcome is CommitOutcome.COMMITTED:
            self._note("commit", work_id, token)
        return outcome

    def complete(self, work_id: str, token: int) -> CompleteOutcome:
        if self.before_call is not None:
            self.before_call("complete", work_id)
        return super().complete(work_id, token)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        held: list[Belief] = []
        self._held = held
        try:
            with super().batch():
                yield
        finally:
            self._held = None
        self.beliefs.extend(held)  # the block ended without error: all durable


def check_chains(
    store: WorkStore, beliefs: list[Belief], owner_effects: Sequence[OwnerEffect] = ()
) -> list[str]:
    """Every item's chain in `store` (read with no faults), checked for its
    shape and against what the coordinators acted on."""
    problems: list[str] = []
    chains = {}
    survey = store.survey()
    problems.extend(
        f"item {key} does not read: {why}" for key, why in sorted(survey.unreadable.items())
    )
    for state in survey.states:
        try:
            chain = store.history(state.work_id)
        except StoreError as error:  # the chain itself is out of shape
            problems.append(f"{state.work_id!r}: its chain does not read: {error}")
            continue
        chains[state.work_id] = chain
        commits = []
        for index, record in enumerate(chain):
            where = f"{state.work_id!r} slot {record.slot}"
            if record.slot != index + 1:
                problems.append(f"{where} found at position {index + 1} of its chain")
            if record.change is Change.CLAIM and record.token != record.slot:
                problems.append(f"{where}: a claim with token {record.token}")
            if record.change is Change.COMMIT:
                commits.append(record)
                claim = chain[index - 1] if index else None
                if (
                    claim is None
                    or claim.change is not Change.CLAIM
                    or claim.token != record.token
                    or claim.owner != record.owner
                ):
                    problems.append(
                        f"{where}: a commit by {record.owner} under token {record.token} does "
                        f"not follow that claim (the slot before: "
                        f"{'none' if claim is None else f'{claim.change.value} {claim.owner}'})"
                        ": the fence took a token other than the head claim's"
                    )
            if record.change is Change.DONE and (not commits or commits[-1].token != record.token):
                problems.append(f"{where}: done for token {record.token} without its commit")
        if len(commits) > 1:
            problems.append(f"{state.work_id!r} committed {len(commits)} times")
    for belief in beliefs:
        chain = chains.get(belief.work_id, [])
        slot = belief.token if belief.kind == "claim" else belief.token + 1
        held = chain[slot - 1] if 0 < slot <= len(chain) else None
        want = Change.CLAIM if belief.kind == "claim" else Change.COMMIT
        if held is None or held.change is not want or held.owner != belief.owner:
            found = "nothing" if held is None else f"{held.change.value} by {held.owner}"
            problems.append(
                f"{belief.owner} acted on its {belief.kind} of {belief.work_id!r} "
                f"(token {belief.token}), but slot {slot} holds {found}"
            )
    for effect in owner_effects:
        chain = chains.get(effect.work_id, [])
        commit = chain[effect.token] if effect.token < len(chain) else None
        claimer = None if commit is None or commit.owner is None else commit.owner.coordinator
        if claimer != effect.coordinator:
            problems.append(
                f"{effect.coordinator} applied the owner's local effects of {effect.work_id!r} "
                f"(token {effect.token}), whose commit is {claimer or 'nobody'}'s"
            )
    return problems
