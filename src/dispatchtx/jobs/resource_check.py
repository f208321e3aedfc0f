"""What the simulator re-derives of each resource's counts from the moves
the compensation ledger saw (docs/design.md, D3 and D4).

An adapter that counts dispatches (a task's leases, a stage's or an arm's
pulls, a seed's assignments, a proposal's attempts) must count exactly the
ones that really went out: the undo before send takes a count back, the
discard after send keeps it (the dispatch went out; only its result is not
trusted), the release on commit keeps it. A `TrueCounts` follows one
adapter's reservations and compensations through the ledger's observers
and keeps its own count per key; `problems` compares it with the adapter's.
It finds an undo that keeps its count, a discard that takes it back (a
discard that runs the undo, or rewinds the stage that ran), and a discard
that does not record its failure where the adapter keeps failures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from dispatchtx import Side
from dispatchtx.jobs.ledger import CompensationLedger
from dispatchtx.jobs.workloads.fuzz import FuzzAdapters

__all__ = ["TrueCounts", "fuzz_counts"]


@dataclass
class TrueCounts:
    """One adapter's count per key of the dispatches that went out."""

    name: str  # the adapter's (its compensation's) name
    key_of: Callable[[Any], Hashable]  # a reservation's key, read as it is added
    count_of: Callable[[Any], int]  # the adapter's own count for a key
    failures_of: Callable[[Any], int] | None = None  # its count of discards, if it keeps one
    counted: Counter[Hashable] = field(default_factory=Counter)
    discarded: Counter[Hashable] = field(default_factory=Counter)
    _keys: dict[Any, Hashable] = field(default_factory=dict)

    def __call__(self, event: str, reservation: Any) -> None:
        if event == "reserved":
            key = self._keys[reservation] = self.key_of(reservation)
            self.counted[key] += 1
        elif event == Side.BEFORE_SEND.value:
            self.counted[self._keys[reservation]] -= 1
        elif event == Side.AFTER_SEND.value:
            self.discarded[self._keys[reservation]] += 1

    def problems(self) -> list[str]:
        found = []
        for key, want in self.counted.items():
            got = self.count_of(key)
            if got != want:
                found.append(
                    f"{self.name}: {key!r} counts {got} dispatches, but {want} went out "
                    "(an undo takes its count back, a discard keeps it)"
                )
            if self.failures_of is not None and self.failures_of(key) != self.discarded[key]:
                found.append(
                    f"{self.name}: {key!r} counts {self.failures_of(key)} failures, but "
                    f"{self.discarded[key]} of its dispatches were discarded"
                )
        return found


def fuzz_counts(adapters: FuzzAdapters, ledger: CompensationLedger) -> list[TrueCounts]:
    """The counted adapters of one fuzzing incarnation, each followed
    through `ledger` from now on (its adapters are new with it)."""
    shards, params, algorithms = adapters.shards, adapters.params, adapters.algorithms
    pairing, proposals = adapters.pairing, adapters.proposals
    counts = [
        TrueCounts(
            shards.name,
            lambda lease: (lease.shard, lease.task),
            lambda key: shards.lease_count(*key),
            lambda key: shards.failure_count(*key),
        ),
        TrueCounts(params.name, params.pending_arm, params.pulls),
        TrueCounts(algorithms.name, algorithms.pending_stage, algorithms.pulls),
        TrueCounts(pairing.name, lambda p: p.seed, pairing.assignments),
        TrueCounts(proposals.name, lambda ticket: ticket.proposal_id, proposals.attempts),
    ]
    for count in counts:
        ledger.observers[count.name] = count
    return counts
