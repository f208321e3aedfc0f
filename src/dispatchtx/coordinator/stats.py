"""What a coordinator counts: one `Stat` per event, so a typo in a counter's
name is a type error rather than a silent new counter.

`Stat` is a `StrEnum`: `stats["committed"]` and `stats[Stat.COMMITTED]` read
the same counter, and the counts encode to JSON by their names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from dispatchtx.store import ClaimOutcome

__all__ = ["CoordinatorStats", "Stat"]


class Stat(StrEnum):
    # dispatching
    DISPATCHES = "dispatches"
    OBJECTS_SHIPPED = "objects shipped"
    DISPATCH_FAILURES = "dispatch failures"
    CLAIM_BATCHES = "group claims"  # batches of more than one claim
    CLAIMS_IN_BATCHES = "claims in group claims"
    CLAIM_BATCHES_FAILED = "group claims failed"
    # why the store would not let an item be claimed
    REFUSED_HELD_HERE = "claim refused: held here"
    REFUSED_BUSY = "claim refused: busy"
    REFUSED_LOST_RACE = "claim refused: lost race"
    REFUSED_COMMITTING = "claim refused: committing"
    REFUSED_DONE = "claim refused: done"
    REFUSED_QUARANTINED = "claim refused: quarantined"
    # results
    COMMITTED = "committed"
    FENCED_OUT = "fenced out"
    TASK_ERRORS = "task errors"
    MALFORMED_RESULTS = "malformed results dropped"
    MISMATCHED_RESULTS = "mismatched results dropped"
    STALE_RESULTS = "stale or duplicate results dropped"
    BEGIN_COMMIT_RETRIED = "begin_commit retried"
    FENCE_ATTEMPTS_FAILED = "fence attempts that stored nothing"
    COMMIT_BATCHES = "group commits"  # batches of more than one result
    RESULTS_IN_BATCHES = "results in group commits"
    COMMIT_BATCHES_RETRIED = "group commits retried"
    TRIAGE_FAILURES = "triage failures"
    TRIAGE_RETRIES = "triage retries"
    COMPENSATION_FAILURES = "compensation failures"
    # workers
    DEADLINES_MISSED = "deadlines missed"
    WORKERS_LOST = "workers lost"
    WORKERS_READMITTED = "workers readmitted"
    # leases and recovery
    HEARTBEAT_FAILURES = "heartbeat failures"
    BACKGROUND_HEARTBEATS = "background heartbeats"
    LEASES_FOUND_LOST = "leases found lost"
    UNREADABLE_ITEMS = "unreadable items"
    ITEMS_SET_ASIDE = "items set aside by roll-forward"
    ORPHAN_LOOKS_GIVEN_UP = "unreadable items not waited for"
    ROLL_FORWARD_DEFERRED = "roll-forward items skipped for a look"
    CORRUPT_ITEMS_DROPPED = "corrupt items dropped"
    ROLL_FORWARD_FAILURES = "roll-forward failures"
    ROLLED_FORWARD = "rolled forward"
    ROLLED_FORWARD_FOR_PEER = "rolled forward for a peer"
    STALE_ENTRIES_CLOSED = "stale journal entries closed"
    STALE_ENTRIES_LEFT = "stale journal entries left"


# What a refused claim counts, by the store's answer.
REFUSED_BY_OUTCOME: dict[ClaimOutcome, Stat] = {
    ClaimOutcome.BUSY: Stat.REFUSED_BUSY,
    ClaimOutcome.LOST_RACE: Stat.REFUSED_LOST_RACE,
    ClaimOutcome.COMMITTING: Stat.REFUSED_COMMITTING,
    ClaimOutcome.DONE: Stat.REFUSED_DONE,
    ClaimOutcome.QUARANTINED: Stat.REFUSED_QUARANTINED,
}


@dataclass
class CoordinatorStats:
    counts: Counter[Stat] = field(default_factory=Counter)

    def __getitem__(self, key: Stat | str) -> int:
        return self.counts[Stat(key)]
