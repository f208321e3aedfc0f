"""The shared exact-work store (dispatchtx.store): the link()-published slot chain."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import time
from collections import Counter
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchtx.errors import DispatchError
from dispatchtx.fs import (
    DiskFaultPlan,
    Fault,
    FaultKind,
    FaultRule,
    FaultyFS,
    Op,
    RealClock,
    RealFS,
    SimulatedClock,
    SimulatedCrash,
    SimulatedFS,
    SimulatedTime,
)
from dispatchtx.store import (
    INLINE_RESULT_BYTES,
    MAX_INCARNATION,
    MAX_WORK_ID_BYTES_LIMIT,
    AbandonOutcome,
    Change,
    ClaimOutcome,
    ClaimResult,
    CommitOutcome,
    CompleteOutcome,
    CorruptObject,
    CorruptRecord,
    InvalidCoordinatorId,
    InvalidToken,
    InvalidWorkId,
    ItemStatus,
    NotOwner,
    NotRegistered,
    OutcomeUnknown,
    Owner,
    Record,
    StoreError,
    StoreIOError,
    WorkStore,
    item_key,
    object_id_of,
)

ROOT = "/shared/store"
TTL = 1.0
MARGIN = 0.25
EXPIRY = TTL + MARGIN
WORK = "task-42"
RESULT = b"the worker's result \x00\xff"


def _no_pause(seconds: float) -> None:
    """Retries in the simulator need no real sleep."""


def make_store(
    fs: Any,
    clock: Any,
    coordinator: str | None = None,
    *,
    root: str = ROOT,
    ttl: float = TTL,
    margin: float = MARGIN,
    quarantine_after: int = 3,
    max_work_id_bytes: int = 64 * 1024,
) -> WorkStore:
    store = WorkStore(
        fs,
        root,
        clock,
        ttl=ttl,
        margin=margin,
        quarantine_after=quarantine_after,
        max_work_id_bytes=max_work_id_bytes,
        retry_pause=_no_pause,
    )
    if coordinator is not None:
        store.register(coordinator)
    return store


def slot_path(work_id: str, slot: int, root: str = ROOT) -> str:
    return f"{root}/slots/{item_key(work_id)}.s.{slot:010d}"


def read_record(fs: Any, work_id: str, slot: int, root: str = ROOT) -> Record:
    path = slot_path(work_id, slot, root)
    return Record.decode(fs.read(path), path, item_key(work_id), slot)


@pytest.fixture
def fs() -> SimulatedFS:
    return SimulatedFS()


@pytest.fixture
def clock() -> SimulatedClock:
    return SimulatedClock()


# ---------------------------------------------------------------------------
# The happy path and the fence
# ---------------------------------------------------------------------------


def test_claim_heartbeat_commit_complete(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord-a")
    assert store.owner == Owner("coord-a", 1)
    assert store.read(WORK).status is ItemStatus.FREE

    token = store.claim(WORK)
    assert token == 1
    state = store.read(WORK)
    assert (state.status, state.token, state.owner, state.head_slot) == (
        ItemStatus.CLAIMED,
        1,
        Owner("coord-a", 1),
        1,
    )
    assert store.heartbeat(WORK, token)
    assert store.try_claim(WORK).outcome is ClaimOutcome.ALREADY_HELD

    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    state = store.read(WORK)
    assert state.status is ItemStatus.COMMITTING
    assert state.object_id == object_id_of(RESULT)
    assert state.result_size == len(RESULT)
    assert store.stored_result(WORK) == RESULT
    assert store.heartbeat(WORK, token)  # the holder keeps heartbeating a committing item
    assert store.claim(WORK) is None

    assert store.complete(WORK, token) is CompleteOutcome.COMPLETED
    state = store.read(WORK)
    assert (state.status, state.token, state.head_slot) == (ItemStatus.DONE, 1, 3)
    assert store.stored_result(WORK) == RESULT
    assert store.try_claim(WORK).outcome is ClaimOutcome.DONE
    assert not store.heartbeat(WORK, token)
    assert store.complete(WORK, token) is CompleteOutcome.ALREADY_DONE
    assert store.abandon(WORK, token) is AbandonOutcome.ALREADY_DONE

    # The chain on disk: slot 0 names the work id, then claim, commit, done.
    changes = [read_record(fs, WORK, slot).change for slot in range(4)]
    assert changes == [Change.ITEM, Change.CLAIM, Change.COMMIT, Change.DONE]
    assert read_record(fs, WORK, 0).work_id == WORK
    assert not fs.exists(slot_path(WORK, 4))
    # Every slot is durable, and no temp file is left behind.
    for slot in range(4):
        assert fs.durable_exists(slot_path(WORK, slot))
    assert fs.listdir(f"{ROOT}/tmp") == []


def test_records_are_compact_checksummed_json(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord-a")
    token = store.claim(WORK)
    assert token is not None
    store.begin_commit(WORK, token, RESULT)
    raw = fs.read(slot_path(WORK, 2))
    assert raw.startswith(b"dtx-record-1 ") and raw.endswith(b"\n") and raw.count(b"\n") == 1
    # The fields, and the small result itself (base64) in place of an object.
    assert len(raw) < 400 + len(RESULT) * 4 // 3
    record = read_record(fs, WORK, 2)
    assert record.change is Change.COMMIT
    assert (record.token, record.owner, record.object_id, record.size) == (
        1,
        Owner("coord-a", 1),
        object_id_of(RESULT),
        len(RESULT),
    )
    assert record.encode() == raw


def test_abandon_then_claim_again(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord-a")
    token = store.claim(WORK)
    assert token == 1
    assert store.abandon(WORK, token) is AbandonOutcome.ABANDONED
    assert store.abandon(WORK, token) is AbandonOutcome.ABANDONED  # idempotent
    state = store.read(WORK)
    assert (state.status, state.token, state.lost_claims) == (ItemStatus.ABANDONED, 1, 1)
    assert not store.heartbeat(WORK, token)
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.FENCED_OUT
    assert store.complete(WORK, token) is CompleteOutcome.FENCED_OUT
    # The next claim takes the next slot: a higher fencing token.
    assert store.claim(WORK) == 3


def test_a_duplicate_result_is_fenced_out(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord-a")
    token = store.claim(WORK)
    assert token is not None
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert store.begin_commit(WORK, token, b"second answer") is CommitOutcome.DUPLICATE
    assert store.stored_result(WORK) == RESULT
    assert store.abandon(WORK, token) is AbandonOutcome.ALREADY_COMMITTING


def test_stale_token_cannot_abandon_commit_or_complete(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    stale = holder.claim(WORK)
    assert stale == 1
    assert claimer.try_claim(WORK).outcome is ClaimOutcome.BUSY  # starts the watch
    clock.advance(EXPIRY)
    fresh = claimer.claim(WORK)
    assert fresh == 2

    assert not holder.heartbeat(WORK, stale)
    assert holder.abandon(WORK, stale) is AbandonOutcome.TAKEN_OVER
    assert holder.begin_commit(WORK, stale, b"late") is CommitOutcome.FENCED_OUT
    assert holder.complete(WORK, stale) is CompleteOutcome.FENCED_OUT
    state = holder.read(WORK)
    assert (state.status, state.token, state.owner) == (
        ItemStatus.CLAIMED,
        2,
        Owner("claimer", 1),
    )
    # The fresh holder is unaffected, and the late result left no commit.
    assert claimer.begin_commit(WORK, fresh, RESULT) is CommitOutcome.COMMITTED
    assert holder.complete(WORK, stale) is CompleteOutcome.FENCED_OUT
    assert claimer.complete(WORK, fresh) is CompleteOutcome.COMPLETED
    assert claimer.stored_result(WORK) == RESULT


def test_tokens_are_checked(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord-a")
    token = store.claim(WORK)
    assert token == 1
    store.abandon(WORK, token)
    for bad in (0, -1, 2, 99, True, "1", 1.0, None):
        with pytest.raises(InvalidToken):
            store.begin_commit(WORK, bad, RESULT)  # type: ignore[arg-type]
        with pytest.raises(InvalidToken):
            store.abandon(WORK, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidToken):
        store.complete("never-claimed", 1)
    with pytest.raises(TypeError, match="bytes"):
        store.begin_commit(WORK, 1, "text")  # type: ignore[arg-type]


def test_abandon_of_another_coordinators_claim_is_refused(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    owner = make_store(fs, clock, "owner")
    other = make_store(fs, clock, "other")
    token = owner.claim(WORK)
    assert token is not None
    with pytest.raises(NotOwner, match="owner#1"):
        other.abandon(WORK, token)
    assert other.begin_commit(WORK, token, RESULT) is CommitOutcome.FENCED_OUT
    assert not other.heartbeat(WORK, token)
    assert owner.read(WORK).status is ItemStatus.CLAIMED


def test_changes_need_a_registered_owner(fs: SimulatedFS, clock: SimulatedClock) -> None:
    anonymous = make_store(fs, clock)
    with pytest.raises(NotRegistered, match="register"):
        anonymous.claim(WORK)
    with pytest.raises(NotRegistered):
        anonymous.complete(WORK, 1)
    assert anonymous.read(WORK).status is ItemStatus.FREE  # reading needs no owner
    for write in (Op.MKDIR, Op.WRITE_TEMP, Op.LINK, Op.PWRITE, Op.UNLINK):
        assert fs.calls[write] == 0


# ---------------------------------------------------------------------------
# Expiry: the claimer's own monotonic clock watching the heartbeat stand still
# ---------------------------------------------------------------------------


def test_expiry_needs_two_observations_ttl_plus_margin_apart(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    assert holder.claim(WORK) == 1
    clock.advance(100 * TTL)  # however old the claim, the first look only starts the watch
    assert claimer.try_claim(WORK).outcome is ClaimOutcome.BUSY
    clock.advance(EXPIRY - 0.01)
    assert claimer.try_claim(WORK).outcome is ClaimOutcome.BUSY
    clock.advance(0.01)
    result = claimer.try_claim(WORK)
    assert (result.outcome, result.token, result.lost_claims) == (ClaimOutcome.CLAIMED, 2, 1)


def test_a_heartbeat_keeps_the_claim(fs: SimulatedFS, clock: SimulatedClock) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    token = holder.claim(WORK)
    assert token is not None
    for _ in range(20):
        assert claimer.claim(WORK) is None
        clock.advance(TTL / 2)
        assert holder.heartbeat(WORK, token)
        clock.advance(TTL / 2)
    # Silence: expiry is counted from the first look at the last counter value.
    assert claimer.claim(WORK) is None
    clock.advance(EXPIRY)
    assert claimer.claim(WORK) == 2


def test_expiry_uses_the_claimers_clock_not_the_holders(fs: SimulatedFS) -> None:
    time_ = SimulatedTime()
    holder_clock = time_.clock(monotonic_start=1e6, wall_start=0.0)  # another host
    claimer_clock = time_.clock(monotonic_start=5.0)
    holder = make_store(fs, holder_clock, "holder")
    claimer = make_store(fs, claimer_clock, "claimer")
    assert holder.claim(WORK) == 1
    holder_clock.step_wall(1e9)  # wall steps do not matter at all
    assert claimer.claim(WORK) is None
    time_.advance(EXPIRY)
    assert claimer.claim(WORK) == 2


def test_explicit_now_is_used(fs: SimulatedFS, clock: SimulatedClock) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    assert holder.claim(WORK, now=0.0) == 1
    assert claimer.claim(WORK, now=10.0) is None
    assert claimer.claim(WORK, now=10.0 + EXPIRY) == 2


def test_the_heartbeat_file_exists_before_the_claim_is_visible(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "holder")
    fs.log = []
    assert store.claim(WORK) == 1
    ops = [(call.op, call.path.rsplit(".", 2)[-2:]) for call in fs.log]
    heartbeat = ops.index((Op.PWRITE, ["hb", "0000000001"]))
    link = ops.index((Op.LINK, ["s", "0000000001"]))
    assert heartbeat < link  # no watcher can cache "absent" for a live holder's counter
    assert fs.durable_exists(f"{ROOT}/slots/{item_key(WORK)}.hb.0000000001")


def test_a_claim_that_ends_takes_its_heartbeat_file_with_it(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")

    def counters() -> list[str]:
        return _counters(fs)

    assert holder.claim(WORK) == 1 and counters() == ["hb.0000000001"]
    assert holder.abandon(WORK, 1) is AbandonOutcome.ABANDONED
    assert counters() == []
    assert holder.claim(WORK) == 3
    assert claimer.claim(WORK, now=0.0) is None
    assert claimer.claim(WORK, now=EXPIRY) == 4  # taken over: the stalled counter goes
    assert counters() == ["hb.0000000004"]
    assert claimer.begin_commit(WORK, 4, RESULT) is CommitOutcome.COMMITTED
    assert claimer.complete(WORK, 4) is CompleteOutcome.COMPLETED
    assert counters() == []


def test_paused_holder_resumes_and_is_fenced_out(fs: SimulatedFS, clock: SimulatedClock) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    token = holder.claim(WORK)
    assert token is not None
    assert holder.heartbeat(WORK, token)
    assert claimer.claim(WORK) is None
    # The holder is paused (no heartbeat) while the claimer's clock runs.
    clock.advance(EXPIRY)
    taken = claimer.claim(WORK)
    assert taken == 2
    # The holder wakes up and tries to carry on: every step is refused.
    assert not holder.heartbeat(WORK, token)
    assert holder.begin_commit(WORK, token, b"stale result") is CommitOutcome.FENCED_OUT
    assert holder.abandon(WORK, token) is AbandonOutcome.TAKEN_OVER
    assert holder.read(WORK).token == taken
    assert not holder.objects.has(object_id_of(b"stale result"))  # fenced before storing it


def test_a_committing_item_is_never_claimable(fs: SimulatedFS, clock: SimulatedClock) -> None:
    owner = make_store(fs, clock, "owner")
    other = make_store(fs, clock, "other")
    token = owner.claim(WORK)
    assert token is not None
    assert owner.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    for _ in range(50):  # the owner is silent for 50 * 2 TTL
        result = other.try_claim(WORK)
        assert result.outcome is ClaimOutcome.COMMITTING and result.token is None
        clock.advance(2 * TTL)
    assert owner.read(WORK).status is ItemStatus.COMMITTING


def test_stalled_commit_is_rolled_forward_and_any_coordinator_completes(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    owner = make_store(fs, clock, "owner")
    recoverer = make_store(fs, clock, "recoverer")
    token = owner.claim(WORK)
    assert token is not None
    assert owner.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert recoverer.roll_forward_candidates() == []  # first look starts the watch
    clock.advance(TTL / 2)
    assert owner.heartbeat(WORK, token)  # the owner is alive: its triage runs
    clock.advance(TTL)
    assert recoverer.roll_forward_candidates() == []
    clock.advance(EXPIRY)  # now the owner is silent
    (candidate,) = recoverer.roll_forward_candidates()
    assert (candidate.work_id, candidate.token, candidate.result) == (WORK, token, RESULT)
    assert candidate.state.owner == Owner("owner", 1)
    assert owner.roll_forward_candidates() == []  # its own commit is not a candidate for it

    assert recoverer.complete(WORK, token) is CompleteOutcome.COMPLETED
    assert recoverer.complete(WORK, token) is CompleteOutcome.ALREADY_DONE
    assert owner.complete(WORK, token) is CompleteOutcome.ALREADY_DONE
    third = make_store(fs, clock, "third")  # another store object, another coordinator
    assert third.complete(WORK, token) is CompleteOutcome.ALREADY_DONE
    assert third.read(WORK).status is ItemStatus.DONE
    assert recoverer.roll_forward_candidates() == []


def test_roll_forward_looks_only_at_marked_items_and_marks_go_when_final(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    owner = make_store(fs, clock, "owner")
    recoverer = make_store(fs, clock, "recoverer")
    for n in range(20):  # done items: no marks left, nothing for a look to read
        token = owner.claim(f"done-{n}")
        assert token is not None
        assert owner.begin_commit(f"done-{n}", token, RESULT) is CommitOutcome.COMMITTED
        assert owner.complete(f"done-{n}", token) is CompleteOutcome.COMPLETED
    assert fs.listdir(f"{ROOT}/committing") == []
    token = owner.claim(WORK)
    assert token is not None
    assert owner.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert fs.listdir(f"{ROOT}/committing") == [item_key(WORK)]
    fs.reset_calls()
    assert recoverer.roll_forward_candidates() == []  # the first look starts the watch
    assert fs.calls[Op.READ] <= 6, fs.calls  # the marked item's chain only
    fs.reset_calls()
    assert make_store(fs, clock, "third").roll_forward_candidates(full=True) == []
    assert fs.calls[Op.READ] > 20 * 4, fs.calls  # a full look reads all 21 chains
    clock.advance(EXPIRY)
    (candidate,) = recoverer.roll_forward_candidates()
    assert candidate.work_id == WORK
    assert recoverer.complete(WORK, token) is CompleteOutcome.COMPLETED
    assert fs.listdir(f"{ROOT}/committing") == []


def test_a_mark_stays_until_its_item_is_final(fs: SimulatedFS, clock: SimulatedClock) -> None:
    owner = make_store(fs, clock, "owner")
    peer = make_store(fs, clock, "peer")
    token = owner.claim(WORK)
    assert token is not None
    # A mark written, the commit not (yet) linked: a look must not remove it,
    # or a commit linked right after would have none.
    fs.mkdir(f"{ROOT}/committing")
    fs.open_append(f"{ROOT}/committing/{item_key(WORK)}").close()
    assert peer.roll_forward_candidates() == []
    assert fs.listdir(f"{ROOT}/committing") == [item_key(WORK)]
    assert owner.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    # The owner dies after `done` but before removing the mark: the next
    # look finds the item final and removes it.
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.UNLINK, path_contains="committing")
    )
    assert owner.complete(WORK, token) is CompleteOutcome.COMPLETED
    fs.fault = None
    assert fs.listdir(f"{ROOT}/committing") == [item_key(WORK)]
    assert peer.roll_forward_candidates() == []
    assert fs.listdir(f"{ROOT}/committing") == []


def test_after_a_power_loss_only_the_full_look_is_sure_to_find_a_commit(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    owner = make_store(fs, clock, "owner")
    token = owner.claim(WORK)
    assert token is not None
    assert owner.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    fs.crash("power")  # the commit slot was fsynced; the mark's directory entry was not
    restarted = make_store(fs, clock, "owner")
    assert restarted.roll_forward_candidates() == []
    (candidate,) = restarted.roll_forward_candidates(full=True)
    assert (candidate.work_id, candidate.token) == (WORK, token)


def test_a_claim_that_finds_a_commit_marks_it_again(fs: SimulatedFS, clock: SimulatedClock) -> None:
    owner = make_store(fs, clock, "owner")
    token = owner.claim(WORK)
    assert token is not None
    assert owner.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    fs.crash("power")  # the mark is gone, the commit is not
    peer = make_store(fs, clock, "peer")
    # The peer's full look reads the commit slot as absent (a stale look-up):
    # it sees a claim, and marks nothing.
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains="s.0000000002")
    )
    assert peer.roll_forward_candidates(full=True) == []
    fs.fault = None
    assert peer.roll_forward_candidates() == []
    assert fs.listdir(f"{ROOT}/committing") == []
    # Its workload offers the item again: the claim finds the commit and marks it.
    assert peer.try_claim(WORK).outcome is ClaimOutcome.COMMITTING
    assert fs.listdir(f"{ROOT}/committing") == [item_key(WORK)]
    assert peer.roll_forward_candidates() == []  # the watch starts
    clock.advance(EXPIRY)
    (candidate,) = peer.roll_forward_candidates()
    assert (candidate.work_id, candidate.token) == (WORK, token)


# ---------------------------------------------------------------------------
# Group commit
# ---------------------------------------------------------------------------


def test_a_batch_fsyncs_each_directory_once_at_its_end(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    works = [f"work-{n}" for n in range(3)]
    tokens = [store.claim(work) for work in works]
    assert tokens == [1, 1, 1]
    fs.log = []

    def slot_fsyncs() -> list[str]:
        assert fs.log is not None
        return [call.path for call in fs.log if call.op is Op.FSYNC_DIR and "/slots" in call.path]

    with store.batch():
        for work in works:
            assert store.begin_commit(work, 1, RESULT) is CommitOutcome.COMMITTED
            # Decided (linked), not yet durable: nothing may act on it yet.
            assert fs.exists(slot_path(work, 2)) and not fs.durable_exists(slot_path(work, 2))
        assert slot_fsyncs() == []
    # Every item's slots share one directory: the batch fsyncs it once.
    assert slot_fsyncs() == [f"{ROOT}/slots"]
    assert all(fs.durable_exists(slot_path(work, 2)) for work in works)
    # The cached chains were current: no slot was read (the one shared result
    # object is read back once per later put, to verify what is at its name).
    assert not any(call.op is Op.READ and "/objects/" not in call.path for call in fs.log)
    with store.batch():
        for work in works:
            assert store.complete(work, 1) is CompleteOutcome.COMPLETED
    fs.crash("power")
    assert all(make_store(fs, clock).read(w).status is ItemStatus.DONE for w in works)


def test_a_power_loss_inside_a_batch_loses_what_it_published(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.KILL_BEFORE), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    with pytest.raises(SimulatedCrash), store.batch():
        assert store.claim(WORK) == 1
        assert not fs.durable_exists(slot_path(WORK, 1))
    fs.crash("power")  # the claim was never acted on: losing it is allowed
    fs.fault = None
    restarted = make_store(fs, clock, "coord")
    assert restarted.read(WORK).status is ItemStatus.FREE


def test_a_failed_batch_fsync_leaves_the_commit_to_be_settled_by_a_retry(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    token = store.claim(WORK)
    assert token is not None
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    with pytest.raises(OutcomeUnknown), store.batch():
        assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert not fs.durable_exists(slot_path(WORK, 2))
    fs.fault = None
    # Calling again finds our own pending commit and makes it durable.
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert fs.durable_exists(slot_path(WORK, 2))


def test_after_a_failed_batch_the_next_fsync_of_its_directory_settles_it(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    with pytest.raises(OutcomeUnknown), store.batch():
        assert store.claim(WORK) == 1  # slot 0 and the claim, neither durable
    fs.fault = None
    assert store.abandon(WORK, 1, sent=False) is AbandonOutcome.ABANDONED
    assert fs.durable_exists(slot_path(WORK, 2))
    # Nothing of ours is unknown any more: publications go by the cached chain.
    token = store.claim(WORK)
    assert token == 3
    fs.log = []
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert store.complete(WORK, token) is CompleteOutcome.COMPLETED
    assert not any(call.op is Op.READ for call in fs.log)


def test_a_batch_ended_by_an_error_still_fsyncs_and_batches_do_not_nest(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    with pytest.raises(ValueError), store.batch():
        assert store.claim(WORK) == 1
        raise ValueError("the caller failed")
    assert fs.durable_exists(slot_path(WORK, 1))
    with store.batch(), pytest.raises(RuntimeError, match="do not nest"), store.batch():
        pass


# ---------------------------------------------------------------------------
# Incarnations
# ---------------------------------------------------------------------------


def test_register_publishes_the_next_incarnation(fs: SimulatedFS, clock: SimulatedClock) -> None:
    assert [make_store(fs, clock, "coord").owner for _ in range(3)] == [
        Owner("coord", 1),
        Owner("coord", 2),
        Owner("coord", 3),
    ]
    assert make_store(fs, clock, "coord-b").owner == Owner("coord-b", 1)
    assert make_store(fs, clock).incarnations("coord") == [1, 2, 3]
    for n in (1, 2, 3):
        assert fs.durable_exists(f"{ROOT}/incarnations/coord.{n}")
    store = make_store(fs, clock, "coord")
    with pytest.raises(StoreError, match="already registered"):
        store.register("coord")


def test_register_survives_a_stale_listing_and_a_lost_reply(clock: SimulatedClock) -> None:
    inner = SimulatedFS()
    make_store(inner, clock, "coord")  # incarnation 1 exists
    plan = DiskFaultPlan(
        FaultRule(Fault(FaultKind.LOST_LINK_REPLY), op=Op.LINK, path_contains="coord.2"),
    )
    fs = FaultyFS(inner, plan)
    assert make_store(fs, clock, "coord").owner == Owner("coord", 2)
    assert len(plan.fired) == 1


@pytest.mark.parametrize(
    "bad",
    ["", "a" * 65, "a.b", "a/b", "../x", "a b", "é", "a\x00", "a\n", 7, None, b"ab"],
    ids=repr,
)
def test_invalid_coordinator_ids_are_refused(
    bad: object, fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock)
    with pytest.raises(InvalidCoordinatorId, match="coordinator id"):
        store.register(bad)  # type: ignore[arg-type]
    assert fs.total_calls == 0
    assert store.owner is None


def test_a_new_incarnation_takes_its_predecessors_claims_at_once(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    first = make_store(fs, clock, "coord")
    old_claim = first.claim("a")
    old_abandon = first.claim("b")
    old_commit = first.claim("c")
    assert old_claim == old_abandon == old_commit == 1
    assert first.begin_commit("c", 1, RESULT) is CommitOutcome.COMMITTED

    restarted = make_store(fs, clock, "coord")  # incarnation 2, no waiting for any TTL
    assert restarted.claim("a") == 2
    assert restarted.abandon("b", 1) is AbandonOutcome.ABANDONED  # may abandon them
    (candidate,) = restarted.roll_forward_candidates()  # and roll its commits forward
    assert (candidate.work_id, candidate.result) == ("c", RESULT)
    assert restarted.complete("c", 1) is CompleteOutcome.COMPLETED
    # The old incarnation, if it is still alive somewhere, is fenced out.
    assert first.begin_commit("a", 1, RESULT) is CommitOutcome.FENCED_OUT
    # Another coordinator still has to wait for expiry.
    other = make_store(fs, clock, "other")
    assert other.claim("a") is None


# ---------------------------------------------------------------------------
# Quarantine: lost claims counted from the chain
# ---------------------------------------------------------------------------


def test_quarantine_after_lost_claims_agreed_by_two_stores(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    a = make_store(fs, clock, "coord-a", quarantine_after=2)
    b = make_store(fs, clock, "coord-b", quarantine_after=2)
    token = a.claim(WORK)
    assert token is not None
    assert a.abandon(WORK, token) is AbandonOutcome.ABANDONED  # e.g. the send failed
    token = b.claim(WORK)
    assert token is not None
    assert b.abandon(WORK, token) is AbandonOutcome.ABANDONED
    assert a.read(WORK).lost_claims == b.read(WORK).lost_claims == 2

    result = a.try_claim(WORK)
    assert (result.outcome, result.quarantined_now, result.lost_claims) == (
        ClaimOutcome.QUARANTINED,
        True,
        2,
    )
    result = b.try_claim(WORK)
    assert (result.outcome, result.quarantined_now) == (ClaimOutcome.QUARANTINED, False)
    for store in (a, b):
        state = store.read(WORK)
        assert state.status is ItemStatus.QUARANTINED
        assert [s.work_id for s in store.quarantined()] == [WORK]
        clock.advance(100 * TTL)
        assert store.claim(WORK) is None


def test_taken_over_claims_count_as_lost(fs: SimulatedFS, clock: SimulatedClock) -> None:
    a = make_store(fs, clock, "coord-a", quarantine_after=2)
    b = make_store(fs, clock, "coord-b", quarantine_after=2)
    assert a.claim(WORK) == 1
    assert b.claim(WORK) is None
    clock.advance(EXPIRY)
    assert b.claim(WORK) == 2  # a's claim lost (1)
    assert a.claim(WORK) is None
    clock.advance(EXPIRY)
    result = a.try_claim(WORK)  # taking b's claim would be the 2nd loss: quarantine instead
    assert (result.outcome, result.quarantined_now) == (ClaimOutcome.QUARANTINED, True)
    assert b.begin_commit(WORK, 2, RESULT) is CommitOutcome.FENCED_OUT
    assert b.abandon(WORK, 2) is AbandonOutcome.TAKEN_OVER
    assert b.read(WORK).lost_claims == 2


def test_committed_claims_do_not_count_as_lost(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord", quarantine_after=1)
    for index in range(5):
        token = store.claim(f"item-{index}")
        assert token is not None
        store.begin_commit(f"item-{index}", token, RESULT)
        store.complete(f"item-{index}", token)
        assert store.read(f"item-{index}").lost_claims == 0


# ---------------------------------------------------------------------------
# Listing
# ---------------------------------------------------------------------------


def test_items_by_status(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord", quarantine_after=1)
    assert store.items() == []
    claimed = store.claim("claimed")
    assert claimed is not None
    abandoned = store.claim("abandoned")
    assert abandoned is not None
    store.abandon("abandoned", abandoned)
    for name in ("committing", "done"):
        token = store.claim(name)
        assert token is not None
        store.begin_commit(name, token, name.encode())
    store.complete("done", 1)
    quarantined = store.claim("quarantined")
    assert quarantined is not None
    store.abandon("quarantined", quarantined)
    assert store.try_claim("quarantined").quarantined_now

    grouped = store.items_by_status()
    assert set(grouped) == set(ItemStatus)
    names = {status: [s.work_id for s in states] for status, states in grouped.items()}
    assert names == {
        ItemStatus.FREE: [],
        ItemStatus.CLAIMED: ["claimed"],
        ItemStatus.ABANDONED: ["abandoned"],
        ItemStatus.COMMITTING: ["committing"],
        ItemStatus.DONE: ["done"],
        ItemStatus.QUARANTINED: ["quarantined"],
    }
    # "abandoned" was abandoned once; with quarantine_after=1 it is quarantined
    # only when someone next tries to claim it.
    assert store.read("abandoned").status is ItemStatus.ABANDONED
    assert [s.work_id for s in make_store(fs, clock).committing_items()] == ["committing"]
    assert {s.work_id for s in store.items()} == {
        "claimed",
        "abandoned",
        "committing",
        "done",
        "quarantined",
    }


# ---------------------------------------------------------------------------
# Ambiguous outcomes: lost replies, EIO, stale look-ups
# ---------------------------------------------------------------------------


def _lost_reply_at(slot: int) -> DiskFaultPlan:
    return DiskFaultPlan(
        FaultRule(Fault(FaultKind.LOST_LINK_REPLY), op=Op.LINK, path_contains=f"s.{slot:010d}")
    )


def test_a_lost_link_reply_is_resolved_by_the_nonce(clock: SimulatedClock) -> None:
    inner = SimulatedFS()
    fs = FaultyFS(inner)
    store = make_store(fs, clock, "coord")
    for slot, step in ((1, "claim"), (2, "commit"), (3, "complete")):
        plan = _lost_reply_at(slot)
        fs.fault = plan
        if step == "claim":
            assert store.claim(WORK) == 1
        elif step == "commit":
            assert store.begin_commit(WORK, 1, RESULT) is CommitOutcome.COMMITTED
        else:
            assert store.complete(WORK, 1) is CompleteOutcome.COMPLETED
        assert [fired.fault.kind for fired in plan.fired] == [FaultKind.LOST_LINK_REPLY]
        assert inner.durable_exists(slot_path(WORK, slot))
    assert store.read(WORK).status is ItemStatus.DONE


def test_a_lost_reply_on_the_simulated_disk_too(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    fs.fault = _lost_reply_at(1)
    assert store.claim(WORK) == 1
    fs.fault = _lost_reply_at(2)
    assert store.begin_commit(WORK, 1, RESULT) is CommitOutcome.COMMITTED


def test_eio_on_link_is_retried(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    plan = DiskFaultPlan(FaultRule(Fault(FaultKind.EIO), op=Op.LINK, nth=0, path_contains=".s."))
    fs.fault = plan
    assert store.claim(WORK) == 1
    assert len(plan.fired) == 1
    plan = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.LINK, nth=0, path_contains="s.0000000002"),
        FaultRule(Fault(FaultKind.ESTALE), op=Op.LINK, nth=1, path_contains="s.0000000002"),
    )
    fs.fault = plan
    assert store.begin_commit(WORK, 1, RESULT) is CommitOutcome.COMMITTED
    assert len(plan.fired) == 2


def test_an_unknown_commit_outcome_is_resolved_by_a_later_call(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    token = store.claim(WORK)
    assert token is not None
    # The link lands, but the directory never becomes durable: unknown.
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    with pytest.raises(OutcomeUnknown, match="begin_commit"):
        store.begin_commit(WORK, token, RESULT)
    assert not fs.durable_exists(slot_path(WORK, 2))
    # An abandon meanwhile must not discard it: it may be committed.
    assert store.abandon(WORK, token) is AbandonOutcome.ALREADY_COMMITTING
    fs.fault = None
    # Asking again finds our own record (our nonce) and makes it durable.
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    assert fs.durable_exists(slot_path(WORK, 2))
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.DUPLICATE


def test_an_unknown_claim_outcome_is_resolved_by_a_later_claim(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    store.claim("warm-up")  # directories exist
    plan = DiskFaultPlan(FaultRule(Fault(FaultKind.EIO), op=Op.LINK, path_contains="s.0000000001"))
    fs.fault = plan
    with pytest.raises(OutcomeUnknown, match="claim"):
        store.claim(WORK)
    assert not fs.exists(slot_path(WORK, 1))  # EIO without effect here
    fs.fault = None
    assert store.claim(WORK) == 1
    # A fsync failure after a landed link: the claim is reported only once durable.
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC_DIR, path_contains="/slots", nth=1)
    )
    # nth=0 is the fsync of slot 0; nth=1 the claim's fsync: retried, then fine.
    assert store.claim("other") == 1
    assert fs.durable_exists(slot_path("other", 1))


def test_enospc_before_any_link_is_a_plain_io_error(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    token = store.claim(WORK)
    assert token is not None
    fs.fault = DiskFaultPlan(FaultRule(Fault(FaultKind.ENOSPC), op=Op.WRITE_TEMP))
    with pytest.raises(StoreIOError, match="No space"):
        store.begin_commit(WORK, token, RESULT)
    fs.fault = None
    assert store.read(WORK).status is ItemStatus.CLAIMED
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED


def test_a_stale_absent_never_issues_a_token_twice(fs: SimulatedFS, clock: SimulatedClock) -> None:
    holder = make_store(fs, clock, "holder")
    late = make_store(fs, clock, "late")
    assert holder.claim(WORK) == 1
    # The late coordinator's look-ups of slot 1 say "absent" (a cached negative look-up).
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains="s.0000000001", nth=0),
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains="s.0000000001", nth=1),
    )
    result = late.try_claim(WORK)
    assert result.outcome is ClaimOutcome.LOST_RACE  # the link said EEXIST: it read on
    assert result.token is None
    state = late.read(WORK)
    assert (state.token, state.owner) == (1, Owner("holder", 1))


# ---------------------------------------------------------------------------
# Kills and power loss at every FS call of claim, begin_commit and complete
# ---------------------------------------------------------------------------


def _lifecycle(store: WorkStore, progress: dict[str, int]) -> None:
    token = store.claim(WORK)
    assert token is not None
    progress["issued"] = token
    assert store.heartbeat(WORK, token)
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    progress["committed"] = token
    assert store.complete(WORK, token) is CompleteOutcome.COMPLETED
    progress["completed"] = token


def _lifecycle_calls() -> int:
    fs = SimulatedFS()
    store = make_store(fs, SimulatedClock(), "coord")
    fs.reset_calls()
    _lifecycle(store, {})
    return fs.total_calls


@pytest.mark.parametrize("crash", ["power", "process"])
@pytest.mark.parametrize("kill", [FaultKind.KILL_BEFORE, FaultKind.KILL_AFTER])
def test_a_kill_at_every_call_never_issues_a_token_twice_nor_loses_a_commit(
    crash: str, kill: FaultKind
) -> None:
    total = _lifecycle_calls()
    assert total > 20
    for nth in range(total):
        fs = SimulatedFS(seed=nth)
        clock = SimulatedClock()
        first = make_store(fs, clock, "coord")
        plan = DiskFaultPlan(FaultRule(Fault(kill), nth=nth))
        fs.fault = plan
        progress: dict[str, int] = {}
        with pytest.raises(SimulatedCrash):
            _lifecycle(first, progress)
        assert len(plan.fired) == 1
        commit_was_durable = fs.durable_exists(slot_path(WORK, 2))
        fs.crash(crash)
        fs.fault = None
        where = f"{kill.value} at call {nth} ({plan.fired[0].op} {plan.fired[0].path}), {crash}"

        restarted = make_store(fs, clock, "coord")
        assert restarted.owner == Owner("coord", 2), where
        state = restarted.read(WORK)
        if "completed" in progress:
            assert state.status is ItemStatus.DONE, where
        if "committed" in progress or commit_was_durable:
            assert state.status in (ItemStatus.COMMITTING, ItemStatus.DONE), where
            assert state.token == progress.get("committed", 1), where
        if "issued" in progress:
            # The issued token's slot survived: nobody can publish that slot again.
            assert read_record(fs, WORK, progress["issued"]).owner == Owner("coord", 1), where
        if state.status in (ItemStatus.COMMITTING, ItemStatus.DONE):
            # Whatever commit survived, its result survived with it.
            assert restarted.stored_result(WORK) == RESULT, where

        # Drive the item to the end from the restarted incarnation.
        if state.status is ItemStatus.COMMITTING:
            if crash == "process":  # a kill keeps the marks: the cheap look finds it too
                found = restarted.roll_forward_candidates()
                assert [c.work_id for c in found] == [WORK], where
            (candidate,) = restarted.roll_forward_candidates(full=True)
            assert candidate.result == RESULT, where
            assert restarted.complete(WORK, candidate.token) is CompleteOutcome.COMPLETED
        elif state.status is not ItemStatus.DONE:
            token = restarted.claim(WORK)
            assert token is not None, where
            assert token > progress.get("issued", 0), where
            assert restarted.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
            assert restarted.complete(WORK, token) is CompleteOutcome.COMPLETED
        assert restarted.read(WORK).status is ItemStatus.DONE, where
        # And a third coordinator, after the power loss, agrees on every slot.
        observer = make_store(fs, clock)
        assert observer.read(WORK) == restarted.read(WORK), where


def test_power_loss_after_a_takeover_never_reissues_its_token(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    ghost = make_store(fs, clock, "ghost")
    victim = make_store(fs, clock, "victim")
    survivor = make_store(fs, clock, "survivor")
    assert ghost.claim(WORK) == 1
    assert victim.claim(WORK) is None and survivor.claim(WORK) is None
    clock.advance(EXPIRY)
    assert victim.claim(WORK) == 2  # issued: the machine may die right after
    fs.crash("power")
    survivor = make_store(fs, clock, "survivor")
    assert survivor.claim(WORK) is None
    clock.advance(EXPIRY)
    assert survivor.claim(WORK) == 3
    assert read_record(fs, WORK, 2).owner == Owner("victim", 1)
    assert survivor.read(WORK).lost_claims == 2


# ---------------------------------------------------------------------------
# Random schedules of three coordinators, with restarts and power losses
# ---------------------------------------------------------------------------

ACTIONS = [
    "claim",
    "heartbeat",
    "commit",
    "abandon",
    "complete",
    "roll",
    "wait",
    "restart",
    "power",
]


class _Schedule:
    """Three coordinators on one simulated disk, and what each believes."""

    def __init__(self) -> None:
        self.fs = SimulatedFS()
        self.time = SimulatedTime()
        self.clocks = [self.time.clock(monotonic_start=100.0 * i) for i in range(3)]
        self.stores = [self._start(i) for i in range(3)]
        self.held: list[int | None] = [None, None, None]
        self.issued: list[int] = []  # every token any coordinator was given, in order
        self.committed: int | None = None  # the token whose commit was acknowledged
        self.done = False

    def _start(self, who: int) -> WorkStore:
        return make_store(self.fs, self.clocks[who], f"coord-{who}", quarantine_after=4)

    def step(self, who: int, action: str) -> None:
        store, token = self.stores[who], self.held[who]
        if action == "claim":
            result = store.try_claim(WORK)
            if result.outcome is ClaimOutcome.CLAIMED:
                assert result.token is not None
                assert result.token not in self.issued, "a token was issued twice"
                assert not self.issued or result.token > self.issued[-1]
                self.issued.append(result.token)
                self.held[who] = result.token
        elif action == "heartbeat" and token is not None:
            store.heartbeat(WORK, token)
        elif action == "commit" and token is not None:
            outcome = store.begin_commit(WORK, token, b"result %d" % token)
            if outcome is CommitOutcome.COMMITTED:
                assert token == self.issued[-1], "a commit under a token that was not the head"
                assert self.committed in (None, token), "two commits of one item"
                self.committed = token
        elif action == "abandon" and token is not None:
            abandoned = store.abandon(WORK, token)
            if abandoned is AbandonOutcome.ABANDONED:
                assert token == self.issued[-1]
                assert self.committed != token
            self.held[who] = None
        elif action == "complete":
            state = store.read(WORK)
            if state.status is ItemStatus.COMMITTING:
                assert state.token is not None
                completed = store.complete(WORK, state.token)
                assert completed in (CompleteOutcome.COMPLETED, CompleteOutcome.ALREADY_DONE)
                self.done = True
        elif action == "roll":
            for candidate in store.roll_forward_candidates():
                assert candidate.token == self.committed
                assert candidate.result == b"result %d" % candidate.token
                store.complete(candidate.work_id, candidate.token)
                self.done = True
        elif action == "wait":
            self.time.advance(EXPIRY / 2)
        elif action == "restart":  # the coordinator process is killed and restarted
            self.fs.crash("process")
            self.stores[who] = self._start(who)
            self.held[who] = None
        elif action == "power":  # the machine loses power: every process restarts
            self.fs.crash("power")
            self.stores = [self._start(i) for i in range(3)]
            self.held = [None, None, None]
        self.check()

    def check(self) -> None:
        state = make_store(self.fs, self.clocks[0]).read(WORK)
        if self.committed is not None:
            assert state.status in (ItemStatus.COMMITTING, ItemStatus.DONE), state
            assert state.token == self.committed
            assert self.stores[0].stored_result(WORK) == b"result %d" % self.committed
        if self.done:
            assert state.status is ItemStatus.DONE
        if state.status is ItemStatus.CLAIMED:
            assert state.token == self.issued[-1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(ACTIONS)), min_size=5, max_size=80))
def test_random_schedules_keep_one_holder_per_token(steps: list[tuple[int, str]]) -> None:
    schedule = _Schedule()
    for who, action in steps:
        schedule.step(who, action)


# ---------------------------------------------------------------------------
# Hostile ids, corrupt and foreign records
# ---------------------------------------------------------------------------

HOSTILE_WORK_IDS = [
    "../x",
    "../../../../etc/passwd",
    "/absolute/path",
    "/",
    ".",
    "..",
    "a\x00b",
    "\x00",
    "x" * 10_000,
    "s.0000000001",
    "items/../../escape",
    "line\nbreak",
    "C:\\windows\\path",
    "é🎉",
    " ",
]


def _all_files(directory: Path) -> set[Path]:
    return {path for path in directory.rglob("*")}


def test_hostile_work_ids_never_become_paths(tmp_path: Path) -> None:
    root = tmp_path / "inside" / "store"
    clock = RealClock()
    store = WorkStore(RealFS(), str(root), clock, ttl=TTL, retry_pause=_no_pause)
    store.register("coord")
    other = WorkStore(RealFS(), str(root), clock, ttl=TTL, retry_pause=_no_pause)
    other.register("other")
    for work_id in HOSTILE_WORK_IDS:
        token = store.claim(work_id)
        assert token == 1, work_id
        assert store.heartbeat(work_id, token)
        assert store.begin_commit(work_id, token, work_id.encode()) is CommitOutcome.COMMITTED
        assert other.complete(work_id, token) is CompleteOutcome.COMPLETED
        state = other.read(work_id)
        assert (state.work_id, state.status) == (work_id, ItemStatus.DONE)
        assert other.stored_result(work_id) == work_id.encode()
    # Everything landed inside the store directory, under hashed names only.
    assert {path.name for path in (tmp_path).iterdir()} == {"inside"}
    assert {path.name for path in (tmp_path / "inside").iterdir()} == {"store"}
    assert sorted(p.name for p in root.iterdir()) == [
        "committing",
        "incarnations",
        "slots",  # small results ride in their commit records: no objects/
        "tmp",
    ]
    assert list((root / "committing").iterdir()) == []  # every mark went with its `done`
    # Four slots per item (first record, claim, commit, done), named by its key.
    slot_names = sorted(p.name for p in (root / "slots").iterdir())
    assert slot_names == sorted(
        f"{item_key(w)}.s.{slot:010d}" for w in HOSTILE_WORK_IDS for slot in range(4)
    )
    for path in _all_files(root):
        assert path.resolve().is_relative_to(root.resolve())
    assert {state.work_id for state in other.items()} == set(HOSTILE_WORK_IDS)


@pytest.mark.parametrize(
    "bad",
    [123, None, b"bytes", ["list"], 1.5, "", "\ud800lone surrogate", "y" * 70_000],
    ids=lambda value: repr(value)[:30],
)
def test_unusable_work_ids_are_refused_with_a_clear_error(
    bad: object, fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    fs.reset_calls()
    for call in (store.claim, store.read, store.stored_result):
        with pytest.raises(InvalidWorkId, match="invalid work id") as caught:
            call(bad)  # type: ignore[arg-type]
        assert isinstance(caught.value, ValueError)
        assert isinstance(caught.value, DispatchError)
    with pytest.raises(InvalidWorkId):
        store.begin_commit(bad, 1, RESULT)  # type: ignore[arg-type]
    assert fs.total_calls == 0
    assert len(str(InvalidWorkId("z" * 100_000, "too long"))) < 300


def test_the_work_id_size_limit_is_configurable(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord", max_work_id_bytes=16)
    assert store.claim("é" * 8) == 1  # 16 UTF-8 bytes
    with pytest.raises(InvalidWorkId, match="more than 16"):
        store.claim("é" * 9)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_any_text_work_id_stays_under_the_root(work_id: str) -> None:
    fs = SimulatedFS()
    fs.log = []
    store = make_store(fs, SimulatedClock(), "coord")
    if not work_id or any(0xD800 <= ord(c) <= 0xDFFF for c in work_id):
        with pytest.raises(InvalidWorkId):
            store.claim(work_id)
        return
    token = store.claim(work_id)
    assert token == 1
    assert store.begin_commit(work_id, token, b"r") is CommitOutcome.COMMITTED
    assert store.read(work_id).work_id == work_id
    for call in fs.log:
        assert call.path.startswith(ROOT + "/") or call.path in (ROOT, "/shared"), call
        assert "\x00" not in call.path


def test_a_corrupt_slot_is_a_clear_error(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    assert store.claim(WORK) == 1
    good = fs.read(slot_path(WORK, 1))
    corruptions = {
        "checksum mismatch": good.replace(b'"claim"', b'"abandon"'),
        "torn": good[:-5],
        "not a dispatchtx record": b"garbage\n",
        "unparsable": good.split(b" ")[0] + b" " + _checksum(b"{nope") + b" {nope\n",
        "fields": _reencode(good, extra={"surprise": 1}),
        "'token'": _reencode(good, replace={"token": True}),
        "unknown change": _reencode(good, replace={"change": "steal"}),
        "nonce": _reencode(good, replace={"nonce": "NOT-HEX"}),
        "owner": _reencode(good, replace={"owner": "../evil"}),
        "version": _reencode(good, replace={"v": 2}),
        # A checksum is no MAC: a planted record may nest deeper than json recurses.
        "nested too deep": good.split(b" ")[0]
        + b" "
        + _checksum(b"[" * 100_000 + b"]" * 100_000)
        + b" "
        + b"[" * 100_000
        + b"]" * 100_000
        + b"\n",
    }
    for reason, data in corruptions.items():
        _replace(fs, slot_path(WORK, 1), data)
        fresh = make_store(fs, clock)  # no cache
        with pytest.raises(CorruptRecord, match=reason):
            fresh.read(WORK)
    _replace(fs, slot_path(WORK, 1), good)
    assert make_store(fs, clock).read(WORK).status is ItemStatus.CLAIMED


def test_a_foreign_record_is_a_clear_error(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    assert store.claim("first") == 1
    store.abandon("first", 1)
    assert store.claim("second") == 1
    originals = {slot: fs.read(slot_path("first", slot)) for slot in (0, 1)}
    cases = [
        # A claim of another item, copied in as this item's slot.
        (1, fs.read(slot_path("second", 1)), "foreign record: it belongs to item"),
        # A record of this item, but of another slot.
        (1, fs.read(slot_path("first", 2)), "foreign record: it was written as slot 2"),
        # The first record of another item: it names another work id.
        (0, fs.read(slot_path("second", 0)), "foreign record: it belongs to item"),
    ]
    for slot, data, message in cases:
        _replace(fs, slot_path("first", slot), data)
        with pytest.raises(CorruptRecord, match=message):
            make_store(fs, clock).read("first")
        _replace(fs, slot_path("first", slot), originals[slot])
    assert make_store(fs, clock).read("first").status is ItemStatus.ABANDONED


def test_a_missing_first_record_is_retried_then_corrupt(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    assert store.claim(WORK) == 1
    # A stale "absent" for slot 0 is read again: slot 1 proves slot 0 exists.
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains="s.0000000000", nth=0)
    )
    assert make_store(fs, clock).read(WORK).status is ItemStatus.CLAIMED
    fs.fault = None
    fs.unlink(slot_path(WORK, 0))
    with pytest.raises(CorruptRecord, match="no first record"):
        make_store(fs, clock).read(WORK)


def test_store_parameters_are_checked(fs: SimulatedFS, clock: SimulatedClock) -> None:
    for bad in ({"ttl": 0.0}, {"ttl": 1.0, "margin": -1.0}, {"ttl": 1.0, "quarantine_after": 0}):
        with pytest.raises(ValueError):
            WorkStore(fs, ROOT, clock, **bad)  # type: ignore[arg-type]
    store = WorkStore(fs, ROOT, clock, ttl=2.0)
    assert (store.ttl, store.margin, store.quarantine_after) == (2.0, 0.5, 3)


def test_a_chain_that_breaks_the_rules_is_corrupt(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    assert store.claim(WORK) == 1
    key = item_key(WORK)
    # A well-formed, checksummed record that no correct publisher writes: a
    # `done` with no commit before it.
    bogus = Record(key, 2, Change.DONE, 1, Owner("coord", 1), "0" * 32)
    _replace(fs, slot_path(WORK, 2), bogus.encode())
    with pytest.raises(CorruptRecord, match="cannot follow"):
        make_store(fs, clock).read(WORK)


def _checksum(body: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(body).hexdigest().encode()


def _reencode(
    good: bytes, *, extra: dict[str, object] | None = None, replace: dict[str, object] | None = None
) -> bytes:
    import json

    magic, _, body = good.rstrip(b"\n").split(b" ", 2)
    fields = json.loads(body)
    fields.update(extra or {})
    fields.update(replace or {})
    new_body = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return b" ".join((magic, _checksum(new_body), new_body)) + b"\n"


def _replace(fs: SimulatedFS, path: str, data: bytes) -> None:
    """Overwrite a slot behind the store's back (to test what it reads)."""
    if fs.exists(path):
        fs.unlink(path)
    temp = fs.write_temp(f"{ROOT}/tmp", data)
    fs.link(temp, path)
    fs.unlink(temp)


