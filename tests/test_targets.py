"""The target registry (`dispatchtx.resources.targets`): target groups and local
targets, through real `DispatchTables` moves, against whichever build of the
core is loaded."""

from __future__ import annotations

import pytest

from dispatchtx import DispatchTables, IllegalMove, Side
from dispatchtx.resources import NotReserved, TargetRegistry, TargetReservation, Unavailable

from support import send

# -- target group / local target: release, release, release ---------------------


def make_targets() -> tuple[DispatchTables, TargetRegistry]:
    tables = DispatchTables(5)
    targets = TargetRegistry(tables)
    targets.add_target("t0", group="fuzz", capacity=2)
    targets.add_target("t1", group="fuzz", capacity=1)
    targets.add_target("local")
    return tables, targets


def test_target_undo_before_send_releases() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    held = targets.reserve(txn, "fuzz")
    assert held == TargetReservation("t0", txn.id)
    assert targets.load("t0") == 1
    assert tables.abort(txn.id) == ()
    assert targets.load("t0") == 0
    assert targets.leaks() == []


def test_target_discard_after_send_releases() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    targets.reserve_target(txn, "local")
    send(tables, txn)
    assert targets.holders("local") == [txn.id]
    assert tables.fenced_out(txn.id) == ()
    assert targets.load("local") == 0
    assert targets.leaks() == []


def test_target_release_on_commit() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    targets.reserve(txn, "fuzz")
    send(tables, txn)
    tables.fence_passed(txn.id)
    assert targets.load("t0") == 1  # held while triage runs (D6)
    assert tables.finished(txn.id) == ()
    assert targets.leaks() == []


def test_target_group_fills_least_loaded_first_then_is_unavailable() -> None:
    tables, targets = make_targets()
    picked = [targets.reserve(tables.prepare(w), "fuzz").target for w in range(3)]
    assert picked == ["t0", "t1", "t0"]
    assert targets.free_capacity("fuzz") == 0
    txn = tables.prepare(3)
    with pytest.raises(Unavailable):
        targets.reserve(txn, "fuzz")
    assert len(txn) == 0  # a refused reservation registers nothing
    targets.reserve_target(txn, "local")
    with pytest.raises(Unavailable):
        targets.reserve_target(tables.prepare(4), "local")  # a local target of capacity 1
    assert tables.lose_worker(0) == ()
    assert targets.free_capacity("fuzz") == 1


def test_a_second_release_is_a_recorded_failure_never_a_negative_load() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    held = targets.reserve(txn, "fuzz")
    targets.release(held)  # a regression releasing early
    failures = tables.abort(txn.id)
    assert [(f.resource, f.side, type(f.error)) for f in failures] == [
        ("targets", Side.BEFORE_SEND, NotReserved)
    ]
    assert targets.load("t0") == 0


def test_reserving_on_a_sent_dispatch_is_refused_and_leaves_no_trace() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    send(tables, txn)
    with pytest.raises(IllegalMove):
        targets.reserve(txn, "fuzz")
    assert targets.leaks() == []
    assert targets.free_capacity("fuzz") == 3
