"""Target groups and local targets (docs/design.md: undo and discard both
release; a committed dispatch releases too).

A target is something a dispatch occupies while it runs (a harness, a
device, a build slot) with a capacity of concurrent dispatches. Targets are
registered in groups; a target registered without a group is a local
target, a group of its own. A dispatch reserves either the least-loaded
target of a group or one named target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    get_str,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatchtx import DispatchTables, Transaction

__all__ = ["TargetRegistry", "TargetReservation"]

_KIND = "targets"
_VERSION = 1


class TargetReservation(NamedTuple):
    """One dispatch's hold on one target (the compensation's argument)."""

    target: str
    dispatch_id: int


@dataclass(slots=True)
class _Target:
    group: str
    capacity: int
    # Dispatch ids holding the target, in reservation order (a dict keeps
    # the order, so snapshots are stable).
    holders: dict[int, None] = field(default_factory=dict)


class TargetRegistry(AdapterBase[TargetReservation], JournaledAdapter):
    """Targets with a capacity each, grouped; one `Compensation` releases
    a hold whatever way the dispatch ends."""

    __slots__ = ("_groups", "_targets")

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = ("add_target", "hold", "release")

    def __init__(self, tables: DispatchTables[Any], *, name: str = "targets") -> None:
        # Undo, discard and the release on commit are the same act here.
        super().__init__(tables, name, self.release, self.release, self.release)
        self._targets: dict[str, _Target] = {}
        self._groups: dict[str, list[str]] = {}

    # -- configuration ------------------------------------------------------

    def add_target(self, target: str, *, group: str | None = None, capacity: int = 1) -> None:
        """Register `target` in `group` (by default its own group: a local
        target) with room for `capacity` concurrent dispatches."""
        if not isinstance(target, str) or not target:
            raise ValueError(f"a target name must be a non-empty str, got {target!r}")
        if target in self._targets:
            raise ValueError(f"target {target!r} is already registered")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._ev_add_target(target, target if group is None else group, capacity)

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any], group: str) -> TargetReservation:
        """Hold the least-loaded target of `group` that has room (the first
        registered wins a tie) for `txn`; `Unavailable` if none has."""
        self._require_preparing(txn)
        members = self._groups.get(group)
        if members is None:
            raise Unavailable(f"{self._name}: no target group {group!r}")
        best: str | None = None
        best_load = 0
        for target in members:
            record = self._targets[target]
            load = len(record.holders)
            if load < record.capacity and (best is None or load < best_load):
                best, best_load = target, load
        if best is None:
            raise Unavailable(f"{self._name}: every target of group {group!r} is full")
        return self._hold(txn, best)

    def reserve_target(self, txn: Transaction[Any], target: str) -> TargetReservation:
        """Hold the named target for `txn`; `Unavailable` if it is full."""
        self._require_preparing(txn, "reserve_target")
        record = self._targets.get(target)
        if record is None:
            raise Unavailable(f"{self._name}: no target {target!r}")
        if len(record.holders) >= record.capacity:
            raise Unavailable(f"{self._name}: target {target!r} is full")
        return self._hold(txn, target)

    def _hold(self, txn: Transaction[Any], target: str) -> TargetReservation:
        if txn.id in self._targets[target].holders:
            raise Unavailable(f"{self._name}: dispatch {txn.id} already holds {target!r}")
        reservation = TargetReservation(target, txn.id)
        self._ev_hold(target, txn.id)
        self._register(txn, reservation, self.release)
        return reservation

    def release(self, reservation: TargetReservation) -> None:
        """Give the target back (the undo, the discard and the release on
        commit alike)."""
        record = self._targets.get(reservation.target)
        if record is None or reservation.dispatch_id not in record.holders:
            raise NotReserved(
                f"{self._name}: dispatch {reservation.dispatch_id} "
                f"holds no target {reservation.target!r}"
            )
        self._ev_release(reservation.target, reservation.dispatch_id)

    # -- looking --------------------------------------------------------------

    def load(self, target: str) -> int:
        """How many dispatches hold `target` now."""
        return len(self._targets[target].holders)

    def holders(self, target: str) -> list[int]:
        """The dispatch ids holding `target`, oldest first."""
        return list(self._targets[target].holders)

    def free_capacity(self, group: str) -> int:
        """How many more dispatches `group` can take now."""
        return sum(
            self._targets[target].capacity - len(self._targets[target].holders)
            for target in self._groups.get(group, ())
        )

    def leaks(self) -> list[Leak]:
        """Every hold still in place (empty once every dispatch has ended)."""
        return [
            self._leak("target", target, dispatch_id)
            for target, record in self._targets.items()
            for dispatch_id in record.holders
        ]

    # -- journaled events -----------------------------------------------------

    def _ev_add_target(self, target: str, group: str, capacity: int) -> None:
        self._targets[target] = _Target(group, capacity)
        self._groups.setdefault(group, []).append(target)

    def _ev_hold(self, target: str, dispatch_id: int) -> None:
        self._targets[target].holders[dispatch_id] = None

    def _ev_release(self, target: str, dispatch_id: int) -> None:
        del self._targets[target].holders[dispatch_id]

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """The registry as JSON: targets in registration order, with holders."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "targets": [
                {
                    "target": target,
                    "group": record.group,
                    "capacity": record.capacity,
                    "holders": list(record.holders),
                }
                for target, record in self._targets.items()
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the whole registry by a `snapshot()` (before dispatching:
        holds restored here belong to no live transaction)."""
        expect_kind(state, _KIND, _VERSION)
        targets: dict[str, _Target] = {}
        groups: dict[str, list[str]] = {}
        for item in get_list(state, "targets"):
            entry = as_object(item, "a target")
            target = get_str(entry, "target")
            if target in targets:
                raise SnapshotError(f"target {target!r} appears twice")
            record = _Target(get_str(entry, "group"), get_int(entry, "capacity", minimum=1))
            for dispatch_id in get_list(entry, "holders"):
                if type(dispatch_id) is not int or dispatch_id in record.holders:
                    raise SnapshotError(f"target {target!r}: bad holder {dispatch_id!r}")
                record.holders[dispatch_id] = None
            targets[target] = record
            groups.setdefault(record.group, []).append(target)
        self._targets = targets
        self._groups = groups