# ---------------------------------------------------------------------------
# Real processes on the real filesystem
# ---------------------------------------------------------------------------

RACERS = 8
RACE_ROUNDS = 200
RACE_TTL = 0.002


def _mp_context() -> ForkContext | SpawnContext:
    """fork where there is one (fast to start), else spawn."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _race_worker(roots: list[str], index: int, rounds: int, barrier: Any, queue: Any) -> None:
    """One coordinator process: per round, race the others to claim a fresh
    item, then (its holder silent) race again to take the claim over."""
    store = WorkStore(RealFS(), roots[index % len(roots)], RealClock(), ttl=RACE_TTL, margin=0.0)
    store.register(f"racer-{index}")
    outcomes = []
    for round_ in range(rounds):
        work_id = f"round-{round_}"
        barrier.wait(timeout=60)
        first = store.try_claim(work_id)  # a loser's look also starts its watch
        time.sleep(RACE_TTL * 1.5)
        barrier.wait(timeout=60)
        second = store.try_claim(work_id)
        outcomes.append(
            (round_, first.outcome.value, first.token, second.outcome.value, second.token)
        )
    queue.put((index, outcomes))


def _run_race(roots: list[str], rounds: int) -> dict[int, list[tuple[Any, ...]]]:
    context = _mp_context()
    barrier = context.Barrier(RACERS)
    queue = context.Queue()
    processes = [
        context.Process(target=_race_worker, args=(roots, index, rounds, barrier, queue))
        for index in range(RACERS)
    ]
    for process in processes:
        process.start()
    try:
        results = dict(queue.get(timeout=120) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in processes)
    return results


def _check_race(results: dict[int, list[tuple[Any, ...]]], root: str, rounds: int) -> None:
    for round_ in range(rounds):
        rows = [results[index][round_] for index in range(RACERS)]
        fresh = [i for i, row in enumerate(rows) if row[1] == "claimed"]
        takeover = [i for i, row in enumerate(rows) if row[3] == "claimed"]
        # Exactly one holder per token, and the race always has a winner.
        assert len(fresh) == 1, (round_, rows)
        assert len(takeover) == 1, (round_, rows)
        assert rows[fresh[0]][2] == 1 and rows[takeover[0]][4] == 2
        assert takeover[0] != fresh[0]
        tokens: Counter[int] = Counter(row[2] for row in rows if row[1] == "claimed")
        tokens.update(row[4] for row in rows if row[3] == "claimed")
        assert all(count == 1 for count in tokens.values())
        # The chain on disk names the same winners.
        work_id = f"round-{round_}"
        fs = RealFS()
        assert read_record(fs, work_id, 1, root).owner == Owner(f"racer-{fresh[0]}", 1)
        assert read_record(fs, work_id, 2, root).owner == Owner(f"racer-{takeover[0]}", 1)
        assert not fs.exists(slot_path(work_id, 3, root))


def test_eight_processes_race_to_claim_one_item(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    started = time.monotonic()
    results = _run_race([root], RACE_ROUNDS)
    elapsed = time.monotonic() - started
    _check_race(results, root, RACE_ROUNDS)
    # The processes really raced: many lost at the link itself (EEXIST), not
    # only by reading a claim that was already there.
    lost_at_link = Counter(
        phase
        for rows in results.values()
        for row in rows
        for phase in (1, 3)
        if row[phase] == "lost race"
    )
    print(
        f"\n{RACERS} processes x {RACE_ROUNDS} rounds x 2 races: {elapsed:.2f} s; "
        f"lost at the link: {lost_at_link[1]} fresh, {lost_at_link[3]} takeover"
    )
    assert lost_at_link[1] > 0 and lost_at_link[3] > 0
    assert elapsed < 60


def _nfs_mounts() -> list[str] | None:
    """Two NFS mounts of ONE export, from DISPATCHTX_NFS_MOUNTS="dirA:dirB"."""
    configured = os.environ.get("DISPATCHTX_NFS_MOUNTS", "")
    mounts = [path for path in configured.split(":") if path]
    return mounts if len(mounts) == 2 else None


def test_eight_processes_race_over_two_nfs_mounts() -> None:
    try:
        with open("/proc/filesystems") as listing:
            kernel_has_nfs = any(line.split()[-1:] == ["nfs"] for line in listing)
    except OSError:
        kernel_has_nfs = False
    if not kernel_has_nfs:
        pytest.skip("this kernel has no NFS client (no 'nfs' in /proc/filesystems)")
    mounts = _nfs_mounts()
    if mounts is None:
        pytest.skip(
            "set DISPATCHTX_NFS_MOUNTS=dirA:dirB to two NFS mounts of one export "
            "(as filelock's CI does) to race over NFS"
        )
    subdir = f"dispatchtx-race-{os.getpid()}-{time.time_ns()}"
    roots = [os.path.join(mount, subdir) for mount in mounts]
    results = _run_race(roots, 50)
    _check_race(results, roots[0], 50)


def _paused_holder(root: str, ttl: float, connection: Connection) -> None:
    store = WorkStore(RealFS(), root, RealClock(), ttl=ttl, margin=ttl / 2)
    store.register("holder")
    token = store.claim(WORK)
    connection.send(token)
    assert token is not None
    while not connection.poll(ttl / 5):  # heartbeat until told to go on
        store.heartbeat(WORK, token)
    connection.recv()
    alive = store.heartbeat(WORK, token)
    outcome = store.begin_commit(WORK, token, b"result after the pause")
    connection.send((alive, outcome.value))


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_sigstopped_holder_resumes_and_is_fenced_out(tmp_path: Path) -> None:
    ttl = 0.1
    root = str(tmp_path / "store")
    context = _mp_context()
    ours, theirs = context.Pipe()
    holder = context.Process(target=_paused_holder, args=(root, ttl, theirs))
    holder.start()
    try:
        assert ours.poll(30)
        assert ours.recv() == 1
        claimer = WorkStore(RealFS(), root, RealClock(), ttl=ttl, margin=ttl / 2)
        claimer.register("claimer")
        for _ in range(4):  # a live holder keeps its claim
            assert claimer.try_claim(WORK).outcome is ClaimOutcome.BUSY
            time.sleep(ttl / 2)
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGSTOP)
        token = None
        deadline = time.monotonic() + 10
        while token is None and time.monotonic() < deadline:
            token = claimer.claim(WORK)
            time.sleep(ttl / 4)
        assert token == 2
        ours.send("go on")
        os.kill(holder.pid, signal.SIGCONT)
        assert ours.poll(30)
        alive, outcome = ours.recv()
        assert (alive, outcome) == (False, CommitOutcome.FENCED_OUT.value)
        assert claimer.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    finally:
        if holder.pid is not None and holder.is_alive():
            os.kill(holder.pid, signal.SIGCONT)
        holder.join(timeout=10)
        if holder.is_alive():
            holder.kill()
    assert holder.exitcode == 0


def test_a_stale_absent_heartbeat_read_does_not_restart_the_watch(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    """Found by the simulator: a dead holder's claim was never taken over,
    because every stale "absent" look-up of its counter looked like a beat."""
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    assert holder.claim(WORK) == 1
    assert claimer.try_claim(WORK).outcome is ClaimOutcome.BUSY  # the watch starts
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains=".hb.")
    )
    clock.advance(EXPIRY / 2)
    assert claimer.try_claim(WORK).outcome is ClaimOutcome.BUSY  # reads "absent": no beat
    fs.fault = None
    clock.advance(EXPIRY / 2)
    result = claimer.try_claim(WORK)
    assert (result.outcome, result.token) == (ClaimOutcome.CLAIMED, 2)


def _three_stalled_commits(
    fs: SimulatedFS, clock: SimulatedClock
) -> tuple[WorkStore, dict[str, int]]:
    """Three items a stalled owner left COMMITTING, and a recoverer whose
    watch has seen the owner stand still."""
    owner = make_store(fs, clock, "owner")
    tokens = {}
    for work_id in ("bad", "good-1", "good-2"):
        token = owner.claim(work_id)
        assert token is not None
        # Too large to ride in the commit record: stored as an object.
        result = f"{work_id} result".encode().ljust(INLINE_RESULT_BYTES + 1, b".")
        assert owner.begin_commit(work_id, token, result) is CommitOutcome.COMMITTED
        tokens[work_id] = token
    recoverer = make_store(fs, clock, "recoverer")
    assert recoverer.roll_forward_candidates() == []  # the first look starts the watch
    clock.advance(EXPIRY + TTL)
    return recoverer, tokens


def test_a_rotted_result_object_does_not_hold_up_the_other_roll_forwards(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    recoverer, _ = _three_stalled_commits(fs, clock)
    object_id = recoverer.read("bad").object_id
    assert object_id is not None
    fs.pwrite(recoverer.objects.path_of(object_id), 0, b"rotted!!")
    candidates = recoverer.roll_forward_candidates()
    assert sorted(c.work_id for c in candidates) == ["good-1", "good-2"]
    (aside,) = recoverer.set_aside
    assert aside.work_id == "bad" and aside.key == item_key("bad")
    assert object_id in aside.reason
    # Reported once: later looks skip it and still find the others.
    assert sorted(c.work_id for c in recoverer.roll_forward_candidates()) == ["good-1", "good-2"]
    assert len(recoverer.set_aside) == 1
    assert recoverer.read("bad").status is ItemStatus.COMMITTING  # never completed untriaged


def test_a_missing_result_object_is_skipped_for_one_look_only(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    recoverer, _ = _three_stalled_commits(fs, clock)
    object_id = recoverer.read("bad").object_id
    assert object_id is not None
    path = recoverer.objects.path_of(object_id)
    content = fs.read(path)
    fs.unlink(path)
    assert sorted(c.work_id for c in recoverer.roll_forward_candidates()) == ["good-1", "good-2"]
    assert list(recoverer.deferred_in_last_look) == [item_key("bad")]
    assert recoverer.set_aside == []  # "absent" may be a stale look-up: no verdict
    fs.pwrite(path, 0, content)  # it shows up again
    assert sorted(c.work_id for c in recoverer.roll_forward_candidates()) == [
        "bad",
        "good-1",
        "good-2",
    ]


def _fresh_recoverer(fs: SimulatedFS, clock: SimulatedClock) -> WorkStore:
    """A coordinator that starts now (nothing cached) and has watched the
    stalled owner for long enough."""
    fresh = make_store(fs, clock, "fresh")
    fresh.roll_forward_candidates(full=True)
    clock.advance(EXPIRY + TTL)
    return fresh


def test_a_garbled_commit_slot_does_not_hold_up_the_other_roll_forwards(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    _, tokens = _three_stalled_commits(fs, clock)
    fs.pwrite(slot_path("bad", tokens["bad"] + 1), 0, b"garbled garbled garbled\n")
    recoverer = _fresh_recoverer(fs, clock)
    assert sorted(c.work_id for c in recoverer.roll_forward_candidates()) == ["good-1", "good-2"]
    (aside,) = recoverer.set_aside
    assert aside.key == item_key("bad")
    survey = recoverer.survey()
    assert item_key("bad") in survey.unreadable
    assert sorted(s.work_id for s in survey.states) == ["good-1", "good-2"]


def test_a_missing_first_slot_does_not_hold_up_the_other_roll_forwards(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    _three_stalled_commits(fs, clock)
    fs.unlink(slot_path("bad", 0))
    recoverer = _fresh_recoverer(fs, clock)
    # Its "maybe committing" mark is a second name of that first record: the
    # committed result is still rolled forward, the others too.
    assert sorted(c.work_id for c in recoverer.roll_forward_candidates()) == [
        "bad",
        "good-1",
        "good-2",
    ]
    assert recoverer.set_aside == []


def _first_record_and_mark(key: str) -> tuple[str, str]:
    """The two names an item's work id can be read from (for fault rules)."""
    return f"{key}.s.0000000000", f"committing/{key}"


