"""What a coordinator dispatches: the `Workload` protocol a user's workload
implements, and the `DispatchTag` each of the coordinator's dispatches
carries (the item and the fencing token of its claim).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from dispatchtx import DispatchTables, Transaction
from dispatchtx.resources import Leak
from dispatchtx.resources.dispatch_log import DispatchLog

__all__ = ["UNCLAIMED", "DispatchTag", "Workload"]

UNCLAIMED = 0  # a DispatchTag's token before the claim (fencing tokens start at 1)


class DispatchTag(NamedTuple):
    """What each of the coordinator's dispatches is tagged with (`txn.tag`):
    the work item and the fencing token of its claim (`UNCLAIMED` until the
    claim is made). A result must carry both back; triage is keyed by them."""

    work_id: str
    token: int


class Workload(Protocol):
    """What a coordinator dispatches and how results are triaged.

    The queue (`take`, `give_back`, `done`, `drop`, `remaining`), the
    reservations and message of one dispatch (`reserve`, `object_content`)
    and the triage of a committed result are required. `attach`, `adopt`,
    `leaks`, `problems` and `figures` have defaults here (nothing to set
    up, adopt nothing, hold nothing): a workload that subclasses `Workload`
    inherits them and overrides what it needs.
    """

    def attach(self, tables: DispatchTables[DispatchTag], dispatch_log: DispatchLog | None) -> None:
        """Called by each new `Coordinator` incarnation during its
        construction (before its heartbeat thread starts), with its tables
        (declare the workload's own compensations and build its adapters on
        them here) and its dispatch log (None without a journal). An
        incarnation's dispatches die with it: what an earlier one had taken
        may be offered again."""
        return None

    def take(self) -> str | None:
        """The next work id to start, or None when nothing is startable now."""
        ...

    def give_back(self, work_id: str) -> None:
        """A taken item was not done: offer it again later."""
        ...

    def done(self, work_id: str) -> None:
        """The item is done in the store (by this coordinator or another);
        idempotent, and it takes the item out of the queue if it is there."""
        ...

    def drop(self, work_id: str, reason: str) -> None:
        """The item will never be done (quarantined); idempotent, like done."""
        ...

    def remaining(self) -> int:
        """Items not yet done or dropped."""
        ...

    def reserve(
        self, txn: Transaction[DispatchTag], worker: int, work_id: str
    ) -> tuple[object, list[str]]:
        """Reserve the local resources of one dispatch through their adapters
        (each registering its compensation); return the message payload and
        the ids of the objects the worker needs."""
        ...

    def object_content(self, object_id: str) -> bytes: ...

    def triage(self, work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        """Apply a committed result. Idempotent per (item, token): shared
        effects may be applied by anyone; local effects (reward, feedback,
        verdict) only when `owner`, once. May raise: it is retried."""
        ...

    def adopt(self, work_id: str) -> bool:
        """An item the store holds unsettled that this workload may never
        have taken (only a peer killed for good knew it): True if this
        workload will finish it (queued now, or known already), False if it
        is not this workload's to finish."""
        return False

    def leaks(self) -> list[Leak]:
        """What the workload's own adapters still hold; empty once every
        dispatch ended (after `Coordinator.shutdown`)."""
        return []

    def problems(self) -> list[str]:
        """What the workload finds wrong once every dispatch ended (its own
        invariants, e.g. an effect applied twice); checked by the audit."""
        return []

    def figures(self) -> dict[str, int]:
        """Counts of the workload's own that a run reports beside the
        coordinator's statistics."""
        return {}
