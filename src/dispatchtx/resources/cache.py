"""The worker object cache (docs/design.md, D7).

The core keeps, per worker, the object ids the worker is known to hold, and
updates it only once `send` returned (D7). So there is nothing to undo: a
dispatch that never went out never made the worker hold anything, and the
next dispatch carries the content again (fault point 5). This adapter
decides what a message must carry, `tables.missing(worker, ids)`, and tells
the core with `txn.ship(ids)`.

One case the core cannot see: a worker that reports it lacks an object the
cache says it holds (it restarted, or evicted it). The core has no way to
forget one object, so this adapter remembers the miss and makes every
dispatch to that worker carry the object until one such dispatch is
committed (its result proves the worker had the content). Only for those
dispatches does it register its compensation, a release on commit alone:
before send and after a lost result the miss stays, so the content is
carried again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    JournaledAdapter,
    JsonDict,
    Leak,
    SnapshotError,
    as_object,
    expect_kind,
    get_int,
    get_list,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from dispatchtx import DispatchTables, Transaction

__all__ = ["ObjectCache", "RecarriedObjects"]

_KIND = "objects"
_VERSION = 1


class RecarriedObjects(NamedTuple):
    """Objects a dispatch carries again after the worker reported them
    missing (the compensation's argument)."""

    worker: int
    object_ids: tuple[str, ...]


class ObjectCache(AdapterBase[RecarriedObjects], JournaledAdapter):
    """What each message must carry, from the core's per-worker cache."""

    __slots__ = ("_misses", "_recarry", "_tables")

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = ("miss", "delivered", "forget_worker")

    def __init__(self, tables: DispatchTables[Any], *, name: str = "objects") -> None:
        super().__init__(tables, name, None, None, self.delivered)
        self._tables = tables
        self._recarry: dict[int, dict[str, None]] = {}  # worker -> ids it reported missing
        self._misses = 0

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any], object_ids: Iterable[str]) -> list[str]:
        """The ids among `object_ids` whose content this message must carry,
        in the order given; the core caches them for the worker once the
        message is sent. Reserves nothing."""
        self._require_preparing(txn)
        wanted = list(object_ids)
        carry = self._tables.missing(txn.worker, wanted)
        reported = self._recarry.get(txn.worker)
        recarried: tuple[str, ...] = ()
        if reported:
            missing = set(carry)
            recarried = tuple(
                object_id
                for object_id in dict.fromkeys(wanted)
                if object_id in reported and object_id not in missing
            )
            carry.extend(recarried)
        txn.ship(carry)
        if recarried:
            self._register(
                txn,
                RecarriedObjects(txn.worker, recarried),
                self._nothing_to_undo,
            )
        return carry

    @staticmethod
    def _nothing_to_undo(_: RecarriedObjects) -> None:
        """Nothing was changed before `add`, so a refused `add` undoes nothing."""

    def report_miss(self, worker: int, object_id: str) -> None:
        """`worker` says it lacks `object_id`: carry it again to that worker
        until a dispatch carrying it is committed."""
        if not isinstance(object_id, str):
            raise TypeError(f"object ids must be str, not {type(object_id).__name__}")
        self._ev_miss(worker, object_id)

    def delivered(self, recarried: RecarriedObjects) -> None:
        """Release on commit: the worker has these objects again."""
        self._ev_delivered(recarried.worker, list(recarried.object_ids))

    def forget_worker(self, worker: int) -> None:
        """The worker is lost (`tables.lose_worker` forgot its cache too)."""
        if worker in self._recarry:
            self._ev_forget_worker(worker)

    # -- looking --------------------------------------------------------------

    @property
    def misses(self) -> int:
        """How many misses workers reported (a campaign metric)."""
        return self._misses

    def to_recarry(self, worker: int) -> list[str]:
        """The objects `worker` reported missing and has not had again."""
        return list(self._recarry.get(worker, ()))

    def leaks(self) -> list[Leak]:
        """Always empty: this adapter reserves nothing. (An object still to
        carry again is owed content, not a reservation.)"""
        return []

    # -- journaled events -----------------------------------------------------

    def _ev_miss(self, worker: int, object_id: str) -> None:
        self._recarry.setdefault(worker, {})[object_id] = None
        self._misses += 1

    def _ev_delivered(self, worker: int, object_ids: list[str]) -> None:
        reported = self._recarry.get(worker)
        if reported is None:
            return  # forgotten meanwhile (the worker was lost)
        for object_id in object_ids:
            reported.pop(object_id, None)
        if not reported:
            del self._recarry[worker]

    def _ev_forget_worker(self, worker: int) -> None:
        del self._recarry[worker]

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """The objects to carry again per worker and the miss count. The
        cache itself lives in the core and is not journaled: a restarted
        coordinator assumes its workers hold nothing."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "misses": self._misses,
            "recarry": [
                {"worker": worker, "object_ids": list(ids)} for worker, ids in self._recarry.items()
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the objects to carry again and the miss count."""
        expect_kind(state, _KIND, _VERSION)
        recarry: dict[int, dict[str, None]] = {}
        for item in get_list(state, "recarry"):
            entry = as_object(item, "a worker's objects")
            worker = get_int(entry, "worker")
            ids = get_list(entry, "object_ids")
            if worker in recarry or not ids or any(not isinstance(i, str) for i in ids):
                raise SnapshotError(f"worker {worker}: bad objects to carry again")
            recarry[worker] = dict.fromkeys(ids)
        self._misses = get_int(state, "misses")
        self._recarry = recarry