def test_a_first_record_and_a_mark_both_read_as_absent_for_a_while_are_read_again(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    _three_stalled_commits(fs, clock)
    recoverer = make_store(fs, clock, "fresh")  # nothing cached: it reads both names
    key = item_key("bad")
    # A cached negative look-up of both names, for three reads each: a
    # stale "absent" is no proof, so the item is neither skipped nor set aside.
    plan = DiskFaultPlan(
        *(
            FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains=name, nth=n)
            for name in _first_record_and_mark(key)
            for n in range(3)
        )
    )
    fs.fault = plan
    assert recoverer.roll_forward_candidates() == []  # the first look starts the watch
    fs.fault = None
    assert len(plan.fired) == 6
    assert recoverer.set_aside == []
    clock.advance(EXPIRY + TTL)
    candidates = recoverer.roll_forward_candidates()
    assert sorted(c.work_id for c in candidates) == ["bad", "good-1", "good-2"]


def test_a_marked_item_whose_names_stay_absent_is_set_aside_after_its_reads(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    _three_stalled_commits(fs, clock)
    recoverer = make_store(fs, clock, "fresh")  # nothing cached: it reads both names
    key = item_key("bad")
    plan = DiskFaultPlan(
        *(
            FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ, path_contains=name)
            for name in _first_record_and_mark(key)
        )
    )
    fs.fault = plan
    assert recoverer.roll_forward_candidates() == []  # the first look starts the watch
    fs.fault = None
    (aside,) = recoverer.set_aside
    assert aside.key == key and "missing" in aside.reason
    assert len(plan.fired) >= 2 * 20  # both names read at every one of its attempts


