"""The dispatch core's invariants (docs/design.md), run against whichever
build is loaded; tox runs this file once per build."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dispatchtx
from dispatchtx import (
    Compensation,
    CompensationError,
    CompensationFailure,
    DispatchError,
    DispatchTables,
    IllegalMove,
    Phase,
    Side,
    Transaction,
    UnknownDispatch,
    WorkerBusy,
    WrongWorker,
    raise_failures,
)

from support import Recorder, add_three, table_state

# -- D1: one table, one worker slot -------------------------------------------


def test_d1_a_dispatch_is_in_exactly_one_table_until_it_ends() -> None:
    tables = DispatchTables(2)
    txn = tables.prepare(0)
    seen = [tables.phase_of(txn.id)]
    tables.sent(txn.id, 1.0)
    seen.append(tables.phase_of(txn.id))
    tables.fence_passed(txn.id)
    seen.append(tables.phase_of(txn.id))
    assert len(tables) == 1
    tables.finished(txn.id)
    assert seen == [Phase.PREPARING, Phase.ACTIVE, Phase.COMMITTING]
    assert tables.phase_of(txn.id) is None
    assert txn.phase is Phase.COMMITTED
    assert len(tables) == 0


def test_d1_default_is_one_dispatch_in_flight_per_worker() -> None:
    tables = DispatchTables(2)
    first = tables.prepare(0)
    with pytest.raises(WorkerBusy, match="worker 0"):
        tables.prepare(0)
    tables.sent(first.id, 1.0)
    with pytest.raises(WorkerBusy):
        tables.prepare(0)
    other = tables.prepare(1)  # another worker is free
    assert other.worker == 1
    assert tables.max_in_flight == 1


def test_d1_max_in_flight_allows_that_many_per_worker() -> None:
    tables = DispatchTables(1, max_in_flight=3)
    txns = [tables.prepare(0) for _ in range(3)]
    with pytest.raises(WorkerBusy) as caught:
        tables.prepare(0)
    assert caught.value.max_in_flight == 3
    tables.abort(txns[1].id)
    assert tables.prepare(0).worker == 0


def test_d1_a_committing_dispatch_frees_its_worker() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    tables.sent(txn.id, 1.0)
    tables.fence_passed(txn.id)
    nxt = tables.prepare(0)  # the result is in hand: the worker is free
    assert [t.id for t in tables.in_flight(0)] == [txn.id, nxt.id]


def test_dispatch_ids_are_monotonic_from_first_id() -> None:
    tables = DispatchTables(3, first_id=5 << 40)
    ids = []
    for worker in range(3):
        txn = tables.prepare(worker)
        ids.append(txn.id)
        tables.abort(txn.id)
    ids.append(tables.prepare(0).id)
    assert ids == [(5 << 40) + i for i in range(4)]
    assert tables.next_id == (5 << 40) + 4


def test_bad_configuration_and_workers_are_refused() -> None:
    with pytest.raises(ValueError):
        DispatchTables(-1)
    with pytest.raises(ValueError):
        DispatchTables(1, max_in_flight=0)
    with pytest.raises(ValueError):
        DispatchTables(1, first_id=-1)
    tables = DispatchTables(2)
    for worker in (-1, 2):
        with pytest.raises(ValueError, match="out of range"):
            tables.prepare(worker)
        with pytest.raises(ValueError):
            tables.lose_worker(worker)
        with pytest.raises(ValueError):
            tables.missing(worker, ["x"])


# -- D2/D3: reservations and the before-send undo -----------------------------


def test_d2_each_add_registers_a_compensation_in_order() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    txn = tables.get(dispatch_id)
    assert txn is not None and len(txn) == 3


def test_d3_abort_runs_before_send_undos_in_reverse_with_their_args() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    assert tables.abort(dispatch_id) == ()
    assert recorder.log == [("c", "before", 3), ("b", "before", 2), ("a", "before", 1)]
    assert tables.phase_of(dispatch_id) is None
    assert len(tables) == 0


def test_d3_a_failed_send_inside_dispatch_runs_the_before_send_undo() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    lease = recorder.compensation(tables, "lease")

    def failing_send() -> None:
        raise OSError("send failed")

    with pytest.raises(OSError, match="send failed"), tables.dispatch(0, tag="task") as txn:
        txn.add(lease, "token-7")
        failing_send()
        tables.sent(txn.id, 1.0)
    assert recorder.log == [("lease", "before", "token-7")]
    assert txn.phase is Phase.ROLLED_BACK
    assert txn.sent_at is None  # never sent: never counted as sent
    assert len(tables) == 0
    assert tables.prepare(0).worker == 0  # the worker is free at once


def test_d3_undo_is_chosen_by_phase_never_sent_means_before_send() -> None:
    tables = DispatchTables(2)
    recorder = Recorder()
    unsent = add_three(tables, recorder, worker=0)
    sent = add_three(tables, recorder, worker=1)
    tables.sent(sent, 1.0)
    tables.shutdown()
    assert sorted({(arg, side) for _, side, arg in recorder.log}) == [
        (1, "after"),
        (1, "before"),
        (2, "after"),
        (2, "before"),
        (3, "after"),
        (3, "before"),
    ]
    # newest first: the sent dispatch (the later id) is discarded first
    assert unsent < sent
    assert recorder.sides() == ["after"] * 3 + ["before"] * 3


# -- D4: discard after a stale result ------------------------------------------


def test_d4_fenced_out_runs_after_send_discards_in_reverse() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    txn = tables.sent(dispatch_id, 2.5)
    assert tables.fenced_out(dispatch_id) == ()
    assert recorder.log == [("c", "after", 3), ("b", "after", 2), ("a", "after", 1)]
    assert txn.phase is Phase.ROLLED_BACK
    assert txn.sent_at == 2.5  # the true send stays recorded
    assert len(txn) == 0


# -- D5: the fence ------------------------------------------------------------


def test_d5_only_an_active_dispatch_passes_the_fence() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    with pytest.raises(IllegalMove) as caught:
        tables.fence_passed(txn.id)
    assert caught.value.phase is Phase.PREPARING
    assert caught.value.move == "fence_passed"
    assert tables.phase_of(txn.id) is Phase.PREPARING
    tables.sent(txn.id, 1.0)
    assert tables.fence_passed(txn.id) is txn
    assert txn.phase is Phase.COMMITTING


def test_d5_a_failing_triage_keeps_the_dispatch_in_a_table() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    with pytest.raises(OSError, match="EIO"), tables.committing(dispatch_id) as txn:
        assert txn.phase is Phase.COMMITTING
        raise OSError("EIO during triage")
    assert tables.phase_of(dispatch_id) is Phase.COMMITTING
    assert recorder.log == []  # nothing discarded past the fence


# -- D6: releases after triage ---------------------------------------------------


def test_d6_stack_is_dropped_only_by_finished_which_releases_in_reverse_once() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    txn = tables.fence_passed(dispatch_id)
    assert len(txn) == 3
    assert recorder.log == []
    assert tables.finished(dispatch_id) == ()
    assert recorder.log == [("c", "commit", 3), ("b", "commit", 2), ("a", "commit", 1)]
    assert len(txn) == 0
    with pytest.raises(IllegalMove):
        tables.finished(dispatch_id)
    assert len(recorder.log) == 3


def test_d6_committing_boundary_finishes_on_clean_exit() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    with tables.committing(dispatch_id) as txn:
        assert recorder.log == []
    assert txn.phase is Phase.COMMITTED
    assert recorder.sides() == ["commit"] * 3


def test_triage_failure_inside_committing_then_retry_succeeds() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    attempts = []
    for attempt in range(3):
        try:
            with tables.committing(dispatch_id) as txn:
                attempts.append(txn.phase)
                if attempt < 2:
                    raise OSError("triage I/O failed")
        except OSError:
            assert tables.phase_of(dispatch_id) is Phase.COMMITTING
    assert attempts == [Phase.COMMITTING] * 3
    assert tables.phase_of(dispatch_id) is None
    assert recorder.sides() == ["commit"] * 3


def test_committing_boundary_refuses_a_dispatch_not_past_send() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    with pytest.raises(IllegalMove), tables.committing(txn.id):
        pass
    assert tables.phase_of(txn.id) is Phase.PREPARING
    with pytest.raises(IllegalMove), tables.committing(12345):
        pass


def test_committing_boundary_raises_release_failures_after_committing() -> None:
    tables = DispatchTables(1)
    recorder = Recorder(failing={("b", "commit")})
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    with pytest.raises(CompensationError) as caught, tables.committing(dispatch_id) as txn:
        pass
    assert txn.phase is Phase.COMMITTED
    assert [f.resource for f in caught.value.failures] == ["b"]
    assert recorder.sides() == ["commit"] * 3


# -- D7: object cache -----------------------------------------------------------


def test_d7_object_cache_only_after_send() -> None:
    tables = DispatchTables(2)
    txn = tables.prepare(0)
    assert tables.missing(0, ["x", "y"]) == ["x", "y"]
    txn.ship(["x"])
    txn.ship(iter(["y"]))
    assert tables.missing(0, ["x", "y", "z"]) == ["x", "y", "z"]
    tables.sent(txn.id, 1.0)
    assert tables.missing(0, ["x", "y", "z"]) == ["z"]
    assert tables.missing(1, ["x"]) == ["x"]  # per worker


def test_d7_a_failed_first_transfer_must_carry_the_content_again() -> None:
    tables = DispatchTables(1)
    with pytest.raises(ConnectionError), tables.dispatch(0) as txn:
        txn.ship(tables.missing(0, ["seed-1"]))
        raise ConnectionError("first transfer failed")
    assert tables.missing(0, ["seed-1"]) == ["seed-1"]


def test_d7_losing_a_worker_forgets_its_cache() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    txn.ship(["x"])
    tables.sent(txn.id, 1.0)
    tables.fenced_out(txn.id)
    assert tables.missing(0, ["x"]) == []  # sent: the worker got the content
    tables.lose_worker(0)
    assert tables.missing(0, ["x"]) == ["x"]


def test_ship_refuses_non_string_ids_and_late_calls() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    with pytest.raises(TypeError):
        txn.ship([b"bytes"])  # type: ignore[list-item]
    tables.sent(txn.id, 1.0)
    with pytest.raises(IllegalMove):
        txn.ship(["late"])


# -- D8: the boundary and lost workers ------------------------------------------


def test_d8_an_exception_while_building_compensates_at_once() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with pytest.raises(ValueError, match="bad message"), tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "journal"), "rec-1")
        raise ValueError("bad message")
    assert recorder.log == [("journal", "before", "rec-1")]


def test_d8_an_exception_after_send_discards_at_once() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with pytest.raises(RuntimeError), tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "lease"), "tok")
        tables.sent(txn.id, 1.0)
        raise RuntimeError("bookkeeping after send failed")
    assert recorder.log == [("lease", "after", "tok")]


def test_d8_keyboard_interrupt_in_the_block_still_compensates() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with pytest.raises(KeyboardInterrupt), tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "lease"), "tok")
        raise KeyboardInterrupt
    assert recorder.log == [("lease", "before", "tok")]
    assert len(tables) == 0


def test_d8_compensation_failures_are_attached_to_the_propagating_error() -> None:
    tables = DispatchTables(1)
    recorder = Recorder(failing={("a", "before")})
    with pytest.raises(ValueError) as caught, tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "a"), 1)
        raise ValueError("build failed")
    notes = getattr(caught.value, "__notes__", [])
    assert len(notes) == 1 and "a.before_send" in notes[0]


def test_leaving_dispatch_unsent_runs_the_undo_and_raises() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with pytest.raises(IllegalMove, match="neither sent nor aborted"), tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "lease"), "tok")
    assert recorder.log == [("lease", "before", "tok")]
    assert txn.phase is Phase.ROLLED_BACK


def test_dispatch_block_may_abort_itself() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "lease"), "tok")
        tables.abort(txn.id)
    assert recorder.log == [("lease", "before", "tok")]


def test_d8_losing_a_worker_compensates_its_preparing_and_active_dispatches() -> None:
    tables = DispatchTables(2, max_in_flight=3)
    recorder = Recorder()
    preparing = add_three(tables, recorder, worker=0)
    active = add_three(tables, recorder, worker=0)
    tables.sent(active, 1.0)
    committing = add_three(tables, recorder, worker=0)
    tables.sent(committing, 2.0)
    tables.fence_passed(committing)
    bystander = add_three(tables, recorder, worker=1)
    assert tables.lose_worker(0) == ()
    # newest first; before-send for the unsent one, after-send for the sent one
    assert recorder.log == [
        ("c", "after", 3),
        ("b", "after", 2),
        ("a", "after", 1),
        ("c", "before", 3),
        ("b", "before", 2),
        ("a", "before", 1),
    ]
    assert tables.phase_of(preparing) is None
    assert tables.phase_of(active) is None
    assert tables.phase_of(committing) is Phase.COMMITTING
    assert tables.phase_of(bystander) is Phase.PREPARING
    assert tables.prepare(0).worker == 0


def test_shutdown_leaves_committing_dispatches_untouched() -> None:
    tables = DispatchTables(3)
    recorder = Recorder()
    add_three(tables, recorder, worker=0)
    active = add_three(tables, recorder, worker=1)
    tables.sent(active, 1.0)
    committing = add_three(tables, recorder, worker=2)
    tables.sent(committing, 1.0)
    tables.fence_passed(committing)
    tables.shutdown()
    assert len(recorder.log) == 6
    assert [t.id for t in tables.in_flight()] == [committing]
    assert tables.finished(committing) == ()
    assert recorder.sides()[-3:] == ["commit"] * 3


# -- fault isolation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("moves", "side", "expected_side"),
    [
        (("abort",), "before", Side.BEFORE_SEND),
        (("sent", "fenced_out"), "after", Side.AFTER_SEND),
        (("sent", "fence_passed", "finished"), "commit", Side.ON_COMMIT),
    ],
)
def test_a_raising_compensation_is_recorded_and_the_others_still_run(
    moves: tuple[str, ...], side: str, expected_side: Side
) -> None:
    tables = DispatchTables(2)
    recorder = Recorder(failing={("b", side)})
    dispatch_id = add_three(tables, recorder, worker=1)
    failures: tuple[CompensationFailure, ...] = ()
    for move in moves:
        if move == "sent":
            tables.sent(dispatch_id, 1.0)
        elif move == "fence_passed":
            tables.fence_passed(dispatch_id)
        else:
            failures = getattr(tables, move)(dispatch_id)
    assert [resource for resource, _, _ in recorder.log] == ["c", "b", "a"]
    (failure,) = failures
    assert failure.dispatch_id == dispatch_id
    assert failure.worker == 1
    assert failure.resource == "b"
    assert failure.side is expected_side
    assert isinstance(failure.error, RuntimeError)
    assert "b." in str(failure)


def test_a_keyboard_interrupt_in_a_compensation_lets_the_rest_run_then_propagates() -> None:
    tables = DispatchTables(1)
    recorder = Recorder(interrupting={("b", "before")}, failing={("a", "before")})
    dispatch_id = add_three(tables, recorder)
    with pytest.raises(KeyboardInterrupt) as caught:
        tables.abort(dispatch_id)
    assert [resource for resource, _, _ in recorder.log] == ["c", "b", "a"]
    assert any("a.before_send" in note for note in caught.value.__notes__)
    assert len(tables) == 0


def test_a_keyboard_interrupt_during_a_sweep_still_compensates_every_dispatch() -> None:
    tables = DispatchTables(3)
    recorder = Recorder(interrupting={("b", "before")})
    for worker in range(3):
        add_three(tables, recorder, worker=worker)
    with pytest.raises(KeyboardInterrupt):
        tables.shutdown()
    assert len(recorder.log) == 9
    assert len(tables) == 0


def test_a_system_exit_in_a_release_lets_the_rest_run() -> None:
    tables = DispatchTables(1)
    recorder = Recorder(exiting={("c", "commit")})
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    tables.fence_passed(dispatch_id)
    with pytest.raises(SystemExit):
        tables.finished(dispatch_id)
    assert recorder.sides() == ["commit"] * 3
    assert len(tables) == 0


# -- illegal moves ------------------------------------------------------------------


def _in_phase(tables: DispatchTables, phase: str, recorder: Recorder) -> int:
    txn = tables.prepare(0)
    txn.add(recorder.compensation(tables, "probe"), txn.id)
    if phase == "PREPARING":
        return txn.id
    tables.sent(txn.id, 1.0)
    if phase == "ACTIVE":
        return txn.id
    tables.fence_passed(txn.id)
    if phase == "COMMITTING":
        return txn.id
    if phase == "COMMITTED":
        tables.finished(txn.id)
    return txn.id


LEGAL = {
    "sent": {"PREPARING"},
    "abort": {"PREPARING"},
    "fence_passed": {"ACTIVE"},
    "fenced_out": {"ACTIVE"},
    "finished": {"COMMITTING"},
}


ILLEGAL = [
    (move, phase)
    for move in sorted(LEGAL)
    for phase in ("PREPARING", "ACTIVE", "COMMITTING", "COMMITTED", "UNKNOWN")
    if phase not in LEGAL[move]
]


@pytest.mark.parametrize(("move", "phase"), ILLEGAL)
def test_every_move_from_a_wrong_phase_is_refused_with_nothing_moved(move: str, phase: str) -> None:
    tables = DispatchTables(1, max_in_flight=2)
    recorder = Recorder()
    dispatch_id = 999 if phase == "UNKNOWN" else _in_phase(tables, phase, recorder)
    recorder.clear()  # finishing a COMMITTED probe released it; nothing may run now
    before = table_state(tables)
    args: tuple[object, ...] = (dispatch_id, 2.0) if move == "sent" else (dispatch_id,)
    with pytest.raises(IllegalMove) as caught:
        getattr(tables, move)(*args)
    assert caught.value.dispatch_id == dispatch_id
    assert caught.value.move == move
    assert str(dispatch_id) in str(caught.value)
    assert table_state(tables) == before
    assert recorder.log == []
    assert isinstance(caught.value, DispatchError)


def test_add_and_tag_are_refused_once_sent() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    txn = tables.prepare(0, tag=("task", 1))
    txn.tag = ("task", 2)
    tables.sent(txn.id, 1.0)
    with pytest.raises(IllegalMove):
        txn.add(recorder.compensation(tables, "late"), 1)
    with pytest.raises(IllegalMove):
        txn.tag = ("task", 3)
    assert txn.tag == ("task", 2)
    assert len(txn) == 0


def test_add_refuses_what_is_not_a_compensation() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    with pytest.raises(TypeError):
        txn.add("not a compensation", 1)  # type: ignore[arg-type]
    assert len(txn) == 0


def test_compensation_declaration_is_checked() -> None:
    tables = DispatchTables(1)
    with pytest.raises(TypeError):
        tables.compensation("x", "not callable", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        tables.compensation(7, None, None)  # type: ignore[arg-type]
    comp: Compensation[int] = tables.compensation("lease", None, None)
    assert comp.name == "lease"
    assert "lease" in repr(comp)


def test_transactions_are_made_only_by_the_tables() -> None:
    with pytest.raises(TypeError):
        Transaction(1, 0, None)


# -- matching results --------------------------------------------------------------


def test_the_late_result_of_a_discarded_dispatch_never_matches_the_next_one() -> None:
    tables = DispatchTables(1)
    old = tables.prepare(0)
    tables.sent(old.id, 1.0)
    tables.fenced_out(old.id)
    new = tables.prepare(0)
    tables.sent(new.id, 2.0)
    with pytest.raises(UnknownDispatch) as caught:
        tables.match(0, old.id)
    assert caught.value.phase is None
    assert tables.match(0, new.id) is new


def test_a_result_from_the_wrong_worker_is_refused() -> None:
    tables = DispatchTables(2)
    txn = tables.prepare(0)
    tables.sent(txn.id, 1.0)
    with pytest.raises(WrongWorker) as caught:
        tables.match(1, txn.id)
    assert (caught.value.expected, caught.value.got) == (0, 1)
    assert tables.phase_of(txn.id) is Phase.ACTIVE


def test_a_duplicate_result_for_a_committing_dispatch_is_refused() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    tables.sent(txn.id, 1.0)
    tables.match(0, txn.id)
    tables.fence_passed(txn.id)
    with pytest.raises(UnknownDispatch) as caught:
        tables.match(0, txn.id)
    assert caught.value.phase is Phase.COMMITTING


def test_sent_before_yields_expired_active_dispatches_oldest_first() -> None:
    tables = DispatchTables(4)
    txns = [tables.prepare(worker) for worker in range(4)]
    for txn, now in zip(txns, (3.0, 1.0, 2.0, 5.0), strict=True):
        tables.sent(txn.id, now)
    # now never goes backwards: 1.0 and 2.0 are taken as 3.0
    assert [t.sent_at for t in txns] == [3.0, 3.0, 3.0, 5.0]
    assert [t.id for t in tables.sent_before(4.0)] == [t.id for t in txns[:3]]
    tables.fence_passed(txns[1].id)
    assert [t.id for t in tables.sent_before(10.0)] == [txns[0].id, txns[2].id, txns[3].id]
    assert list(tables.sent_before(3.0)) == []


def test_sent_before_snapshot_allows_losing_workers_while_iterating() -> None:
    tables = DispatchTables(3, max_in_flight=2)
    for worker in range(3):
        for _ in range(2):
            tables.sent(tables.prepare(worker).id, float(worker))
    for txn in tables.sent_before(10.0):
        if tables.get(txn.id) is not None:
            tables.lose_worker(txn.worker)
    assert len(tables) == 0


# -- sweeps and re-entrancy -------------------------------------------------------


def test_a_dispatch_planted_in_two_tables_is_compensated_once_by_lose_worker() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    tables.sent(dispatch_id, 1.0)
    tables._debug_plant(dispatch_id, Phase.COMMITTING)
    tables._debug_plant(dispatch_id, Phase.PREPARING)
    assert len(tables) == 3
    tables.lose_worker(0)
    assert recorder.log == [("c", "after", 3), ("b", "after", 2), ("a", "after", 1)]
    assert len(tables) == 0
    assert list(tables.in_flight()) == []


def test_a_dispatch_planted_in_two_tables_is_compensated_once_by_shutdown() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    dispatch_id = add_three(tables, recorder)
    tables._debug_plant(dispatch_id, Phase.ACTIVE)
    tables.shutdown()
    assert recorder.sides() == ["before"] * 3
    assert len(tables) == 0


def test_a_compensation_that_calls_back_into_the_tables_finds_its_dispatch_gone() -> None:
    tables = DispatchTables(1)
    observed: list[object] = []

    def undo(dispatch_id: int) -> None:
        observed.append(tables.phase_of(dispatch_id))
        try:
            tables.abort(dispatch_id)
        except IllegalMove as error:
            observed.append(error.phase)
        observed.append(tables.prepare(0).worker)  # the worker is already free

    comp = tables.compensation("reentrant", undo, undo)
    txn = tables.prepare(0)
    txn.add(comp, txn.id)
    assert tables.abort(txn.id) == ()
    assert observed == [None, None, 0]
    assert len(tables) == 1


def test_each_compensation_runs_exactly_once_across_every_ending() -> None:
    tables = DispatchTables(4, max_in_flight=2)
    recorder = Recorder()
    ids = [add_three(tables, recorder, worker=w) for w in range(4)]
    tables.abort(ids[0])
    tables.sent(ids[1], 1.0)
    tables.fenced_out(ids[1])
    tables.sent(ids[2], 1.0)
    tables.fence_passed(ids[2])
    tables.finished(ids[2])
    tables.lose_worker(3)
    tables.lose_worker(3)
    tables.shutdown()
    sides = recorder.sides()
    assert (sides.count("before"), sides.count("after"), sides.count("commit")) == (6, 3, 3)
    assert len(tables) == 0


# -- errors ---------------------------------------------------------------------------


def _failures() -> tuple[CompensationFailure, ...]:
    return (
        CompensationFailure(1, 0, "lease", Side.BEFORE_SEND, OSError("disk")),
        CompensationFailure(1, 0, "bandit", Side.BEFORE_SEND, KeyError("token")),
    )


def test_raise_failures_is_silent_when_clean_and_raises_a_group_otherwise() -> None:
    raise_failures((), "nothing")
    with pytest.raises(CompensationError) as caught:
        raise_failures(_failures(), "dispatch 1 rolled back")
    error = caught.value
    assert isinstance(error, DispatchError)
    assert isinstance(error, ExceptionGroup)
    assert [f.resource for f in error.failures] == ["lease", "bandit"]
    assert "2 compensation(s) failed" in str(error)


def test_except_star_keeps_the_failures_that_match() -> None:
    caught_os: list[CompensationError] = []
    caught_key: list[CompensationError] = []
    try:
        raise_failures(_failures(), "rollback")
    except* OSError as group:
        assert isinstance(group, CompensationError)
        caught_os.append(group)
    except* KeyError as group:
        assert isinstance(group, CompensationError)
        caught_key.append(group)
    assert [f.resource for f in caught_os[0].failures] == ["lease"]
    assert [f.resource for f in caught_key[0].failures] == ["bandit"]


# -- the build ------------------------------------------------------------------------


def test_the_environment_variable_forces_the_pure_build_at_import_time() -> None:
    env = dict(os.environ, DISPATCHTX_NO_EXTENSIONS="1")
    out = subprocess.run(
        [sys.executable, "-c", "import dispatchtx; print(dispatchtx.COMPILED)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_shared_types_are_the_same_objects_in_both_builds() -> None:
    from dispatchtx import _core_py, errors

    assert errors.Phase is dispatchtx.Phase
    loaded: object = dispatchtx.DispatchTables
    assert dispatchtx.COMPILED is (loaded is not _core_py.DispatchTables)
    tables = dispatchtx.DispatchTables(1)
    txn = tables.prepare(0)
    assert type(txn.phase) is errors.Phase
    assert type(_core_py.DispatchTables(1).prepare(0).phase) is errors.Phase


# -- review findings: bad input never loses a dispatch --------------------------------


@pytest.mark.parametrize("bad_now", [None, "1.5", float("nan")])
def test_a_bad_send_time_leaves_the_dispatch_preparing_so_it_is_compensated(
    bad_now: object,
) -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with pytest.raises((TypeError, ValueError)), tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "lease"), "tok")
        tables.sent(txn.id, bad_now)  # type: ignore[arg-type]
    assert recorder.log == [("lease", "before", "tok")]
    assert tables.prepare(0).worker == 0  # the worker is free


def test_sent_before_keeps_working_after_refusing_a_nan_time() -> None:
    tables = DispatchTables(3)
    txns = [tables.prepare(worker) for worker in range(3)]
    tables.sent(txns[0].id, 1.0)
    with pytest.raises(ValueError):
        tables.sent(txns[1].id, float("nan"))
    tables.sent(txns[2].id, 2.0)
    assert [t.id for t in tables.sent_before(100)] == [txns[0].id, txns[2].id]


def test_a_worker_given_as_bool_or_index_is_stored_as_int() -> None:
    tables = DispatchTables(2)
    txn = tables.prepare(True)
    assert txn.worker == 1 and type(txn.worker) is int
    with pytest.raises(TypeError):
        tables.prepare(1.5)  # type: ignore[arg-type]


def test_dispatch_ids_stay_below_two_to_the_63() -> None:
    with pytest.raises(ValueError):
        DispatchTables(1, first_id=2**63)
    tables = DispatchTables(1, first_id=2**63 - 1)
    txn = tables.prepare(0)
    assert txn.id == 2**63 - 1
    tables.abort(txn.id)
    with pytest.raises(OverflowError):
        tables.prepare(0)
    assert tables.next_id == 2**63
    assert len(tables) == 0


def test_ship_refuses_a_bare_string() -> None:
    tables = DispatchTables(1)
    txn = tables.prepare(0)
    with pytest.raises(TypeError, match="not one str"):
        txn.ship("seed-1")
    tables.sent(txn.id, 1.0)
    assert tables.missing(0, ["s"]) == ["s"]


def test_a_boundary_left_without_entering_says_so() -> None:
    tables = DispatchTables(1)
    with pytest.raises(RuntimeError, match="without being entered"):
        tables.dispatch(0).__exit__(None, None, None)


def test_errors_survive_pickling() -> None:
    import pickle

    errors: list[DispatchError] = [
        WorkerBusy(1, 2, 2),
        IllegalMove(3, "sent", Phase.ACTIVE, "detail"),
        UnknownDispatch(4, None),
        WrongWorker(5, 0, 1),
        CompensationError("rollback", _failures()),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
    copied = pickle.loads(pickle.dumps(errors[-1]))
    assert isinstance(copied, CompensationError)
    assert [f.resource for f in copied.failures] == ["lease", "bandit"]


def test_handles_cannot_be_pickled() -> None:
    import pickle

    tables = DispatchTables(1)
    txn = tables.prepare(0)
    comp: Compensation[int] = tables.compensation("x", None, None)
    live: object
    for live in (tables, txn, comp):
        with pytest.raises(TypeError):
            pickle.dumps(live)


def test_except_star_keeps_a_failure_whose_error_is_itself_a_group() -> None:
    nested = CompensationFailure(
        1, 0, "nested", Side.AFTER_SEND, ExceptionGroup("inner", [OSError("a"), KeyError("b")])
    )
    plain = CompensationFailure(1, 0, "plain", Side.AFTER_SEND, OSError("c"))
    seen: list[list[str]] = []
    try:
        raise_failures((nested, plain), "discard")
    except* OSError as group:
        assert isinstance(group, CompensationError)
        seen.append([f.resource for f in group.failures])
    except* KeyError as group:
        assert isinstance(group, CompensationError)
        seen.append([f.resource for f in group.failures])
    assert seen == [["nested", "plain"], ["nested"]]


# -- review findings: gaps in what the first tests checked ----------------------------


def test_an_exception_in_dispatch_after_the_fence_leaves_the_dispatch_committing() -> None:
    tables = DispatchTables(1)
    recorder = Recorder()
    with pytest.raises(RuntimeError), tables.dispatch(0) as txn:
        txn.add(recorder.compensation(tables, "lease"), "tok")
        tables.sent(txn.id, 1.0)
        tables.fence_passed(txn.id)
        raise RuntimeError("after the fence")
    assert recorder.log == []
    assert tables.phase_of(txn.id) is Phase.COMMITTING


@pytest.mark.parametrize("sweep", ["lose_worker", "shutdown"])
def test_a_compensation_calling_back_during_a_sweep_finds_its_dispatch_gone(sweep: str) -> None:
    tables = DispatchTables(2)
    seen: list[object] = []

    def undo(dispatch_id: int) -> None:
        seen.append((tables.phase_of(dispatch_id), len(tables)))

    comp = tables.compensation("reentrant", undo, undo)
    first, second = tables.prepare(0), tables.prepare(1)
    first.add(comp, first.id)
    second.add(comp, second.id)
    tables.sent(second.id, 1.0)
    if sweep == "lose_worker":
        tables.lose_worker(0)
        assert seen == [(None, 1)]
    else:
        tables.shutdown()
        assert seen == [(None, 0), (None, 0)]


@pytest.mark.parametrize("phase", ["PREPARING", "COMMITTING"])
def test_a_result_from_the_wrong_worker_is_refused_in_any_phase(phase: str) -> None:
    tables = DispatchTables(2)
    txn = tables.prepare(0)
    if phase == "COMMITTING":
        tables.sent(txn.id, 1.0)
        tables.fence_passed(txn.id)
    with pytest.raises(WrongWorker):
        tables.match(1, txn.id)
    with pytest.raises(UnknownDispatch):
        tables.match(0, txn.id)
