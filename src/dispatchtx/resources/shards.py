"""State-shard task leases (docs/design.md).

The coordinator's state is cut into shards, each holding tasks; a dispatch
leases one task. Each task counts its leases (true dispatches) and its
failures (dispatches whose result was lost or fenced out):

- undo before send: drop the lease and take back the lease count (D3: an
  unsent task is never counted);
- discard after a stale or lost result: drop the active lease and record one
  failure (the lease count stays: the task really went out);
- release on commit: drop the lease.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    JournaledAdapter,
    JsonDict,
    Leak,
    NotReserved,
    SnapshotError,
    Unavailable,
    as_object,
    expect_kind,
    get_int,
    get_list,
    get_optional_int,
    get_str,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatchtx import DispatchTables, Transaction

__all__ = ["ShardLease", "ShardLeases"]

_KIND = "shards"
_VERSION = 1


class ShardLease(NamedTuple):
    """One dispatch's lease on one task (the compensation's argument)."""

    shard: str
    task: str
    dispatch_id: int


@dataclass(slots=True)
class _Task:
    leases: int = 0
    failures: int = 0
    holder: int | None = None  # the dispatch id of the active lease


class ShardLeases(AdapterBase[ShardLease], JournaledAdapter):
    """Task leases per state shard, with lease and failure counts."""

    __slots__ = "_shards"

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = (
        "add_task",
        "lease",
        "take_back",
        "fail",
        "release",
    )

    def __init__(self, tables: DispatchTables[Any], *, name: str = "shards") -> None:
        super().__init__(tables, name, self.undo, self.discard, self.release)
        self._shards: dict[str, dict[str, _Task]] = {}

    # -- configuration ------------------------------------------------------

    def add_task(self, shard: str, task: str) -> None:
        """Register `task` in `shard`, unleased, with zero counts."""
        for what, value in (("shard", shard), ("task", task)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"a {what} name must be a non-empty str, got {value!r}")
        if task in self._shards.get(shard, {}):
            raise ValueError(f"task {task!r} of shard {shard!r} is already registered")
        self._ev_add_task(shard, task)

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any], shard: str, task: str | None = None) -> ShardLease:
        """Lease `task` of `shard` to `txn`; without a task, the free one with
        the fewest failures, then the fewest leases (first registered wins a
        tie). `Unavailable` if it is leased or the shard has no free task."""
        self._require_preparing(txn)
        tasks = self._shards.get(shard)
        if tasks is None:
            raise Unavailable(f"{self._name}: no shard {shard!r}")
        if task is None:
            task = self._pick_free(tasks)
            if task is None:
                raise Unavailable(f"{self._name}: every task of shard {shard!r} is leased")
        else:
            record = tasks.get(task)
            if record is None:
                raise Unavailable(f"{self._name}: shard {shard!r} has no task {task!r}")
            if record.holder is not None:
                raise Unavailable(
                    f"{self._name}: task {task!r} of shard {shard!r} is leased "
                    f"to dispatch {record.holder}"
                )
        lease = ShardLease(shard, task, txn.id)
        self._ev_lease(shard, task, txn.id)
        self._register(txn, lease, self.undo)
        return lease

    @staticmethod
    def _pick_free(tasks: dict[str, _Task]) -> str | None:
        best: str | None = None
        best_key = (0, 0)
        for name, record in tasks.items():
            if record.holder is None:
                key = (record.failures, record.leases)
                if best is None or key < best_key:
                    best, best_key = name, key
        return best

    def undo(self, lease: ShardLease) -> None:
        """Before send: drop the lease and take back the lease count."""
        self._check_held(lease)
        self._ev_take_back(lease.shard, lease.task, lease.dispatch_id)

    def discard(self, lease: ShardLease) -> None:
        """After a stale or lost result: drop the lease, record one failure."""
        self._check_held(lease)
        self._ev_fail(lease.shard, lease.task, lease.dispatch_id)

    def release(self, lease: ShardLease) -> None:
        """On commit: drop the lease; the counts stay."""
        self._check_held(lease)
        self._ev_release(lease.shard, lease.task, lease.dispatch_id)

    def _check_held(self, lease: ShardLease) -> None:
        record = self._shards.get(lease.shard, {}).get(lease.task)
        if record is None or record.holder != lease.dispatch_id:
            raise NotReserved(
                f"{self._name}: dispatch {lease.dispatch_id} holds no lease on "
                f"task {lease.task!r} of shard {lease.shard!r}"
            )

    # -- looking --------------------------------------------------------------

    def lease_count(self, shard: str, task: str) -> int:
        """How many dispatches of this task really went out (or are leased now)."""
        return self._shards[shard][task].leases

    def failure_count(self, shard: str, task: str) -> int:
        """How many of them ended with a lost or fenced-out result."""
        return self._shards[shard][task].failures

    def holder(self, shard: str, task: str) -> int | None:
        """The dispatch id holding the task's lease, if any."""
        return self._shards[shard][task].holder

    def leaks(self) -> list[Leak]:
        """Every lease still active."""
        return [
            self._leak("lease", f"{shard}/{task}", record.holder)
            for shard, tasks in self._shards.items()
            for task, record in tasks.items()
            if record.holder is not None
        ]

    # -- journaled events -----------------------------------------------------

    def _ev_add_task(self, shard: str, task: str) -> None:
        self._shards.setdefault(shard, {})[task] = _Task()

    def _ev_lease(self, shard: str, task: str, dispatch_id: int) -> None:
        record = self._shards[shard][task]
        record.holder = dispatch_id
        record.leases += 1

    def _ev_take_back(self, shard: str, task: str, dispatch_id: int) -> None:
        record = self._shards[shard][task]
        record.holder = None
        record.leases -= 1

    def _ev_fail(self, shard: str, task: str, dispatch_id: int) -> None:
        record = self._shards[shard][task]
        record.holder = None
        record.failures += 1

    def _ev_release(self, shard: str, task: str, dispatch_id: int) -> None:
        self._shards[shard][task].holder = None

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """Every task with its counts and active lease, in registration order."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "tasks": [
                {
                    "shard": shard,
                    "task": task,
                    "leases": record.leases,
                    "failures": record.failures,
                    "holder": record.holder,
                }
                for shard, tasks in self._shards.items()
                for task, record in tasks.items()
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace every task's counts and lease by a `snapshot()`."""
        expect_kind(state, _KIND, _VERSION)
        shards: dict[str, dict[str, _Task]] = {}
        for item in get_list(state, "tasks"):
            entry = as_object(item, "a task")
            shard, task = get_str(entry, "shard"), get_str(entry, "task")
            tasks = shards.setdefault(shard, {})
            if task in tasks:
                raise SnapshotError(f"task {task!r} of shard {shard!r} appears twice")
            tasks[task] = _Task(
                get_int(entry, "leases"),
                get_int(entry, "failures"),
                get_optional_int(entry, "holder"),
            )
        self._shards = shards
