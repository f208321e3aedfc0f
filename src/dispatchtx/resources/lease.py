"""The shared exact-work lease (docs/design.md: undo and discard both abandon
with the current token; a token that was taken over fails safely).

A dispatch claims its work item in the shared store; the claim's slot number
is the fencing token the result must carry back to `begin_commit`. If the
dispatch is never sent, or its result cannot be trusted, the claim is
abandoned so that any coordinator may claim the item again at once instead
of waiting out its TTL. Once the result passed the fence, the lease is the
store's commit record: nothing is released here, the coordinator completes
the item inside its triage boundary (so a failed `complete` is retried,
never lost).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    Leak,
    NotReserved,
    ResourceError,
    Unavailable,
    require_preparing,
)
from dispatchtx.store import AbandonOutcome, ClaimOutcome, ClaimResult, WorkStore

if TYPE_CHECKING:
    from dispatchtx import DispatchTables, Transaction

__all__ = ["ClaimRefused", "LeaseLost", "WorkLease", "WorkLeases"]


class ClaimRefused(Unavailable):
    """The store would not let the item be claimed now; `result` is its
    answer (None: this coordinator already leases the item itself)."""

    def __init__(self, message: str, result: ClaimResult | None) -> None:
        super().__init__(message)
        self.result = result


class LeaseLost(ResourceError):
    """Abandoning a claim that is no longer ours: no effect, reported.

    Raised inside a compensation, it becomes a `CompensationFailure` that
    names the item and what the store found instead.
    """


class WorkLease(NamedTuple):
    """One dispatch's claim on one exact-work item (the compensation's arg)."""

    work_id: str
    token: int
    dispatch_id: int


class WorkLeases(AdapterBase[WorkLease]):
    """Claims exact work for dispatches, and abandons what was never used."""

    __slots__ = ("_held", "_store", "abandoned", "taken_over")

    def __init__(self, tables: DispatchTables[Any], store: WorkStore, *, name: str = "work-lease"):
        super().__init__(tables, name, self._abandon_unsent, self._abandon, self._forget)
        self._store = store
        self._held: dict[str, WorkLease] = {}
        self.abandoned = 0
        self.taken_over = 0

    def reserve(self, txn: Transaction[Any], work_id: str, now: float | None = None) -> WorkLease:
        """Claim `work_id` for this dispatch; `ClaimRefused` (an `Unavailable`)
        if it cannot be claimed now (held by another, committing, done or
        quarantined), carrying the store's answer."""
        require_preparing(txn, "claim work")
        if work_id in self._held:
            raise ClaimRefused(f"work item {work_id!r} is already leased by this coordinator", None)
        result = self._store.try_claim(work_id, now)
        # ALREADY_HELD: an earlier claim of ours whose outcome we never learned
        # (its reply was lost, or the call failed after the link): adopt it.
        usable = (ClaimOutcome.CLAIMED, ClaimOutcome.ALREADY_HELD)
        if result.outcome not in usable or result.token is None:
            raise ClaimRefused(
                f"work item {work_id!r} cannot be claimed: {result.outcome.value}", result
            )
        lease = WorkLease(work_id, result.token, txn.id)
        self._held[work_id] = lease
        self._register(txn, lease, self._abandon)
        return lease

    def held(self, work_id: str) -> WorkLease | None:
        return self._held.get(work_id)

    def heartbeat_all(self) -> list[WorkLease]:
        """Heartbeat every held lease; return the ones the store says are lost."""
        lost = [
            lease
            for lease in list(self._held.values())
            if not self._store.heartbeat(lease.work_id, lease.token)
        ]
        return lost

    def _forget(self, lease: WorkLease) -> None:
        # Committed: the store's commit record now stands for the lease.
        if self._held.get(lease.work_id) != lease:
            raise NotReserved(f"{self._name}: no lease {lease} to release")
        del self._held[lease.work_id]

    def _abandon_unsent(self, lease: WorkLease) -> None:
        # Never sent: no result was lost, so the item's poison count stays.
        self._abandon(lease, sent=False)

    def _abandon(self, lease: WorkLease, sent: bool = True) -> None:
        self._forget(lease)
        outcome = self._store.abandon(lease.work_id, lease.token, sent=sent)
        if outcome is AbandonOutcome.ABANDONED:
            self.abandoned += 1
            return
        self.taken_over += 1
        raise LeaseLost(
            f"{self._name}: abandoning {lease.work_id!r} with token {lease.token} "
            f"had no effect: {outcome.value}"
        )

    def leaks(self) -> list[Leak]:
        return [
            self._leak("lease", f"{lease.work_id}@{lease.token}", lease.dispatch_id)
            for lease in self._held.values()
        ]
