"""A small self-checking workload for the coordinator, the simulator and
tests: each item hashes its payload with one shared object's content.

Triage is idempotent per (item, token) and counts what a run must never do:
apply an item's local effect twice, or commit two different tokens of one
item (the store's fence forbids both). The "shared effect" (the item's
digest, as the corpus would be) may be applied again by anyone: that is a
rerun, counted but harmless.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatchtx import DispatchTables, Transaction
from dispatchtx.coordinator.queue import QueueState, WorkQueue
from dispatchtx.coordinator.workload import DispatchTag, Workload
from dispatchtx.fs import FS
from dispatchtx.resources.dispatch_log import DispatchLog
from dispatchtx.store import object_id_of
from dispatchtx.transport import Work

__all__ = ["HashWorkload", "TriageLedger", "hash_task"]


def result_name(work_id: str, token: int) -> str:
    """The file of one committed result: named by the item's hash and the
    commit's token, never by the work id itself."""
    return f"{hashlib.sha256(work_id.encode()).hexdigest()}.{token}"


def link_result(fs: FS, directory: str, work_id: str, token: int, result: bytes) -> None:
    """Link a committed result into place, once: an immutable file (EEXIST
    means a rerun of triage already put it there)."""
    fs.mkdir(directory)
    temp = fs.write_temp(directory, work_id.encode() + b"\n" + result)
    try:
        fs.link(temp, os.path.join(directory, result_name(work_id, token)))
    except FileExistsError:
        pass
    finally:
        fs.unlink(temp)
    fs.fsync_dir(directory)


def hash_task(work: Work, objects: Mapping[str, bytes]) -> bytes:
    """The worker's task: sha256(payload + the object it names)."""
    payload = work.payload
    if not isinstance(payload, list) or len(payload) != 2:
        raise ValueError(f"expected [text, object id], got {payload!r}")
    text, object_id = payload
    return hashlib.sha256(str(text).encode() + objects[str(object_id)]).digest()


@dataclass
class TriageLedger:
    """What triage did, shared by every coordinator of one run (as the
    corpus on the shared filesystem would be)."""

    digests: dict[str, bytes] = field(default_factory=dict)  # the shared effect
    committed_token: dict[str, int] = field(default_factory=dict)
    # The owner's local effects, once per (item, commit slot); in a real
    # coordinator this ledger is journaled, so it survives a restart.
    local_applied: Counter[tuple[str, int]] = field(default_factory=Counter)
    triage_runs: Counter[tuple[str, int]] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    @property
    def reruns(self) -> int:
        return sum(runs - 1 for runs in self.triage_runs.values())

    @property
    def effects_applied_twice(self) -> int:
        """Local effects applied more than once (never, if triage is right)."""
        return sum(1 for count in self.local_applied.values() if count > 1)


class HashWorkload(Workload):
    """`n_items` items over `n_objects` shared contents."""

    def __init__(
        self,
        n_items: int,
        *,
        n_objects: int = 4,
        prefix: str = "item",
        ledger: TriageLedger | None = None,
        results: tuple[FS, str] | None = None,
    ) -> None:
        self.contents = [f"object {i}".encode() * 8 for i in range(n_objects)]
        self.object_ids = [object_id_of(content) for content in self.contents]
        self._by_id = dict(zip(self.object_ids, self.contents, strict=True))
        self.items = [f"{prefix}-{i}" for i in range(n_items)]
        self._queue = WorkQueue(self.items)
        self.ledger = TriageLedger() if ledger is None else ledger
        self.dropped: dict[str, str] = {}
        # Where triage links each committed result, as a shared effect that
        # any coordinator may apply and a checker re-derives from disk.
        self._results = results

    # -- the queue --------------------------------------------------------------

    def attach(self, tables: DispatchTables[DispatchTag], dispatch_log: DispatchLog | None) -> None:
        # A new coordinator incarnation: what the dead one had taken is
        # pending again (its memory, and so its dispatches, are gone).
        self._queue.give_back_taken()

    def take(self) -> str | None:
        return self._queue.take()

    def give_back(self, work_id: str) -> None:
        self._queue.give_back(work_id)

    def done(self, work_id: str) -> None:
        self._queue.done(work_id)

    def drop(self, work_id: str, reason: str) -> None:
        if self._queue.drop(work_id):
            self.dropped[work_id] = reason

    def remaining(self) -> int:
        return self._queue.remaining()

    def status(self, work_id: str) -> QueueState:
        return self._queue.state(work_id)

    # -- a dispatch --------------------------------------------------------------

    def object_for(self, work_id: str) -> str:
        index = int(hashlib.sha256(work_id.encode()).hexdigest(), 16) % len(self.object_ids)
        return self.object_ids[index]

    def reserve(
        self, txn: Transaction[DispatchTag], worker: int, work_id: str
    ) -> tuple[object, list[str]]:
        object_id = self.object_for(work_id)
        return [work_id, object_id], [object_id]

    def object_content(self, object_id: str) -> bytes:
        return self._by_id[object_id]

    def expected(self, work_id: str) -> bytes:
        content = self._by_id[self.object_for(work_id)]
        return hashlib.sha256(work_id.encode() + content).digest()

    # -- triage --------------------------------------------------------------------

    def triage(self, work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        ledger = self.ledger
        key = (work_id, token)
        ledger.triage_runs[key] += 1
        if result != self.expected(work_id):
            ledger.violations.append(f"{work_id}: wrong result committed")
        earlier = ledger.committed_token.setdefault(work_id, token)
        if earlier != token:
            ledger.violations.append(f"{work_id}: committed with tokens {earlier} and {token}")
        ledger.digests[work_id] = result  # shared: idempotent, anyone may apply
        if self._results is not None:
            fs, directory = self._results
            link_result(fs, directory, work_id, token, result)
        if owner and not ledger.local_applied[key]:
            # local: once per (item, commit slot); a rerun applies nothing
            ledger.local_applied[key] += 1

    # Shortcuts for tests.
    @property
    def violations(self) -> list[str]:
        return self.ledger.violations

    @property
    def digests(self) -> dict[str, bytes]:
        return self.ledger.digests

    @property
    def reruns(self) -> int:
        return self.ledger.reruns
