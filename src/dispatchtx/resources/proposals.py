"""Verified proposals (docs/design.md).

A proposal waits PENDING, goes DISPATCHED to a worker for verification (one
attempt counted per dispatch that really went out), and ends with a verdict,
ACCEPTED or REJECTED, given by triage:

- undo before send: take the attempt back and return the proposal to the
  front of the pending queue (D3: an unsent task is never an attempt);
- discard after a stale or lost result: keep the attempt and queue the
  proposal again to retry, with reason "result lost"; once it has used
  `max_attempts`, reject it instead, with the same reason;
- success: triage calls `verdict(proposal_id, accepted, reason)`, then the
  release on commit detaches the dispatch. A dispatch committed without a
  verdict is queued again (its attempt kept) and reported as a failure.

So the attempts counted always equal the dispatches that really went out.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    JournaledAdapter,
    JsonDict,
    Leak,
    NotReserved,
    ResourceError,
    SnapshotError,
    Unavailable,
    as_object,
    expect_kind,
    get_int,
    get_list,
    get_optional_int,
    get_optional_str,
    get_str,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatchtx import DispatchTables, Transaction

__all__ = [
    "RESULT_LOST",
    "MissingVerdict",
    "ProposalBoard",
    "ProposalState",
    "ProposalTicket",
]

RESULT_LOST: Final = "result lost"
_NO_VERDICT: Final = "committed without a verdict"

_KIND = "proposals"
_VERSION = 1


class ProposalState(Enum):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class ProposalTicket(NamedTuple):
    """One dispatch of one proposal (the compensation's argument)."""

    proposal_id: str
    attempt: int
    dispatch_id: int


class MissingVerdict(ResourceError):
    """A dispatch was committed but triage gave its proposal no verdict."""


@dataclass(slots=True)
class _Proposal:
    payload: Any
    state: ProposalState = ProposalState.PENDING
    attempts: int = 0
    reason: str | None = None
    dispatch_id: int | None = None  # the dispatch holding it, until it ends


class ProposalBoard(AdapterBase[ProposalTicket], JournaledAdapter):
    """Proposals to verify, with attempts that count real dispatches only."""

    __slots__ = ("_max_attempts", "_proposals", "_queue")

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = (
        "propose",
        "dispatch",
        "take_back",
        "lose",
        "verdict",
        "settle",
    )

    def __init__(
        self, tables: DispatchTables[Any], *, max_attempts: int = 3, name: str = "proposals"
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        super().__init__(tables, name, self.undo, self.discard, self.settle)
        self._max_attempts = max_attempts
        self._proposals: dict[str, _Proposal] = {}
        self._queue: OrderedDict[str, None] = OrderedDict()  # PENDING ids, oldest first

    @property
    def max_attempts(self) -> int:
        return self._max_attempts

    # -- configuration ------------------------------------------------------

    def propose(self, proposal_id: str, payload: Any = None) -> None:
        """Queue a new proposal; `payload` (what to verify) must be JSON."""
        if not isinstance(proposal_id, str) or not proposal_id:
            raise ValueError(f"a proposal id must be a non-empty str, got {proposal_id!r}")
        if proposal_id in self._proposals:
            raise ValueError(f"proposal {proposal_id!r} already exists")
        # A JSON round trip both checks the payload and takes a deep copy.
        self._ev_propose(proposal_id, json.loads(json.dumps(payload, allow_nan=False)))

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any], proposal_id: str | None = None) -> ProposalTicket:
        """Dispatch `proposal_id` (by default the oldest pending one) with
        `txn`, counting one attempt; `Unavailable` if it is not pending."""
        self._require_preparing(txn)
        if proposal_id is None:
            if not self._queue:
                raise Unavailable(f"{self._name}: no pending proposal")
            proposal_id = next(iter(self._queue))
        record = self._proposals.get(proposal_id)
        if record is None or record.state is not ProposalState.PENDING:
            state = "unknown" if record is None else record.state.value
            raise Unavailable(f"{self._name}: proposal {proposal_id!r} is {state}, not pending")
        self._ev_dispatch(proposal_id, txn.id)
        ticket = ProposalTicket(proposal_id, record.attempts, txn.id)
        self._register(txn, ticket, self.undo)
        return ticket

    def undo(self, ticket: ProposalTicket) -> None:
        """Before send: take the attempt back, first in the pending queue."""
        self._check_dispatched(ticket)
        self._ev_take_back(ticket.proposal_id, ticket.dispatch_id)

    def discard(self, ticket: ProposalTicket) -> None:
        """After a stale or lost result: keep the attempt; retry, or reject
        past `max_attempts`; reason "result lost"."""
        self._check_dispatched(ticket)
        self._ev_lose(ticket.proposal_id, ticket.dispatch_id, RESULT_LOST)

    def verdict(self, proposal_id: str, accepted: bool, reason: str = "") -> bool:
        """Triage's verdict on a dispatched proposal.

        Returns False, changing nothing, if the same verdict was given
        already (a rerun of triage); a different verdict raises
        `ResourceError`, a proposal never dispatched `NotReserved`.
        """
        record = self._proposals.get(proposal_id)
        if record is None:
            raise NotReserved(f"{self._name}: no proposal {proposal_id!r}")
        wanted = ProposalState.ACCEPTED if accepted else ProposalState.REJECTED
        if record.state is ProposalState.DISPATCHED:
            self._ev_verdict(proposal_id, accepted, reason)
            return True
        if record.state is wanted and record.reason == reason:
            return False
        raise ResourceError(
            f"{self._name}: proposal {proposal_id!r} is {record.state.value} "
            f"(reason {record.reason!r}); refusing verdict {wanted.value} ({reason!r})"
        )

    def settle(self, ticket: ProposalTicket) -> None:
        """Release on commit: detach the dispatch from its decided proposal.
        Without a verdict the proposal is queued again (the attempt kept)
        and `MissingVerdict` reports the triage bug."""
        record = self._proposals.get(ticket.proposal_id)
        if record is None or record.dispatch_id != ticket.dispatch_id:
            raise NotReserved(
                f"{self._name}: dispatch {ticket.dispatch_id} holds no proposal "
                f"{ticket.proposal_id!r}"
            )
        if record.state is ProposalState.DISPATCHED:
            self._ev_lose(ticket.proposal_id, ticket.dispatch_id, _NO_VERDICT)
            raise MissingVerdict(
                f"{self._name}: dispatch {ticket.dispatch_id} of proposal "
                f"{ticket.proposal_id!r} was committed without a verdict; queued again"
            )
        self._ev_settle(ticket.proposal_id, ticket.dispatch_id)

    def _check_dispatched(self, ticket: ProposalTicket) -> None:
        record = self._proposals.get(ticket.proposal_id)
        if (
            record is None
            or record.state is not ProposalState.DISPATCHED
            or record.dispatch_id != ticket.dispatch_id
        ):
            raise NotReserved(
                f"{self._name}: proposal {ticket.proposal_id!r} is not dispatched "
                f"by dispatch {ticket.dispatch_id}"
            )

    # -- looking --------------------------------------------------------------

    def state(self, proposal_id: str) -> ProposalState:
        return self._proposals[proposal_id].state

    def attempts(self, proposal_id: str) -> int:
        """Dispatches of the proposal that really went out (or hold it now)."""
        return self._proposals[proposal_id].attempts

    def reason(self, proposal_id: str) -> str | None:
        """Why it was last queued again or decided ("result lost", the
        verdict's reason), or None."""
        return self._proposals[proposal_id].reason

    def payload(self, proposal_id: str) -> Any:
        return self._proposals[proposal_id].payload

    def pending(self) -> list[str]:
        """The pending proposals, in the order `reserve` takes them."""
        return list(self._queue)

    def leaks(self) -> list[Leak]:
        """Every proposal still held by a dispatch (dispatched, or decided
        but not yet released)."""
        return [
            self._leak(f"{record.state.value} proposal", proposal_id, record.dispatch_id)
            for proposal_id, record in self._proposals.items()
            if record.dispatch_id is not None
        ]

    # -- journaled events -----------------------------------------------------

    def _ev_propose(self, proposal_id: str, payload: Any) -> None:
        self._proposals[proposal_id] = _Proposal(payload)
        self._queue[proposal_id] = None

    def _ev_dispatch(self, proposal_id: str, dispatch_id: int) -> None:
        record = self._proposals[proposal_id]
        del self._queue[proposal_id]
        record.state = ProposalState.DISPATCHED
        record.attempts += 1
        record.dispatch_id = dispatch_id

    def _ev_take_back(self, proposal_id: str, dispatch_id: int) -> None:
        record = self._proposals[proposal_id]
        record.state = ProposalState.PENDING
        record.attempts -= 1
        record.dispatch_id = None
        self._queue[proposal_id] = None
        self._queue.move_to_end(proposal_id, last=False)  # never sent: it keeps its turn

    def _ev_lose(self, proposal_id: str, dispatch_id: int, reason: str) -> None:
        record = self._proposals[proposal_id]
        record.dispatch_id = None
        record.reason = reason
        if record.attempts >= self._max_attempts:
            record.state = ProposalState.REJECTED
        else:
            record.state = ProposalState.PENDING
            self._queue[proposal_id] = None

    def _ev_verdict(self, proposal_id: str, accepted: bool, reason: str) -> None:
        record = self._proposals[proposal_id]
        record.state = ProposalState.ACCEPTED if accepted else ProposalState.REJECTED
        record.reason = reason

    def _ev_settle(self, proposal_id: str, dispatch_id: int) -> None:
        self._proposals[proposal_id].dispatch_id = None

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """Every proposal with its state, attempts, reason and dispatch, and
        the pending queue's order."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "max_attempts": self._max_attempts,
            "proposals": [
                {
                    "id": proposal_id,
                    "payload": record.payload,
                    "state": record.state.value,
                    "attempts": record.attempts,
                    "reason": record.reason,
                    "dispatch_id": record.dispatch_id,
                }
                for proposal_id, record in self._proposals.items()
            ],
            "queue": list(self._queue),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace every proposal and the queue by a `snapshot()`."""
        expect_kind(state, _KIND, _VERSION)
        proposals: dict[str, _Proposal] = {}
        for item in get_list(state, "proposals"):
            entry = as_object(item, "a proposal")
            proposal_id = get_str(entry, "id")
            if proposal_id in proposals:
                raise SnapshotError(f"proposal {proposal_id!r} appears twice")
            try:
                proposal_state = ProposalState(entry.get("state"))
            except ValueError:
                raise SnapshotError(f"proposal {proposal_id!r}: bad state") from None
            proposals[proposal_id] = _Proposal(
                entry.get("payload"),
                proposal_state,
                get_int(entry, "attempts"),
                get_optional_str(entry, "reason"),
                get_optional_int(entry, "dispatch_id"),
            )
        queue: OrderedDict[str, None] = OrderedDict()
        for proposal_id in get_list(state, "queue"):
            record = proposals.get(proposal_id) if isinstance(proposal_id, str) else None
            if record is None or record.state is not ProposalState.PENDING:
                raise SnapshotError(f"queued {proposal_id!r} is not a pending proposal")
            queue[proposal_id] = None
        if len(queue) != sum(r.state is ProposalState.PENDING for r in proposals.values()):
            raise SnapshotError("every pending proposal must be queued exactly once")
        self._max_attempts = get_int(state, "max_attempts", minimum=1)
        self._proposals = proposals
        self._queue = queue
