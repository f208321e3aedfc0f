"""The proposal board (`dispatchtx.resources.proposals`): verified proposals,
through real `DispatchTables` moves, against whichever build of the core is
loaded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx import CompensationError, DispatchTables, Phase, Transaction
from dispatchtx.resources import RESULT_LOST, ProposalBoard, ProposalState, ProposalTicket

from support import send

# -- verified proposals: take back the attempt / retry with "result lost" -------


def test_proposal_undo_takes_back_the_attempt_and_keeps_its_turn() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables, max_attempts=2)
    board.propose("p1", {"input": "AAAA"})
    board.propose("p2")
    txn = tables.prepare(0)
    assert board.reserve(txn) == ProposalTicket("p1", 1, txn.id)
    assert board.state("p1") is ProposalState.DISPATCHED
    assert tables.abort(txn.id) == ()
    assert (board.state("p1"), board.attempts("p1"), board.reason("p1")) == (
        ProposalState.PENDING,
        0,
        None,
    )
    assert board.pending() == ["p1", "p2"]


def test_proposal_discard_keeps_the_attempt_and_retries_then_rejects() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables, max_attempts=2)
    board.propose("p1")
    board.propose("p2")
    for attempt, expected in ((1, ProposalState.PENDING), (2, ProposalState.REJECTED)):
        txn = tables.prepare(0)
        board.reserve(txn, "p1")
        send(tables, txn)
        assert tables.fenced_out(txn.id) == ()
        assert board.attempts("p1") == attempt
        assert (board.state("p1"), board.reason("p1")) == (expected, RESULT_LOST)
    assert board.pending() == ["p2"]
    assert board.leaks() == []


def test_proposal_verdict_via_triage_then_release() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables)
    board.propose("p1")
    txn = tables.prepare(0)
    board.reserve(txn)
    send(tables, txn)
    with tables.committing(txn.id):
        assert board.verdict("p1", accepted=True, reason="verified") is True
        assert [leak.kind for leak in board.leaks()] == ["accepted proposal"]
    assert (board.state("p1"), board.attempts("p1")) == (ProposalState.ACCEPTED, 1)
    assert board.leaks() == []
    assert board.verdict("p1", accepted=True, reason="verified") is False  # a rerun
    with pytest.raises(Exception, match="refusing verdict"):
        board.verdict("p1", accepted=False)


def test_proposal_committed_without_a_verdict_is_queued_again_and_reported() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables)
    board.propose("p1")
    txn = tables.prepare(0)
    board.reserve(txn)
    send(tables, txn)
    with pytest.raises(CompensationError) as raised, tables.committing(txn.id):
        pass  # a triage that forgot the verdict
    assert [f.resource for f in raised.value.failures] == ["proposals"]
    assert tables.phase_of(txn.id) is None  # COMMITTED all the same
    assert (board.state("p1"), board.attempts("p1")) == (ProposalState.PENDING, 1)


PROPOSAL_OPS = ("dispatch", "send", "abort", "fenced_out", "finish", "lose", "park")


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(PROPOSAL_OPS), st.integers(0, 2)), max_size=60),
    max_attempts=st.integers(1, 4),
)
def test_proposal_attempts_counted_equal_dispatches_sent(
    ops: list[tuple[str, int]], max_attempts: int
) -> None:
    tables = DispatchTables(3)
    board = ProposalBoard(tables, max_attempts=max_attempts)
    for i in range(5):
        board.propose(f"p{i}")
    carried: dict[int, str] = {}  # dispatch id -> proposal id
    sent: dict[str, int] = {f"p{i}": 0 for i in range(5)}

    def latest(worker: int, phase: Phase) -> Transaction | None:
        found = [txn for txn in tables.in_flight(worker) if txn.phase is phase]
        return found[-1] if found else None

    def triage(txn: Transaction) -> None:
        with tables.committing(txn.id):
            board.verdict(carried[txn.id], accepted=txn.id % 2 == 0)

    for op, worker in ops:
        preparing = latest(worker, Phase.PREPARING)
        active = latest(worker, Phase.ACTIVE)
        if op == "dispatch" and preparing is None and active is None and board.pending():
            txn = tables.prepare(worker)
            carried[txn.id] = board.reserve(txn).proposal_id
        elif op == "send" and preparing is not None:
            send(tables, preparing)
            sent[carried[preparing.id]] += 1
        elif op == "abort" and preparing is not None:
            assert tables.abort(preparing.id) == ()
        elif op == "fenced_out" and active is not None:
            assert tables.fenced_out(active.id) == ()
        elif op == "finish" and active is not None:
            triage(active)
        elif op == "park" and active is not None:
            tables.fence_passed(active.id)  # stays COMMITTING across later moves
        elif op == "lose":
            assert tables.lose_worker(worker) == ()
        # An attempt is counted at reservation: until its dispatch is sent or
        # undone, a PREPARING one is counted too.
        unsent = [carried[t.id] for t in tables.in_flight() if t.phase is Phase.PREPARING]
        assert {p: board.attempts(p) - unsent.count(p) for p in sent} == sent
    assert tables.shutdown() == ()
    for txn in list(tables.in_flight()):
        triage(txn)  # the parked ones: finished by the caller
    assert {p: board.attempts(p) for p in sent} == sent
    assert board.leaks() == []
    for p, count in sent.items():
        state = board.state(p)
        assert state is not ProposalState.DISPATCHED
        if state is ProposalState.PENDING:
            assert count < max_attempts
        if state is ProposalState.REJECTED and board.reason(p) == RESULT_LOST:
            assert count == max_attempts
