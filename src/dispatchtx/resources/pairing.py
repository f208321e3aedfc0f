"""Seed-to-worker assignment (docs/design.md).

A dispatch pairs one seed with the worker it goes to. A seed has at most one
active pairing at a time; every pairing that really went out is counted,
per seed and per (seed, worker):

- undo before send: drop the active pairing and take back the assignment
  count (D3: an unsent task is never counted);
- discard after a stale or lost result: drop the active pairing, keep the
  true count (the seed really went to that worker);
- release on commit: drop the active pairing.
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
    get_dict,
    get_int,
    get_list,
    get_str,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from dispatchtx import DispatchTables, Transaction

__all__ = ["Pairing", "SeedPairing"]

_KIND = "pairing"
_VERSION = 1


class Pairing(NamedTuple):
    """One active seed-to-worker pairing (the compensation's argument)."""

    seed: str
    worker: int
    dispatch_id: int


@dataclass(slots=True)
class _Seed:
    assignments: int = 0
    by_worker: dict[int, int] = field(default_factory=dict)
    active: tuple[int, int] | None = None  # (worker, dispatch id)


class SeedPairing(AdapterBase[Pairing], JournaledAdapter):
    """Active seed-to-worker pairings with true assignment counts."""

    __slots__ = "_seeds"

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = ("pair", "take_back", "unpair")

    def __init__(self, tables: DispatchTables[Any], *, name: str = "pairing") -> None:
        super().__init__(tables, name, self.undo, self.discard, self.release)
        self._seeds: dict[str, _Seed] = {}

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any], seed: str) -> Pairing:
        """Pair `seed` with `txn`'s worker; `Unavailable` if the seed is
        paired already."""
        self._require_preparing(txn)
        if not isinstance(seed, str) or not seed:
            raise ValueError(f"a seed id must be a non-empty str, got {seed!r}")
        record = self._seeds.get(seed)
        if record is not None and record.active is not None:
            worker, dispatch_id = record.active
            raise Unavailable(
                f"{self._name}: seed {seed!r} is paired with worker {worker} "
                f"by dispatch {dispatch_id}"
            )
        pairing = Pairing(seed, txn.worker, txn.id)
        self._ev_pair(seed, txn.worker, txn.id)
        self._register(txn, pairing, self.undo)
        return pairing

    def least_assigned(self, seeds: Iterable[str], worker: int | None = None) -> str | None:
        """Of `seeds`, the unpaired one with the fewest assignments (to
        `worker`, if given; then overall; the first wins a tie), or None."""
        best: str | None = None
        best_key = (0, 0)
        for seed in seeds:
            record = self._seeds.get(seed)
            if record is None:
                key = (0, 0)
            elif record.active is not None:
                continue
            else:
                to_worker = 0 if worker is None else record.by_worker.get(worker, 0)
                key = (to_worker, record.assignments)
            if best is None or key < best_key:
                best, best_key = seed, key
        return best

    def undo(self, pairing: Pairing) -> None:
        """Before send: drop the pairing, take back the assignment count."""
        self._check_active(pairing)
        self._ev_take_back(pairing.seed, pairing.worker, pairing.dispatch_id)

    def discard(self, pairing: Pairing) -> None:
        """After a stale or lost result: drop the pairing, keep the count."""
        self._check_active(pairing)
        self._ev_unpair(pairing.seed, pairing.worker, pairing.dispatch_id)

    def release(self, pairing: Pairing) -> None:
        """On commit: drop the pairing, keep the count."""
        self._check_active(pairing)
        self._ev_unpair(pairing.seed, pairing.worker, pairing.dispatch_id)

    def _check_active(self, pairing: Pairing) -> None:
        record = self._seeds.get(pairing.seed)
        if record is None or record.active != (pairing.worker, pairing.dispatch_id):
            raise NotReserved(
                f"{self._name}: seed {pairing.seed!r} has no active pairing with "
                f"worker {pairing.worker} by dispatch {pairing.dispatch_id}"
            )

    # -- looking --------------------------------------------------------------

    def paired_worker(self, seed: str) -> int | None:
        """The worker `seed` is actively paired with, if any."""
        record = self._seeds.get(seed)
        return None if record is None or record.active is None else record.active[0]

    def assignments(self, seed: str, worker: int | None = None) -> int:
        """How many times `seed` really went out (to `worker`, if given)."""
        record = self._seeds.get(seed)
        if record is None:
            return 0
        return record.assignments if worker is None else record.by_worker.get(worker, 0)

    def leaks(self) -> list[Leak]:
        """Every active pairing."""
        return [
            self._leak("pairing", f"{seed}->worker {record.active[0]}", record.active[1])
            for seed, record in self._seeds.items()
            if record.active is not None
        ]

    # -- journaled events -----------------------------------------------------

    def _ev_pair(self, seed: str, worker: int, dispatch_id: int) -> None:
        record = self._seeds.get(seed)
        if record is None:
            record = self._seeds[seed] = _Seed()
        record.active = (worker, dispatch_id)
        record.assignments += 1
        record.by_worker[worker] = record.by_worker.get(worker, 0) + 1

    def _ev_take_back(self, seed: str, worker: int, dispatch_id: int) -> None:
        record = self._seeds[seed]
        record.active = None
        record.assignments -= 1
        remaining = record.by_worker[worker] - 1
        if remaining:
            record.by_worker[worker] = remaining
        else:
            del record.by_worker[worker]  # so a snapshot shows no zero counts

    def _ev_unpair(self, seed: str, worker: int, dispatch_id: int) -> None:
        self._seeds[seed].active = None

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """Every seed seen, with its counts and active pairing."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "seeds": [
                {
                    "seed": seed,
                    "assignments": record.assignments,
                    # JSON object keys are strings: worker ranks as decimal.
                    "by_worker": {str(worker): n for worker, n in record.by_worker.items()},
                    "active": None if record.active is None else list(record.active),
                }
                for seed, record in self._seeds.items()
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace every seed's counts and pairing by a `snapshot()`."""
        expect_kind(state, _KIND, _VERSION)
        seeds: dict[str, _Seed] = {}
        for item in get_list(state, "seeds"):
            entry = as_object(item, "a seed")
            seed = get_str(entry, "seed")
            if seed in seeds:
                raise SnapshotError(f"seed {seed!r} appears twice")
            by_worker: dict[int, int] = {}
            for worker, count in get_dict(entry, "by_worker").items():
                if not worker.isdecimal() or type(count) is not int or count < 1:
                    raise SnapshotError(f"seed {seed!r}: bad count {worker!r}: {count!r}")
                by_worker[int(worker)] = count
            active_json = entry.get("active")
            active: tuple[int, int] | None = None
            if active_json is not None:
                if (
                    not isinstance(active_json, list)
                    or len(active_json) != 2
                    or any(type(value) is not int for value in active_json)
                ):
                    raise SnapshotError(f"seed {seed!r}: bad active pairing {active_json!r}")
                active = (active_json[0], active_json[1])
            seeds[seed] = _Seed(get_int(entry, "assignments"), by_worker, active)
        self._seeds = seeds