def test_a_marked_item_that_cannot_be_identified_is_set_aside_not_skipped(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    _three_stalled_commits(fs, clock)
    fs.unlink(slot_path("bad", 0))
    fs.unlink(f"{ROOT}/committing/{item_key('bad')}")
    fs.link(slot_path("good-1", 0), f"{ROOT}/committing/{item_key('bad')}")  # a foreign mark
    recoverer = _fresh_recoverer(fs, clock)
    assert sorted(c.work_id for c in recoverer.roll_forward_candidates()) == ["good-1", "good-2"]
    (aside,) = recoverer.set_aside
    assert aside.key == item_key("bad") and aside.work_id is None


# ---------------------------------------------------------------------------
# Limits: what a store accepts stays readable, junk locks nobody out
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "junk_name",
    [f"coord.{10**30}", f"coord.{MAX_INCARNATION + 1}", "coord.5"],
    ids=["huge number", "past the range", "junk content"],
)
def test_a_junk_incarnation_name_locks_no_coordinator_out(
    junk_name: str, fs: SimulatedFS, clock: SimulatedClock
) -> None:
    make_store(fs, clock, "other")  # lays out the incarnations directory
    fs.write_temp(f"{ROOT}/incarnations", b"not a registration")
    (temp,) = [n for n in fs.listdir(f"{ROOT}/incarnations") if not n.startswith("other")]
    fs.rename(f"{ROOT}/incarnations/{temp}", f"{ROOT}/incarnations/{junk_name}")
    owners = [make_store(fs, clock, "coord").owner for _ in range(6)]
    expected = [1, 2, 3, 4, 6, 7] if junk_name == "coord.5" else [1, 2, 3, 4, 5, 6]
    assert owners == [Owner("coord", n) for n in expected]


