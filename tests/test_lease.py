"""The shared exact-work lease adapter: docs/design.md, first row of the table."""

from __future__ import annotations

import pytest

from dispatchtx import DispatchTables, Phase, Side
from dispatchtx.fs import SimulatedClock, SimulatedFS
from dispatchtx.resources import Unavailable
from dispatchtx.resources.lease import LeaseLost, WorkLeases
from dispatchtx.store import ClaimOutcome, CommitOutcome, ItemStatus, WorkStore

ROOT = "/store"
TTL = 0.05
WORK = "target-a/seed-1/batch-0"


def make_store(fs: SimulatedFS, clock: SimulatedClock, coordinator: str) -> WorkStore:
    store = WorkStore(fs, ROOT, clock, ttl=TTL, retry_pause=lambda seconds: None)
    store.register(coordinator)
    return store


@pytest.fixture
def world() -> tuple[SimulatedFS, SimulatedClock, WorkStore, DispatchTables, WorkLeases]:
    fs, clock = SimulatedFS(), SimulatedClock()
    store = make_store(fs, clock, "coord-a")
    tables = DispatchTables(2)
    return fs, clock, store, tables, WorkLeases(tables, store)


World = tuple[SimulatedFS, SimulatedClock, WorkStore, DispatchTables, WorkLeases]


def test_undo_before_send_abandons_with_the_current_token(world: World) -> None:
    _, _, store, tables, leases = world
    txn = tables.prepare(0)
    lease = leases.reserve(txn, WORK)
    assert store.read(WORK).status is ItemStatus.CLAIMED
    assert tables.abort(txn.id) == ()
    assert store.read(WORK).status is ItemStatus.ABANDONED
    assert leases.leaks() == [] and leases.abandoned == 1
    # the item is claimable again at once, with a higher token
    again = leases.reserve(tables.prepare(0), WORK)
    assert again.token > lease.token


def test_discard_after_a_stale_result_abandons_the_same_token(world: World) -> None:
    _, _, store, tables, leases = world
    txn = tables.prepare(1)
    lease = leases.reserve(txn, WORK)
    tables.sent(txn.id, 1.0)
    assert tables.fenced_out(txn.id) == ()
    state = store.read(WORK)
    assert (state.status, state.token) == (ItemStatus.ABANDONED, lease.token)
    assert leases.leaks() == []


def test_a_taken_over_token_fails_safely_and_is_reported(world: World) -> None:
    fs, clock, store, tables, leases = world
    txn = tables.prepare(0)
    lease = leases.reserve(txn, WORK)
    tables.sent(txn.id, 1.0)
    peer = make_store(fs, clock, "coord-b")
    assert peer.try_claim(WORK).outcome is ClaimOutcome.BUSY  # starts the peer's watch
    clock.advance(TTL * 2)
    taken = peer.try_claim(WORK)
    assert taken.outcome is ClaimOutcome.CLAIMED
    (failure,) = tables.fenced_out(txn.id)
    assert (failure.resource, failure.side) == ("work-lease", Side.AFTER_SEND)
    assert isinstance(failure.error, LeaseLost)
    assert "taken over" in str(failure.error)
    # no effect on the new holder's claim
    state = store.read(WORK)
    assert (state.status, state.token) == (ItemStatus.CLAIMED, taken.token)
    assert state.token is not None and state.token > lease.token
    assert leases.leaks() == [] and leases.taken_over == 1


def test_a_committed_lease_is_not_abandoned_and_is_forgotten_on_finish(world: World) -> None:
    _, _, store, tables, leases = world
    txn = tables.prepare(0)
    lease = leases.reserve(txn, WORK)
    tables.sent(txn.id, 1.0)
    assert store.begin_commit(WORK, lease.token, b"result") is CommitOutcome.COMMITTED
    with tables.committing(txn.id) as committing:
        assert committing.phase is Phase.COMMITTING
        assert leases.held(WORK) == lease  # still heartbeated while committing
        store.complete(WORK, lease.token)
    assert store.read(WORK).status is ItemStatus.DONE
    assert leases.leaks() == [] and leases.abandoned == 0


def test_an_item_held_elsewhere_is_unavailable_and_nothing_is_registered(world: World) -> None:
    fs, clock, _, tables, leases = world
    peer = make_store(fs, clock, "coord-b")
    assert peer.claim(WORK) == 1
    txn = tables.prepare(0)
    with pytest.raises(Unavailable, match="busy"):
        leases.reserve(txn, WORK)
    assert len(txn) == 0 and leases.leaks() == []


def test_shutdown_abandons_every_lease_held(world: World) -> None:
    _, _, store, tables, leases = world
    first, second = tables.prepare(0), tables.prepare(1)
    leases.reserve(first, "item-1")
    leases.reserve(second, "item-2")
    tables.sent(second.id, 1.0)
    assert [lease.work_id for lease in leases.heartbeat_all()] == []
    assert tables.shutdown() == ()
    statuses = {store.read(w).status for w in ("item-1", "item-2")}
    assert statuses == {ItemStatus.ABANDONED}
    assert leases.leaks() == []


def test_an_unsent_dispatch_does_not_count_towards_quarantine(world: World) -> None:
    _, _, store, tables, leases = world
    for _ in range(store.quarantine_after + 2):
        txn = tables.prepare(0)
        leases.reserve(txn, WORK)
        tables.abort(txn.id)  # never sent: no result was lost
    state = store.read(WORK)
    assert (state.status, state.lost_claims) == (ItemStatus.ABANDONED, 0)
    # a result lost after the send does count
    txn = tables.prepare(0)
    leases.reserve(txn, WORK)
    tables.sent(txn.id, 1.0)
    tables.fenced_out(txn.id)
    assert store.read(WORK).lost_claims == 1
