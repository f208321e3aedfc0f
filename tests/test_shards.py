"""The shard leases (`dispatchtx.resources.shards`): task leases per state shard,
through real `DispatchTables` moves, against whichever build of the core is
loaded."""

from __future__ import annotations

import pytest

from dispatchtx import DispatchTables
from dispatchtx.resources import ShardLease, ShardLeases, Unavailable

from support import commit, send

# -- state-shard task: take back the lease count / record one failure -----------


def make_shards() -> tuple[DispatchTables, ShardLeases]:
    tables = DispatchTables(3)
    shards = ShardLeases(tables)
    for task in ("a", "b"):
        shards.add_task("s0", task)
    return tables, shards


def test_shard_undo_drops_the_lease_and_takes_back_the_lease_count() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    lease = shards.reserve(txn, "s0", "a")
    assert lease == ShardLease("s0", "a", txn.id)
    assert (shards.lease_count("s0", "a"), shards.holder("s0", "a")) == (1, txn.id)
    assert tables.abort(txn.id) == ()
    assert shards.lease_count("s0", "a") == 0
    assert shards.failure_count("s0", "a") == 0
    assert shards.holder("s0", "a") is None


def test_shard_discard_drops_the_lease_and_records_one_failure() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    shards.reserve(txn, "s0", "a")
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()
    assert shards.lease_count("s0", "a") == 1  # it really went out
    assert shards.failure_count("s0", "a") == 1
    assert shards.holder("s0", "a") is None


def test_shard_release_on_commit_keeps_the_counts() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    shards.reserve(txn, "s0", "a")
    send(tables, txn)
    commit(tables, txn)
    assert (shards.lease_count("s0", "a"), shards.failure_count("s0", "a")) == (1, 0)
    assert shards.leaks() == []


def test_shard_lost_worker_undoes_preparing_and_discards_active() -> None:
    tables = DispatchTables(1, max_in_flight=2)
    shards = ShardLeases(tables)
    for task in ("a", "b"):
        shards.add_task("s0", task)
    first = tables.prepare(0)
    shards.reserve(first, "s0", "a")
    send(tables, first)
    second = tables.prepare(0)
    shards.reserve(second, "s0", "b")
    assert tables.lose_worker(0) == ()
    assert (shards.lease_count("s0", "a"), shards.failure_count("s0", "a")) == (1, 1)
    assert (shards.lease_count("s0", "b"), shards.failure_count("s0", "b")) == (0, 0)
    assert shards.leaks() == []


def test_shard_picks_the_free_task_with_fewest_failures() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    shards.reserve(txn, "s0", "a")
    send(tables, txn)
    tables.fenced_out(txn.id)
    assert shards.reserve(tables.prepare(0), "s0").task == "b"
    assert shards.reserve(tables.prepare(1), "s0").task == "a"
    with pytest.raises(Unavailable):
        shards.reserve(tables.prepare(2), "s0")
