"""The core's move table (dispatchtx.errors.MOVES) is what both builds
enforce: each move succeeds from its source phase alone, leaves the dispatch
in its target phase, and from anywhere else raises IllegalMove naming the
phase, with nothing moved. Run against whichever build is loaded."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatchtx import DispatchTables, IllegalMove, Phase, Transaction
from dispatchtx.errors import MOVES, Move

LIVE = (Phase.PREPARING, Phase.ACTIVE, Phase.COMMITTING)


def dispatch_in(phase: Phase) -> tuple[DispatchTables[str], Transaction[str]]:
    """A dispatch brought to `phase` by the moves themselves."""
    tables: DispatchTables[str] = DispatchTables(1)
    txn = tables.prepare(0, tag="item")
    if phase is Phase.ROLLED_BACK:
        tables.abort(txn.id)
    if phase in (Phase.ACTIVE, Phase.COMMITTING, Phase.COMMITTED):
        tables.sent(txn.id, 1.0)
    if phase in (Phase.COMMITTING, Phase.COMMITTED):
        tables.fence_passed(txn.id)
    if phase is Phase.COMMITTED:
        tables.finished(txn.id)
    assert txn.phase is phase
    return tables, txn


def run(tables: DispatchTables[str], name: str, dispatch_id: int) -> object:
    moves: dict[str, Callable[[], object]] = {
        "sent": lambda: tables.sent(dispatch_id, 2.0),
        "abort": lambda: tables.abort(dispatch_id),
        "fence_passed": lambda: tables.fence_passed(dispatch_id),
        "finished": lambda: tables.finished(dispatch_id),
        "fenced_out": lambda: tables.fenced_out(dispatch_id),
    }
    return moves[name]()


def test_the_table_names_every_move_once_and_is_read_only() -> None:
    assert set(MOVES) == {"sent", "abort", "fence_passed", "finished", "fenced_out"}
    assert all(isinstance(move, Move) and move.name == name for name, move in MOVES.items())
    assert all(move.source in LIVE for move in MOVES.values())
    with pytest.raises(TypeError):
        MOVES["sent"] = Move("sent", Phase.ACTIVE, Phase.ACTIVE)  # type: ignore[index]


@pytest.mark.parametrize("name", sorted(MOVES))
@pytest.mark.parametrize("phase", list(Phase), ids=lambda phase: phase.name)
def test_a_move_is_legal_from_its_source_alone(name: str, phase: Phase) -> None:
    move = MOVES[name]
    tables, txn = dispatch_in(phase)
    if phase is move.source:
        run(tables, name, txn.id)
        assert txn.phase is move.target
        expected_table = move.target if move.target in LIVE else None
        assert tables.phase_of(txn.id) is expected_table
        return
    with pytest.raises(IllegalMove) as raised:
        run(tables, name, txn.id)
    error = raised.value
    assert error.move == name and error.dispatch_id == txn.id
    assert error.phase is (phase if phase in LIVE else None)  # an ended one is in no table
    assert txn.phase is phase  # nothing moved
    assert tables.phase_of(txn.id) is (phase if phase in LIVE else None)


def test_a_typed_tag_needs_no_cast() -> None:
    tables: DispatchTables[tuple[str, int]] = DispatchTables(2)
    with tables.dispatch(0, tag=("item-1", 3)) as txn:
        tables.sent(txn.id, 1.0)
    work_id, token = tables.match(0, txn.id).tag  # typed: tuple[str, int]
    assert (work_id.upper(), token + 1) == ("ITEM-1", 4)
    assert DispatchTables[int] is not None and Transaction[int] is not None