def test_a_coordinator_id_out_of_incarnations_is_refused(
    fs: SimulatedFS, clock: SimulatedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dispatchtx.store.claims.MAX_INCARNATION", 2)
    assert [make_store(fs, clock, "coord").owner for _ in range(2)] == [
        Owner("coord", 1),
        Owner("coord", 2),
    ]
    with pytest.raises(StoreError, match="used all 2 incarnations"):
        make_store(fs, clock, "coord")
    assert make_store(fs, clock, "other").owner == Owner("other", 1)


def test_a_work_id_limit_past_what_a_record_holds_is_refused(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    with pytest.raises(ValueError, match="max_work_id_bytes"):
        make_store(fs, clock, max_work_id_bytes=MAX_WORK_ID_BYTES_LIMIT + 1)
    # At the limit, the worst id (every byte escaped sixfold) stays readable.
    store = make_store(fs, clock, "coord", max_work_id_bytes=MAX_WORK_ID_BYTES_LIMIT)
    work_id = "\x01" * MAX_WORK_ID_BYTES_LIMIT
    token = store.claim(work_id)
    assert token == 1
    assert store.begin_commit(work_id, token, RESULT) is CommitOutcome.COMMITTED
    assert store.read(work_id).status is ItemStatus.COMMITTING
    later = make_store(fs, clock, "later", max_work_id_bytes=MAX_WORK_ID_BYTES_LIMIT)
    assert later.read(work_id).token == 1


def _counters(fs: SimulatedFS, work_id: str = WORK) -> list[str]:
    """The heartbeat counters of `work_id`, by their names after the key."""
    prefix = f"{item_key(work_id)}."
    if not fs.exists(f"{ROOT}/slots"):
        return []
    names = fs.listdir(f"{ROOT}/slots")
    return sorted(name.removeprefix(prefix) for name in names if name.startswith(prefix + "hb."))


def test_a_claim_that_loses_its_slot_to_an_abandon_leaves_no_counter(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    assert holder.claim(WORK) == 1
    assert claimer.claim(WORK, now=0.0) is None

    def abandon_first(op: Op, path: str) -> None:
        # The holder abandons between the claimer's counter and its link.
        if op is Op.LINK and path.endswith(".s.0000000002"):
            fs.fault = None
            assert holder.abandon(WORK, 1) is AbandonOutcome.ABANDONED

    fs.fault = abandon_first
    assert claimer.claim(WORK, now=EXPIRY) == 3  # lost slot 2, claimed the free item
    assert _counters(fs) == ["hb.0000000003"]


def test_a_beat_racing_a_takeover_does_not_bring_its_counter_back(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    holder = make_store(fs, clock, "holder")
    claimer = make_store(fs, clock, "claimer")
    assert holder.claim(WORK) == 1
    assert claimer.claim(WORK, now=0.0) is None

    def take_over_first(op: Op, path: str) -> None:
        # The holder has read its chain; the takeover lands before its write.
        if op is Op.PWRITE and path.endswith(".hb.0000000001"):
            fs.fault = None
            assert claimer.claim(WORK, now=EXPIRY) == 2

    fs.fault = take_over_first
    assert not holder.heartbeat(WORK, 1)
    assert _counters(fs) == ["hb.0000000002"]


def test_a_lost_counter_of_a_live_claim_is_written_again(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    holder = make_store(fs, clock, "holder")
    assert holder.claim(WORK) == 1
    fs.unlink(f"{ROOT}/slots/{item_key(WORK)}.hb.0000000001")  # as a power loss may
    assert holder.heartbeat(WORK, 1)
    assert _counters(fs) == ["hb.0000000001"]


def test_a_store_of_the_older_per_item_layout_is_refused_and_left_as_it_was(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    fs.mkdir(f"{ROOT}/items/{item_key(WORK)}")
    fs.pwrite(f"{ROOT}/items/{item_key(WORK)}/s.0000000001", 0, b"an old claim\n")
    store = WorkStore(fs, ROOT, clock, ttl=TTL)
    with pytest.raises(StoreError, match="older per-item layout"):
        store.register("coord")
    assert store.owner is None
    assert not fs.exists(f"{ROOT}/incarnations")  # nothing written beside it
    assert fs.read(f"{ROOT}/items/{item_key(WORK)}/s.0000000001") == b"an old claim\n"


def test_a_small_result_rides_in_its_commit_record(fs: SimulatedFS, clock: SimulatedClock) -> None:
    store = make_store(fs, clock, "coord")
    warm_up = store.claim("warm-up")  # the first commit also makes committing/ durable
    assert warm_up is not None and store.begin_commit("warm-up", warm_up, b"")
    token = store.claim(WORK)
    assert token is not None
    fs.log = []
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    ops = [call.op for call in fs.log]
    # One file written (and fsynced by write_temp), one directory fsync.
    assert (ops.count(Op.WRITE_TEMP), ops.count(Op.FSYNC_DIR)) == (1, 1)
    assert not fs.exists(f"{ROOT}/objects")
    record = read_record(fs, WORK, token + 1)
    assert (record.result, record.object_id) == (RESULT, object_id_of(RESULT))
    # Another coordinator reads it from the record, and rolls it forward.
    peer = make_store(fs, clock, "peer")
    assert peer.stored_result(WORK) == RESULT
    fs.crash("power")
    assert make_store(fs, clock, "coord").stored_result(WORK) == RESULT


def test_a_result_past_the_inline_limit_is_stored_as_an_object_first(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    large = b"x" * (INLINE_RESULT_BYTES + 1)
    token = store.claim(WORK)
    assert token is not None
    assert store.begin_commit(WORK, token, large) is CommitOutcome.COMMITTED
    record = read_record(fs, WORK, token + 1)
    assert record.result is None and fs.durable_exists(store.objects.path_of(object_id_of(large)))
    assert make_store(fs, clock, "peer").stored_result(WORK) == large
    exact = b"y" * INLINE_RESULT_BYTES
    token = store.claim("exact")
    assert token is not None
    assert store.begin_commit("exact", token, exact) is CommitOutcome.COMMITTED
    assert read_record(fs, "exact", token + 1).result == exact


def test_an_inline_result_that_does_not_match_its_digest_is_a_corrupt_object(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    token = store.claim(WORK)
    assert token is not None
    assert store.begin_commit(WORK, token, RESULT) is CommitOutcome.COMMITTED
    record = read_record(fs, WORK, token + 1)
    # A well-formed record (its checksum is right) whose result is not the one named.
    forged = dataclasses.replace(record, result=b"X" * len(RESULT))
    fs.pwrite(slot_path(WORK, token + 1), 0, forged.encode())
    with pytest.raises(CorruptObject, match="hashes to"):
        make_store(fs, clock, "peer").stored_result(WORK)
    wrong_size = dataclasses.replace(record, result=RESULT + b"!")
    fs.pwrite(slot_path(WORK, token + 1), 0, wrong_size.encode())
    with pytest.raises(CorruptRecord, match="size"):
        make_store(fs, clock, "other").read(WORK)


def _claimed(store: WorkStore, works: list[str]) -> list[tuple[str, int, bytes]]:
    commits = []
    for work in works:
        token = store.claim(work)
        assert token is not None
        commits.append((work, token, f"result of {work}".encode()))
    return commits


def test_a_group_of_commits_is_one_file_and_one_directory_fsync(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    store.begin_commit_many(_claimed(store, ["warm-up"]))  # committing/ made durable
    commits = _claimed(store, [f"work-{n}" for n in range(5)])
    fs.log = []
    assert store.begin_commit_many(commits) == [CommitOutcome.COMMITTED] * 5
    ops = [call.op for call in fs.log]
    assert (ops.count(Op.WRITE_TEMP), ops.count(Op.FSYNC_DIR), ops.count(Op.LINK)) == (1, 1, 10)
    assert fs.listdir(f"{ROOT}/tmp") == []  # the group's temp is gone
    # Each slot is the group's file; a fresh store finds its own record in it.
    fresh = make_store(fs, clock, "fresh")
    for work, token, result in commits:
        assert fs.durable_exists(slot_path(work, token + 1))
        assert fs.read(slot_path(work, token + 1)).count(b"\n") == 5
        assert fresh.read(work).status is ItemStatus.COMMITTING
        assert fresh.stored_result(work) == result
        assert store.complete(work, token) is CompleteOutcome.COMPLETED


def test_one_commit_of_a_group_fenced_out_or_invalid_stops_no_other(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    rival = make_store(fs, clock, "rival")
    commits = _claimed(store, ["a", "b", "c"])
    # Between the claims and the group: b's claim is taken over and b committed.
    assert rival.claim("b", now=0.0) is None
    token_b = rival.claim("b", now=EXPIRY)
    assert token_b is not None
    assert rival.begin_commit("b", token_b, b"rival's") is CommitOutcome.COMMITTED
    outcomes = store.begin_commit_many([*commits, ("a", 99, b"no such claim"), ("d", 1, b"x")])
    assert outcomes[0] is CommitOutcome.COMMITTED and outcomes[2] is CommitOutcome.COMMITTED
    assert outcomes[1] is CommitOutcome.FENCED_OUT
    assert isinstance(outcomes[3], InvalidToken) and isinstance(outcomes[4], InvalidToken)
    assert rival.stored_result("b") == b"rival's"


def test_a_group_that_races_a_link_learns_from_the_slot(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    commits = _claimed(store, ["a", "b"])
    rival = make_store(fs, clock, "rival")
    # The rival takes b over (its counter stood still). Our cached chain still
    # shows our claim at the head, so the group's link of b meets the rival's
    # claim: EEXIST, and the slot read back decides.
    assert rival.claim("b", now=0.0) is None
    token = rival.claim("b", now=EXPIRY)
    assert token == 2
    outcomes = store.begin_commit_many(commits)
    assert outcomes == [CommitOutcome.COMMITTED, CommitOutcome.FENCED_OUT]
    assert store.read("b").owner == Owner("rival", 1)


def test_the_same_item_twice_in_a_group_is_committed_once(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    (commit,) = _claimed(store, [WORK])
    outcomes = store.begin_commit_many([commit, commit])
    assert outcomes == [CommitOutcome.COMMITTED, CommitOutcome.DUPLICATE]
    assert len(store.history(WORK)) == 2


def test_a_power_loss_before_a_groups_fsync_loses_all_of_it_and_acts_on_none(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    commits = _claimed(store, ["a", "b", "c"])
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.KILL_BEFORE), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    with pytest.raises(SimulatedCrash):
        store.begin_commit_many(commits)
    fs.crash("power")
    fs.fault = None
    restarted = make_store(fs, clock, "coord")
    assert {restarted.read(work).status for work, _, _ in commits} == {ItemStatus.CLAIMED}


def test_a_groups_fsync_that_keeps_failing_leaves_each_commit_to_be_settled(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    commits = _claimed(store, ["a", "b"])
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    outcomes = store.begin_commit_many(commits)
    assert all(isinstance(outcome, OutcomeUnknown) for outcome in outcomes)
    fs.fault = None
    for work, token, result in commits:  # calling again settles each: ours, durable
        assert store.begin_commit(work, token, result) is CommitOutcome.COMMITTED
        assert fs.durable_exists(slot_path(work, token + 1))


def test_a_group_file_without_the_slots_record_is_corrupt(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    commits = _claimed(store, ["a", "b"])
    assert store.begin_commit_many(commits) == [CommitOutcome.COMMITTED] * 2
    group_file = fs.read(slot_path("a", 2))
    # b's slot made to hold the group's bytes without b's line: foreign.
    fs.unlink(slot_path("b", 2))
    key_a = item_key("a").encode()
    only_a = b"".join(line + b"\n" for line in group_file.split(b"\n") if key_a in line)
    only_a += only_a  # two lines, both a's
    fs.pwrite(slot_path("b", 2), 0, only_a)
    with pytest.raises(CorruptRecord, match="holds no slot 2 of this item"):
        make_store(fs, clock, "fresh").read("b")


def test_a_group_of_claims_of_new_items_is_one_file_and_one_directory_fsync(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    store.claim("warm-up")  # slots/ made durable
    works = [f"work-{n}" for n in range(4)]
    fs.log = []
    results = store.claim_many(works)
    assert [r.outcome for r in results if isinstance(r, ClaimResult)] == [ClaimOutcome.CLAIMED] * 4
    ops = [call.op for call in fs.log]
    # Per item: its counter (pwrite) and two links (first record, claim).
    assert (ops.count(Op.WRITE_TEMP), ops.count(Op.FSYNC_DIR), ops.count(Op.LINK)) == (1, 1, 8)
    assert ops.count(Op.PWRITE) == 4
    fresh = make_store(fs, clock, "fresh")
    for work in works:
        assert fs.durable_exists(slot_path(work, 0)) and fs.durable_exists(slot_path(work, 1))
        assert fresh.read(work).status is ItemStatus.CLAIMED
        # Its owner's next try_claim adopts it: the same token.
        again = store.try_claim(work)
        assert (again.outcome, again.token) == (ClaimOutcome.ALREADY_HELD, 1)
    assert _counters(fs, "work-0") == ["hb.0000000001"]


def test_a_claim_made_ahead_in_the_batch_is_adopted_without_reading_its_slots(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    # The coordinator claims a pass's items ahead (claim_many), then each
    # dispatch's try_claim adopts its claim inside the same batch, or just
    # after it: from the cache, no read per item. Once a later batch is
    # over, try_claim reads again.
    store = make_store(fs, clock, "coord")
    store.claim("warm-up")
    works = [f"work-{n}" for n in range(4)]
    with store.batch():
        results = store.claim_many(works)
        tokens = [r.token for r in results if isinstance(r, ClaimResult)]
        fs.reset_calls()
        adopted = [store.try_claim(work) for work in works]
        assert fs.calls[Op.READ] == 0 and fs.calls[Op.EXISTS] == 0, fs.calls
    assert [(r.outcome, r.token) for r in adopted] == [(ClaimOutcome.ALREADY_HELD, 1)] * 4
    assert tokens == [1] * 4
    fs.reset_calls()
    assert store.try_claim("work-1").outcome is ClaimOutcome.ALREADY_HELD
    assert fs.calls[Op.READ] == 0
    with store.batch():
        store.claim_many(["later"])
    fs.reset_calls()
    assert store.try_claim("work-0").outcome is ClaimOutcome.ALREADY_HELD
    assert fs.calls[Op.READ] >= 1


def test_a_group_of_claims_decides_every_other_item_as_try_claim_does(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    rival = make_store(fs, clock, "rival")
    assert rival.claim("held") == 1
    token = store.claim("abandoned")
    assert token is not None and store.abandon("abandoned", token, sent=False)
    token = store.claim("done")
    assert token is not None
    assert store.begin_commit("done", token, b"r") is CommitOutcome.COMMITTED
    assert store.complete("done", token) is CompleteOutcome.COMPLETED
    results = store.claim_many(["held", "abandoned", "done", "new", "new", "x" * 70_000])
    outcomes = [r.outcome if isinstance(r, ClaimResult) else type(r) for r in results]
    assert outcomes == [
        ClaimOutcome.BUSY,
        ClaimOutcome.CLAIMED,
        ClaimOutcome.DONE,
        ClaimOutcome.CLAIMED,
        ClaimOutcome.ALREADY_HELD,  # the same item twice: claimed once
        InvalidWorkId,
    ]
    assert store.read("abandoned").token == 3


def test_a_claim_of_a_group_that_loses_its_slot_learns_from_it(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    rival = make_store(fs, clock, "rival")
    assert store.read("contested").status is ItemStatus.FREE  # our cache: no slot yet
    assert rival.claim("contested") == 1  # the rival links first
    results = store.claim_many(["contested", "free"])
    first, second = results
    assert isinstance(first, ClaimResult) and first.outcome is ClaimOutcome.BUSY
    assert isinstance(second, ClaimResult) and second.outcome is ClaimOutcome.CLAIMED
    assert store.read("contested").owner == Owner("rival", 1)
    assert _counters(fs, "contested") == ["hb.0000000001"]  # the rival's, kept


def test_a_power_loss_before_a_claim_groups_fsync_loses_all_of_it(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    store.claim("warm-up")
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.KILL_BEFORE), op=Op.FSYNC_DIR, path_contains="/slots")
    )
    with pytest.raises(SimulatedCrash):
        store.claim_many(["a", "b"])
    fs.crash("power")
    fs.fault = None
    restarted = make_store(fs, clock, "coord")
    assert {restarted.read(work).status for work in ("a", "b")} == {ItemStatus.FREE}
    assert restarted.claim("a") == 1


def test_a_group_of_completions_is_one_file_and_one_directory_fsync(
    fs: SimulatedFS, clock: SimulatedClock
) -> None:
    store = make_store(fs, clock, "coord")
    commits = _claimed(store, [f"work-{n}" for n in range(4)])
    assert store.begin_commit_many(commits) == [CommitOutcome.COMMITTED] * 4
    fs.log = []
    completions = [(work, token) for work, token, _ in commits]
    assert store.complete_many(completions) == [CompleteOutcome.COMPLETED] * 4
    ops = [call.op for call in fs.log]
    assert (ops.count(Op.WRITE_TEMP), ops.count(Op.FSYNC_DIR)) == (1, 1)
    assert fs.listdir(f"{ROOT}/committing") == []  # every mark went with its done
    assert _counters(fs, "work-0") == []
    fresh = make_store(fs, clock, "fresh")
    assert {fresh.read(work).status for work, _ in completions} == {ItemStatus.DONE}
    # Again, by anyone: already done; a claim with no commit: fenced out.
    again = fresh.complete_many([*completions[:1], completions[0]])
    assert again == [CompleteOutcome.ALREADY_DONE] * 2
    token = fresh.claim("uncommitted")
    assert token is not None
    outcomes = fresh.complete_many([("uncommitted", token), ("never-seen", 1)])
    assert outcomes[0] is CompleteOutcome.FENCED_OUT and isinstance(outcomes[1], InvalidToken)


_HEX64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@settings(max_examples=300, deadline=None)
@given(
    change=st.sampled_from(list(Change)),
    slot=st.integers(min_value=0, max_value=10**12),
    token=st.integers(min_value=0, max_value=10**12),
    coordinator=st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    incarnation=st.integers(min_value=1, max_value=MAX_INCARNATION),
    key=_HEX64,
    nonce=_HEX64,
    object_id=_HEX64,
    size=st.integers(min_value=0, max_value=10**9),
    work_id=st.text(max_size=40),
    unsent=st.booleans(),
    result=st.none() | st.binary(max_size=80),
)
def test_a_record_is_written_as_its_fields_through_sorted_key_json(
    change: Change,
    slot: int,
    token: int,
    coordinator: str,
    incarnation: int,
    key: str,
    nonce: str,
    object_id: str,
    size: int,
    work_id: str,
    unsent: bool,
    result: bytes | None,
) -> None:
    # The record line is built by formatting, not by the encoder: it must be
    # the very bytes the encoder gives (a reader's checksum and the group
    # file's line search both rest on them), for any work id (escapes).
    commit = change is Change.COMMIT
    record = Record(
        key,
        slot,
        change,
        token,
        Owner(coordinator, incarnation),
        nonce,
        object_id=object_id if commit else None,
        size=size if commit else None,
        work_id=work_id if change is Change.ITEM else None,
        unsent=unsent and change is Change.ABANDON,
        result=result if commit else None,
    )
    magic, checksum, body = record.encode()[:-1].split(b" ", 2)
    assert body == json.dumps(record.fields(), sort_keys=True, separators=(",", ":")).encode()
    assert magic == b"dtx-record-1" and len(checksum) == 64


def test_nonces_are_unique_in_a_process_and_never_shared_with_a_forked_child() -> None:
    # A publisher recognizes its own record by its nonce: a forked child
    # (the claim races fork eight) must not count on from its parent's.
    from dispatchtx.store.records import _new_nonce

    mine = {_new_nonce() for _ in range(1000)}
    assert len(mine) == 1000
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first nonces, to the parent
        os.write(write_end, " ".join(_new_nonce() for _ in range(3)).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    theirs = set(os.read(read_end, 4096).decode().split())
    os.close(read_end)
    later = {_new_nonce() for _ in range(3)}
    assert len(theirs) == 3 and not theirs & (mine | later)
