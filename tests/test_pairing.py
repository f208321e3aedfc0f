"""The seed pairing (`dispatchtx.resources.pairing`): seed-to-worker pairings,
through real `DispatchTables` moves, against whichever build of the core is
loaded."""

from __future__ import annotations

import pytest

from dispatchtx import DispatchTables
from dispatchtx.resources import Pairing, SeedPairing, Unavailable

from support import commit, send

# -- seed-to-worker: take back the count / keep the true count ------------------


def test_pairing_undo_drops_the_pairing_and_takes_back_the_count() -> None:
    tables = DispatchTables(2)
    pairing = SeedPairing(tables)
    txn = tables.prepare(1)
    assert pairing.reserve(txn, "seed-a") == Pairing("seed-a", 1, txn.id)
    assert (pairing.paired_worker("seed-a"), pairing.assignments("seed-a", 1)) == (1, 1)
    assert tables.abort(txn.id) == ()
    assert pairing.paired_worker("seed-a") is None
    assert (pairing.assignments("seed-a"), pairing.assignments("seed-a", 1)) == (0, 0)


def test_pairing_discard_drops_the_pairing_and_keeps_the_true_count() -> None:
    tables = DispatchTables(2)
    pairing = SeedPairing(tables)
    txn = tables.prepare(1)
    pairing.reserve(txn, "seed-a")
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()
    assert pairing.paired_worker("seed-a") is None
    assert (pairing.assignments("seed-a"), pairing.assignments("seed-a", 1)) == (1, 1)


def test_pairing_commit_releases_and_a_paired_seed_is_unavailable() -> None:
    tables = DispatchTables(2)
    pairing = SeedPairing(tables)
    txn = tables.prepare(0)
    pairing.reserve(txn, "seed-a")
    with pytest.raises(Unavailable):
        pairing.reserve(tables.prepare(1), "seed-a")
    assert pairing.least_assigned(["seed-a", "seed-b"], worker=1) == "seed-b"
    send(tables, txn)
    commit(tables, txn)
    assert pairing.leaks() == [] and pairing.assignments("seed-a", 0) == 1
    assert pairing.least_assigned(["seed-a", "seed-b"], worker=0) == "seed-b"
