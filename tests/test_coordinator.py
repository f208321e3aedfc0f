"""The coordinator over the simulated transport, with the store on the
simulated disk: the normal flow and each fault point (docs/design.md)."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatchtx.coordinator import Coordinator, CoordinatorConfig, DispatchTag, Stat
from dispatchtx.coordinator.faults import CoordinatorKilled, FaultPlan, FaultPoint
from dispatchtx.coordinator.queue import QueueState
from dispatchtx.coordinator.recovery import MAX_ORPHAN_LOOKS, ORPHAN_LOOKS
from dispatchtx.fs import (
    DiskFaultPlan,
    Fault,
    FaultKind,
    FaultRule,
    Op,
    RealClock,
    RealFS,
    SimulatedFS,
)
from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
from dispatchtx.store import ItemStatus, Survey, WorkStore, item_key
from dispatchtx.transport import Result, SimFaults, SimulatedTransport, TransportClock

ROOT = "/store"


@dataclass
class World:
    transport: SimulatedTransport
    fs: SimulatedFS
    workload: HashWorkload
    clock: TransportClock

    def store(self, ttl: float = 0.5) -> WorkStore:
        return WorkStore(self.fs, ROOT, self.clock, ttl=ttl, retry_pause=lambda seconds: None)

    def coordinator(
        self,
        plan: FaultPlan | None = None,
        *,
        max_in_flight: int = 1,
        deadline: float = 2.0,
        commit_batch: int = 1,
    ) -> Coordinator:
        config = CoordinatorConfig(
            "coord-a", max_in_flight=max_in_flight, deadline=deadline, commit_batch=commit_batch
        )
        return Coordinator(config, self.transport, self.store(), self.workload, faults=plan)


def make_world(
    *, workers: int = 3, items: int = 24, seed: int = 0, faults: SimFaults | None = None
) -> World:
    transport = SimulatedTransport(workers, hash_task, seed=seed, faults=faults or SimFaults())
    return World(
        transport, SimulatedFS(seed=seed), HashWorkload(items), TransportClock(transport, 1.7e9)
    )


def assert_clean_end(world: World, coordinator: Coordinator) -> None:
    coordinator.shutdown()
    workload = world.workload
    assert workload.violations == []
    assert workload.remaining() == 0
    assert coordinator.leaks() == []
    statuses = {state.status for state in coordinator.store.items()}
    assert statuses <= {ItemStatus.DONE, ItemStatus.QUARANTINED}
    done = [item for item in workload.items if workload.status(item) is QueueState.DONE]
    assert len(done) + len(workload.dropped) == len(workload.items)
    for item in done:
        assert workload.digests[item] == workload.expected(item)


def test_normal_flow_commits_every_item_once_and_leaks_nothing() -> None:
    world = make_world()
    coordinator = world.coordinator()
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)
    assert coordinator.stats["committed"] == 24
    assert coordinator.stats["dispatches"] == 24
    assert world.workload.reruns == 0


def test_pipelining_keeps_several_dispatches_in_flight_per_worker() -> None:
    world = make_world(workers=2, items=40)
    coordinator = world.coordinator(max_in_flight=4)
    coordinator.step()
    assert len(list(coordinator.tables.in_flight())) == 8
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)


@pytest.mark.parametrize("commit_batch", [1024, 3, 1])
def test_results_taken_together_pass_the_fence_as_one_group(commit_batch: int) -> None:
    world = make_world(workers=8, items=64)
    coordinator = world.coordinator(max_in_flight=2, commit_batch=commit_batch)
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)
    assert coordinator.stats["committed"] == 64
    if commit_batch > 1:
        assert coordinator.stats["group commits"] >= 1
        assert coordinator.stats["results in group commits"] > coordinator.stats["group commits"]
    else:
        assert coordinator.stats["group commits"] == 0


def _fail_the_fsyncs_of_one_group(
    world: World,
    coordinator: Coordinator,
    group: str,
    when: Callable[[], bool] = lambda: True,
) -> dict[str, int]:
    """Fail every directory fsync at the end of the first store batch made
    by the coordinator's method `group` on a call for which `when()` holds,
    until the store gives up on it (OutcomeUnknown); then the disk heals.
    Returns the state: "armed" is 0 once that batch has come."""
    failing = {"left": 0, "armed": 1}

    def hook(op: Op, path: str) -> Fault | None:
        if op is Op.FSYNC_DIR and "/slots" in path and failing["left"] > 0:
            failing["left"] -= 1
            return Fault(FaultKind.EIO)
        return None

    world.fs.fault = hook
    real_batch = coordinator.store.batch
    real_group = getattr(coordinator, group)
    inside = {"group": False}

    def group_spy(*args: Any) -> None:
        inside["group"] = bool(failing["armed"]) and when()
        try:
            real_group(*args)
        finally:
            inside["group"] = False

    @contextlib.contextmanager
    def batch() -> Iterator[None]:
        with real_batch():
            yield
            if inside["group"] and failing["armed"]:  # every attempt at every directory
                failing["armed"] = 0
                failing["left"] = 20 * len(coordinator.store._deferred or {})

    setattr(coordinator, group, group_spy)
    coordinator.store.batch = batch  # type: ignore[method-assign]
    return failing


@pytest.mark.parametrize(
    ("group", "retried", "commit_batch"),
    [
        # A pass's one group (commits, dones and claims): both are counted.
        ("_fence_and_dispatch", "group claims failed", 1024),
        ("_fence_and_dispatch", "group commits retried", 1024),
        # With more free workers or results than one group holds, the rest
        # go in groups of claims, or of commits, of their own.
        ("_dispatch_batch", "group claims failed", 2),
        ("_fence_batch", "group commits retried", 2),
    ],
)
def test_a_group_whose_fsync_fails_is_settled_one_by_one(
    group: str, retried: str, commit_batch: int
) -> None:
    world = make_world(workers=8, items=48)
    coordinator = world.coordinator(max_in_flight=2, commit_batch=commit_batch)
    _fail_the_fsyncs_of_one_group(world, coordinator, group)
    coordinator.run(max_steps=10_000)
    assert coordinator.stats[retried] == 1
    assert_clean_end(world, coordinator)


def test_a_pass_whose_group_fails_with_dones_awaiting_settles_them_and_goes_on() -> None:
    # A later pass's group holds the last triage's `done`s too: when its
    # fsync fails, those are settled by a retry, the commits one by one, and
    # the claims are never sent; the run still ends with every item done.
    world = make_world(workers=4, items=32)
    coordinator = world.coordinator(max_in_flight=2, commit_batch=64)
    awaiting: list[int] = []

    def dones_awaiting() -> bool:
        awaiting.append(len(coordinator._awaiting_done))
        return awaiting[-1] > 0

    failing = _fail_the_fsyncs_of_one_group(
        world, coordinator, "_fence_and_dispatch", when=dones_awaiting
    )
    coordinator.run(max_steps=10_000)
    assert failing["armed"] == 0 and awaiting[-1] >= 1
    assert coordinator.stats["group commits retried"] == 1
    assert coordinator.stats["committed"] == 32
    assert_clean_end(world, coordinator)


def test_a_kill_in_a_pass_s_triage_sends_nothing_and_leaves_nothing_taken() -> None:
    # Killed in triage after its group is durable: the pass sends none of
    # its claimed dispatches; they are compensated, their items given back.
    world = make_world(workers=4, items=16)
    plan = FaultPlan(at_least_once=[FaultPoint.KILL_MID_TRIAGE])
    coordinator = world.coordinator(plan, max_in_flight=2, commit_batch=64)
    with pytest.raises(CoordinatorKilled):
        coordinator.run(max_steps=10_000)
    preparing = [txn for txn in coordinator.tables.in_flight() if txn.phase.name == "PREPARING"]
    assert preparing == []
    assert not any(
        world.workload.status(item) is QueueState.TAKEN
        and not any(txn.tag.work_id == item for txn in coordinator.tables.in_flight())
        for item in world.workload.items
    )


def test_run_goes_on_until_the_first_look_for_commits_to_roll_forward_succeeds() -> None:
    world = make_world(workers=2, items=2)
    world.fs.fault = DiskFaultPlan(
        *(
            FaultRule(Fault(FaultKind.EIO), op=Op.LISTDIR, path_contains="/slots", nth=n)
            for n in range(3)
        )
    )
    coordinator = world.coordinator()
    at_start = coordinator.recovering
    assert at_start
    coordinator.run(max_steps=10_000)
    assert not coordinator.recovering
    assert coordinator.stats["roll-forward failures"] == 3
    assert_clean_end(world, coordinator)


def test_an_error_in_one_fence_of_a_group_leaves_the_others_carried_on() -> None:
    world = make_world(workers=4, items=4)
    coordinator = world.coordinator(commit_batch=1024)
    real_check = coordinator._check_result
    calls = {"n": 0, "failed": 0}

    def check_result(worker: int, message: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the second result of the first group
            calls["failed"] += 1
            raise RuntimeError("injected: a corrupt record")
        return real_check(worker, message)

    coordinator._check_result = check_result  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        for _ in range(1000):
            coordinator.step()
    assert calls["failed"] == 1
    # Every other result of the group (before the error and after it) was
    # carried on past the fence and triaged (its `done` goes with the next
    # group), not left ACTIVE.
    assert calls["n"] > 2
    phases = [txn.phase.name for txn in coordinator.tables.in_flight()]
    assert coordinator.stats["committed"] + phases.count("COMMITTING") == calls["n"] - 1
    for txn in coordinator.tables.in_flight():
        if txn.phase.name == "ACTIVE":  # only ever a dispatch whose item is still just claimed
            assert coordinator.store.read(txn.tag.work_id).status is ItemStatus.CLAIMED
    coordinator.run(max_steps=10_000)  # the failed one is redone after its deadline
    assert_clean_end(world, coordinator)


def test_a_corrupt_item_does_not_hold_up_the_first_look() -> None:
    world = make_world(workers=2, items=3)
    other = world.store()
    other.register("coord-b")
    assert other.claim("elsewhere") == 1
    slot = f"{ROOT}/slots/{item_key('elsewhere')}.s.0000000001"
    world.fs.pwrite(slot, 0, b"not a record at all\n")
    coordinator = world.coordinator()
    coordinator.run(max_steps=10_000)
    assert not coordinator.recovering
    assert coordinator.stats["unreadable items"] == 1
    coordinator.shutdown()
    assert world.workload.remaining() == 0 and coordinator.leaks() == []
    assert all(coordinator.store.read(w).status is ItemStatus.DONE for w in world.workload.items)


def test_a_duplicate_inside_a_group_is_dropped() -> None:
    world = make_world(workers=8, items=48, seed=5)
    plan = FaultPlan({FaultPoint.DUPLICATE_RESULT: 0.3}, seed=5)
    coordinator = world.coordinator(plan, max_in_flight=2, commit_batch=1024)
    coordinator.run(max_steps=10_000)
    assert plan.fired[FaultPoint.DUPLICATE_RESULT] >= 1
    assert coordinator.stats["group commits"] >= 1
    assert (
        coordinator.stats["stale or duplicate results dropped"]
        >= plan.fired[FaultPoint.DUPLICATE_RESULT]
    )
    assert coordinator.stats["committed"] == 48
    assert_clean_end(world, coordinator)


def test_objects_are_shipped_once_per_worker() -> None:
    world = make_world(workers=2, items=30)
    coordinator = world.coordinator()
    coordinator.run(max_steps=10_000)
    # 4 shared objects, 2 workers: each worker gets each content at most once
    assert coordinator.stats["objects shipped"] <= 8
    assert_clean_end(world, coordinator)


@pytest.mark.parametrize(
    "point",
    [
        FaultPoint.SEND_AFTER_CLAIM,
        FaultPoint.SEND_AFTER_RESERVATIONS,
        FaultPoint.MESSAGE_BUILD,
        FaultPoint.OBJECT_TRANSFER,
        FaultPoint.SEND,
        FaultPoint.AMBIGUOUS_SEND,
        FaultPoint.BEGIN_COMMIT_EIO,
        FaultPoint.TRIAGE_EIO,
        FaultPoint.COMPLETE_EIO,
    ],
)
def test_each_fault_point_is_compensated_and_the_run_still_completes(point: FaultPoint) -> None:
    world = make_world(seed=3)
    plan = FaultPlan({point: 0.2}, seed=3, at_least_once=[point])
    coordinator = world.coordinator(plan)
    coordinator.run(max_steps=20_000)
    assert plan.fired[point] >= 1
    assert_clean_end(world, coordinator)


def test_a_failed_first_transfer_carries_the_content_again() -> None:
    world = make_world(workers=1, items=3)
    plan = FaultPlan(at_least_once=[FaultPoint.OBJECT_TRANSFER])
    coordinator = world.coordinator(plan)
    coordinator.run(max_steps=10_000)
    assert plan.fired[FaultPoint.OBJECT_TRANSFER] == 1
    assert coordinator.stats["dispatch failures"] == 1
    assert_clean_end(world, coordinator)  # the worker computed with the content


def test_stale_duplicate_lost_and_garbled_results_are_dropped_and_redone() -> None:
    faults = SimFaults(duplicate=0.2, stale=0.05, loss=0.05, garble=0.05, stale_seconds=5.0)
    world = make_world(seed=7, items=30, faults=faults)
    for fault in ("duplicate", "stale", "loss", "garble"):
        world.transport.force(fault)
    coordinator = world.coordinator(deadline=1.0)
    coordinator.run(max_steps=50_000)
    stats = world.transport.stats
    assert stats["duplicate"] and stats["loss"] and stats["garble"] and stats["stale"]
    assert coordinator.stats["stale or duplicate results dropped"] >= 1
    # every garbled message that arrived was counted and dropped, none crashed us
    assert coordinator.stats["malformed results dropped"] == stats["malformed_delivered"]
    assert_clean_end(world, coordinator)


def test_a_crashed_worker_is_lost_and_its_dispatch_redone_elsewhere() -> None:
    world = make_world(workers=3, items=20)
    coordinator = world.coordinator()
    coordinator.step()
    world.transport.crash(1)
    coordinator.run(max_steps=10_000)
    assert coordinator.lost_workers == {1}
    assert coordinator.stats["workers lost"] == 1
    assert_clean_end(world, coordinator)


@pytest.mark.parametrize(
    "point",
    [
        FaultPoint.KILL_AFTER_STORE_COMMIT,
        FaultPoint.KILL_MID_TRIAGE,
        FaultPoint.KILL_AFTER_TRIAGE,
        FaultPoint.KILL_AFTER_COMPLETE,
    ],
)
def test_a_coordinator_killed_at_a_commit_stage_is_rolled_forward_by_its_restart(
    point: FaultPoint,
) -> None:
    world = make_world(items=12)
    plan = FaultPlan(at_least_once=[point])
    first = world.coordinator(plan)
    with pytest.raises(CoordinatorKilled):
        first.run(max_steps=10_000)
    # The process died: its tables and leases are gone; the store, the disk
    # (process kill: the page cache survives) and the workers remain.
    world.fs.crash("process")
    for item in world.workload.items:
        if world.workload.status(item) is QueueState.TAKEN:
            world.workload.give_back(item)
    restarted = world.coordinator()
    assert restarted.incarnation == first.incarnation + 1
    restarted.run(max_steps=10_000)
    assert_clean_end(world, restarted)
    assert world.workload.violations == []


@pytest.mark.parametrize("point", [FaultPoint.STALE_RESULT, FaultPoint.DUPLICATE_RESULT])
def test_a_late_or_repeated_answer_is_dropped_and_never_applied_twice(point: FaultPoint) -> None:
    world = make_world(items=10)
    plan = FaultPlan({point: 0.3}, seed=5, at_least_once=[point])
    coordinator = world.coordinator(plan, deadline=0.5)
    coordinator.run(max_steps=50_000)
    assert_clean_end(world, coordinator)  # shuts down: late answers arrive by then
    assert plan.fired[point] >= 1
    assert coordinator.stats["stale or duplicate results dropped"] >= plan.fired[point]


def test_with_a_journal_the_restarted_coordinator_closes_what_its_predecessor_left() -> None:
    world = make_world(items=12)
    disk = SimulatedFS(seed=1)
    config = CoordinatorConfig("coord-a", deadline=2.0, journal_path="/journal/coord-a")
    plan = FaultPlan(at_least_once=[FaultPoint.KILL_MID_TRIAGE, FaultPoint.SEND_AFTER_JOURNAL])
    first = Coordinator(
        config, world.transport, world.store(), world.workload, faults=plan, journal_fs=disk
    )
    with pytest.raises(CoordinatorKilled):
        first.run(max_steps=10_000)
    assert plan.fired[FaultPoint.SEND_AFTER_JOURNAL] == 1
    assert first.dispatch_log is not None and first.dispatch_log.reclaimed("never sent") == 1
    disk.crash("power")
    world.fs.crash("power")
    for item in world.workload.items:
        if world.workload.status(item) is QueueState.TAKEN:
            world.workload.give_back(item)
    restarted = Coordinator(config, world.transport, world.store(), world.workload, journal_fs=disk)
    assert restarted.dispatch_log is not None
    assert restarted.dispatch_log.stale()  # replayed from the journal
    restarted.run(max_steps=10_000)
    assert_clean_end(world, restarted)
    assert restarted.dispatch_log.stale() == []
    assert restarted.stats["stale journal entries closed"] >= 1


def test_with_a_journal_a_pass_records_its_dispatches_as_one_journal_record() -> None:
    # Under group commit, the dispatches a pass sends are journaled together
    # (one write and one fsync for all), before any of them is sent.
    world = make_world(workers=4, items=32)
    disk = SimulatedFS(seed=1)
    config = CoordinatorConfig(
        "coord-a", max_in_flight=2, commit_batch=64, journal_path="/journal/coord-a"
    )
    coordinator = Coordinator(
        config, world.transport, world.store(), world.workload, journal_fs=disk
    )
    sent_before_journaled: list[int] = []
    real_send = world.transport.send
    log = coordinator.dispatch_log
    assert log is not None

    def send(worker: int, work: Any) -> None:
        if log.entry(work.dispatch_id) is None:
            sent_before_journaled.append(work.dispatch_id)
        real_send(worker, work)

    world.transport.send = send  # type: ignore[method-assign]
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)
    assert sent_before_journaled == []
    kinds = [
        json.loads(line.partition(b" ")[2]).get("kind")
        for line in disk.read("/journal/coord-a").splitlines()
    ]
    assert kinds.count("dispatch-log.dispatch_many") >= 1
    # Fewer journal records than dispatches: the first pass alone sends eight.
    assert kinds.count("dispatch-log.dispatch_many") + kinds.count("dispatch-log.dispatch") < 32
    assert log.dispatched == coordinator.stats["dispatches"] == 32


class SlowTriage(HashWorkload):
    """Triage that runs for many TTLs, while a peer watches the item."""

    def __init__(self, items: int, peer: WorkStore, seconds: float) -> None:
        super().__init__(items)
        self.peer = peer
        self.seconds = seconds
        self.peer_saw: list[list[str]] = []

    def triage(self, work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        self.peer.roll_forward_candidates()  # the peer's first look starts its watch
        time.sleep(self.seconds)
        self.peer_saw.append([c.work_id for c in self.peer.roll_forward_candidates()])
        super().triage(work_id, token, result, owner=owner)


@pytest.mark.parametrize("background", [True, False])
def test_a_long_triage_cannot_starve_the_heartbeats(tmp_path: Path, background: bool) -> None:
    ttl = 0.1
    fs = RealFS()
    transport = SimulatedTransport(1, hash_task)
    peer = WorkStore(fs, str(tmp_path), RealClock(), ttl=ttl)
    peer.register("peer")
    workload = SlowTriage(1, peer, seconds=8 * ttl)
    config = CoordinatorConfig("owner", background_heartbeat=background, heartbeat_every=ttl / 4)
    store = WorkStore(fs, str(tmp_path), RealClock(), ttl=ttl)
    coordinator = Coordinator(config, transport, store, workload)
    coordinator.run(max_steps=1_000)
    coordinator.shutdown()
    if background:
        assert workload.peer_saw == [[]]  # alive all along: nothing to roll forward
        assert coordinator.stats["background heartbeats"] >= 4
    else:
        assert workload.peer_saw == [["item-0"]]  # starved: the peer would take it over


def test_commit_batch_must_be_a_positive_int() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="commit_batch"):
            CoordinatorConfig("coord-a", commit_batch=bad)  # type: ignore[arg-type]


def test_dispatches_are_tagged_with_their_item_and_token() -> None:
    world = make_world(workers=2, items=4)
    coordinator = world.coordinator()
    coordinator.step()
    tags = [txn.tag for txn in coordinator.tables.in_flight()]
    assert tags and all(isinstance(tag, DispatchTag) for tag in tags)
    for tag in tags:
        assert isinstance(tag, DispatchTag)
        assert coordinator.store.read(tag.work_id).token == tag.token >= 1
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)


def test_a_refused_claim_is_counted_by_the_stores_answer_without_reading_it_again() -> None:
    world = make_world(workers=1, items=2)
    other = Coordinator(
        CoordinatorConfig("coord-b"), world.transport, world.store(), HashWorkload(2)
    )
    other.run(max_steps=10_000)  # every item done by a peer
    coordinator = world.coordinator()
    reads = {"n": 0}
    real_read = coordinator.store.read

    def read(work_id: str) -> Any:
        reads["n"] += 1
        return real_read(work_id)

    coordinator.store.read = read  # type: ignore[method-assign]
    coordinator.run(max_steps=10_000)
    assert coordinator.stats[Stat.REFUSED_DONE] == 2
    assert coordinator.stats["claim refused: done"] == 2  # the same counter, by its name
    assert coordinator.stats[Stat.COMMITTED] == 0
    assert reads["n"] == 0
    assert world.workload.remaining() == 0


def test_stats_are_keyed_by_stat() -> None:
    world = make_world(workers=2, items=4)
    coordinator = world.coordinator()
    coordinator.run(max_steps=10_000)
    assert set(coordinator.stats.counts) <= set(Stat)
    with pytest.raises(ValueError):
        coordinator.stats["no such counter"]


def test_a_workload_whose_set_up_fails_leaves_no_heartbeat_thread() -> None:
    class Broken(HashWorkload):
        def attach(self, tables: Any, dispatch_log: Any) -> None:
            raise RuntimeError("injected: set-up failed")

    world = make_world(workers=1, items=1)
    config = CoordinatorConfig("coord-a", background_heartbeat=True)
    before = {thread.name for thread in threading.enumerate()}
    with pytest.raises(RuntimeError, match="set-up failed"):
        Coordinator(config, world.transport, world.store(), Broken(1))
    assert {thread.name for thread in threading.enumerate()} - before == set()


def test_late_answers_of_a_worker_that_keeps_answering_do_not_lose_it() -> None:
    # One worker, four in flight, a third of its answers held back past their
    # deadline: each late one misses its deadline, but the worker answered
    # since it was sent, so it is no strike (it was lost on 2 cores before).
    world = make_world(workers=1, items=60, seed=3)
    plan = FaultPlan({FaultPoint.STALE_RESULT: 0.35}, seed=3)
    config = CoordinatorConfig("coord-a", max_in_flight=4, deadline=1.0, strikes=3)
    coordinator = Coordinator(config, world.transport, world.store(), world.workload, faults=plan)
    coordinator.run(max_steps=200_000)
    assert coordinator.faults.fired[FaultPoint.STALE_RESULT] >= 10
    assert coordinator.stats["deadlines missed"] >= 10
    assert coordinator.lost_workers == set()
    assert coordinator.stats["workers lost"] == 0
    assert_clean_end(world, coordinator)


def test_a_worker_silent_since_its_dispatches_were_sent_is_still_lost() -> None:
    world = make_world(workers=2, items=20)
    config = CoordinatorConfig("coord-a", max_in_flight=1, deadline=1.0, strikes=2)
    coordinator = Coordinator(config, world.transport, world.store(), world.workload)
    coordinator.step()
    world.transport.crash(1)  # it never answers again
    coordinator.run(max_steps=20_000)
    assert coordinator.lost_workers == {1}
    assert_clean_end(world, coordinator)


def test_a_full_disk_while_storing_results_does_not_hang_the_coordinator() -> None:
    world = make_world(workers=3, items=12)
    coordinator = world.coordinator()
    coordinator.step()  # claims durable, work sent
    assert len(coordinator.tables) > 0
    # The disk is full: every temp file (result objects, commit records) fails.
    world.fs.fault = DiskFaultPlan(FaultRule(Fault(FaultKind.ENOSPC), op=Op.WRITE_TEMP))
    steps_returned = threading.Event()

    def a_few_steps() -> None:
        for _ in range(20):
            coordinator.step()
        steps_returned.set()

    stepping = threading.Thread(target=a_few_steps, daemon=True)
    stepping.start()
    stepping.join(timeout=20.0)
    assert steps_returned.is_set(), "step() kept retrying a fence that stored nothing"
    failed = coordinator.stats[Stat.FENCE_ATTEMPTS_FAILED]
    assert failed >= 1
    assert coordinator.stats[Stat.COMMITTED] == 0
    # Failed fence attempts were given back (discarded): no dispatch of theirs
    # is left, and no new claims were made into a full disk meanwhile.
    assert len(coordinator.tables) <= 3 - min(failed, 3)
    world.fs.fault = None  # space again: the run completes
    coordinator.run(max_steps=50_000)
    assert coordinator.stats[Stat.COMMITTED] >= 1
    assert_clean_end(world, coordinator)


def test_a_result_for_an_item_whose_chain_turned_corrupt_is_counted_and_dropped() -> None:
    world = make_world(workers=1, items=3)
    coordinator = world.coordinator()
    coordinator.step()  # item-0 claimed and sent
    ((txn_id, tag),) = [(txn.id, txn.tag) for txn in coordinator.tables.in_flight()]
    # Its claim slot rots before the result comes back; a fresh look must see it.
    world.fs.pwrite(
        f"{ROOT}/slots/{item_key(tag.work_id)}.s.{tag.token:010d}", 0, b"rotted record\n"
    )
    coordinator.store._chains.clear()
    coordinator.run(max_steps=20_000)  # step() never raises; the run ends
    assert coordinator.stats[Stat.CORRUPT_ITEMS_DROPPED] == 1
    assert tag.work_id in world.workload.dropped
    assert coordinator.tables.get(txn_id) is None
    assert world.workload.remaining() == 0
    coordinator.shutdown()
    assert coordinator.leaks() == []
    assert {world.workload.status(w) for w in world.workload.items if w != tag.work_id} == {
        QueueState.DONE
    }


def test_one_unreadable_committed_item_does_not_stop_roll_forward_of_the_others() -> None:
    world = make_world(workers=2, items=6)
    for peer in ("coord-b", "coord-c", "coord-d"):  # each killed after one commit
        config = CoordinatorConfig(peer, commit_batch=1)
        plan = FaultPlan({FaultPoint.KILL_AFTER_STORE_COMMIT: 1.0})
        killed = Coordinator(config, world.transport, world.store(), world.workload, faults=plan)
        with contextlib.suppress(CoordinatorKilled):
            killed.run(max_steps=1_000)
    committing = [s for s in world.store().items() if s.status is ItemStatus.COMMITTING]
    assert len(committing) == 3
    bad = committing[0]
    assert bad.token is not None
    # Its result rides in its commit record: rot that record.
    commit_slot = f"{ROOT}/slots/{item_key(bad.work_id)}.s.{bad.token + 1:010d}"
    world.fs.pwrite(commit_slot, 0, b"rotted")
    restarted = world.coordinator()
    restarted.run(max_steps=50_000)
    assert restarted.stats[Stat.ITEMS_SET_ASIDE] == 1
    assert restarted.stats[Stat.ROLLED_FORWARD_FOR_PEER] == 2
    survey = restarted.store.survey()
    assert list(survey.unreadable) == [bad.key]  # reported, left alone
    assert {s.status for s in survey.states} == {ItemStatus.DONE}
    assert len(survey.states) == 5


class AdoptingHashWorkload(HashWorkload):
    def __init__(self, items: int) -> None:
        super().__init__(items)
        self.offered: list[str] = []

    def adopt(self, work_id: str) -> bool:
        self.offered.append(work_id)
        return False


def test_orphans_are_looked_for_only_for_a_workload_that_adopts() -> None:
    world = make_world(items=6)
    coordinator = world.coordinator()
    while not coordinator.idle:
        coordinator.step()
    surveys = 0
    survey = coordinator.store.survey

    def counting_survey() -> Any:
        nonlocal surveys
        surveys += 1
        return survey()

    coordinator.store.survey = counting_survey  # type: ignore[method-assign]
    # The default adopt() adopts nothing: the store is not read for it.
    assert coordinator.adopt_orphans() is False
    assert surveys == 0
    coordinator.shutdown()

    adopting = AdoptingHashWorkload(6)
    world = World(world.transport, world.fs, adopting, world.clock)
    peer = world.coordinator()
    peer.store.survey = counting_survey  # type: ignore[method-assign]
    assert peer.adopt_orphans() is False
    assert surveys == 1
    peer.shutdown()


class AcceptingHashWorkload(AdoptingHashWorkload):
    """Adopts every unsettled item it is offered that is not its own."""

    def adopt(self, work_id: str) -> bool:
        super().adopt(work_id)
        return work_id not in self.items


def idle_adopting_coordinator(world: World) -> tuple[Coordinator, AcceptingHashWorkload]:
    """A coordinator over `world` whose workload adopts, once its own items are done."""
    adopting = AcceptingHashWorkload(2)
    coordinator = World(world.transport, world.fs, adopting, world.clock).coordinator()
    while not coordinator.idle:
        coordinator.step()
    return coordinator, adopting


def hide_first_record(world: World, work_id: str, misses: float = math.inf) -> Callable[[], None]:
    """Reads of the item's first record miss, `misses` times (a negative
    look-up cached before it landed); returns what shows it again."""
    first_record = f"{ROOT}/slots/{item_key(work_id)}.s.0000000000"
    left = misses
    read = world.fs.read

    def cached_miss(path: str) -> bytes:
        nonlocal left
        if path == first_record and left > 0:
            left -= 1
            raise FileNotFoundError(path)
        return read(path)

    def show() -> None:
        nonlocal left
        left = 0

    world.fs.read = cached_miss  # type: ignore[method-assign]
    return show


def test_an_orphan_whose_first_record_is_not_seen_yet_is_looked_at_again() -> None:
    world = make_world(items=2)
    peer_store = world.store()
    peer_store.register("coord-b")
    assert peer_store.claim("orphan") is not None  # a peer's claim; the peer is gone
    hide_first_record(world, "orphan", misses=3)
    adopting = AcceptingHashWorkload(2)
    coordinator = World(world.transport, world.fs, adopting, world.clock).coordinator()
    for _ in range(3):
        assert coordinator.adopt_orphans() is True  # not seen yet: look again
        assert adopting.offered == []
    assert coordinator.adopt_orphans() is True  # seen now, and adopted
    assert adopting.offered == ["orphan"]
    assert coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP] == 0
    coordinator.shutdown()


def plant_a_slot_without_its_first_record(world: World, work_id: str) -> None:
    """A slot name whose item's first record is never seen (a first record
    lost, or a name put there by something else)."""
    world.fs.mkdir(f"{ROOT}/slots")
    world.fs.pwrite(f"{ROOT}/slots/{item_key(work_id)}.s.0000000001", 0, b"junk\n")


def test_an_item_whose_first_record_is_never_seen_is_given_up_after_its_looks() -> None:
    world = make_world(items=2)
    coordinator, adopting = idle_adopting_coordinator(world)
    plant_a_slot_without_its_first_record(world, "never-landed")
    started = world.transport.now()
    looks = 0
    while coordinator.adopt_orphans():
        looks += 1
        assert looks < 10_000, "an unreadable directory kept the run going"
        coordinator.step()  # time passes (the idle poll)
    assert looks >= ORPHAN_LOOKS - 1
    assert world.transport.now() - started >= coordinator.store.ttl + coordinator.store.margin
    assert coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP] == 1
    assert adopting.offered == []
    assert coordinator.adopt_orphans() is False  # given up once, not counted again
    assert coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP] == 1
    coordinator.shutdown()


def test_errors_that_hit_another_item_each_look_do_not_keep_the_run_going() -> None:
    world = make_world(items=2)
    coordinator, _ = idle_adopting_coordinator(world)
    looks = 0

    def flickering_survey() -> Survey:
        nonlocal looks
        looks += 1
        key = item_key(f"flicker-{looks}")  # a new item hit by an I/O error each time
        return Survey([], {key: "reading a slot failed"}, [key])

    coordinator.store.survey = flickering_survey  # type: ignore[method-assign]
    while coordinator.adopt_orphans():
        assert looks < MAX_ORPHAN_LOOKS
        coordinator.step()
    assert looks >= ORPHAN_LOOKS
    given_up = coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP]
    assert given_up == 1  # the key of the look that ended the wait
    assert coordinator.adopt_orphans() is False  # a new key after the wait: given up at once
    assert coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP] == given_up + 1
    coordinator.shutdown()


def test_the_wait_for_unread_items_ends_on_a_clock_that_does_not_move() -> None:
    world = make_world(items=2)
    coordinator, _ = idle_adopting_coordinator(world)
    plant_a_slot_without_its_first_record(world, "never-landed")
    looks = 0
    while coordinator.adopt_orphans():  # no step(): the simulated clock stands still
        looks += 1
        assert looks < MAX_ORPHAN_LOOKS
    assert looks == MAX_ORPHAN_LOOKS - 1
    assert coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP] == 1
    coordinator.shutdown()


def test_an_item_given_up_is_still_adopted_once_a_survey_reads_it() -> None:
    world = make_world(items=2)
    peer_store = world.store()
    peer_store.register("coord-b")
    assert peer_store.claim("late") is not None
    show = hide_first_record(world, "late")
    adopting = AcceptingHashWorkload(2)
    coordinator = World(world.transport, world.fs, adopting, world.clock).coordinator()
    while coordinator.adopt_orphans():
        coordinator.step()
    assert coordinator.stats[Stat.ORPHAN_LOOKS_GIVEN_UP] == 1
    assert "late" not in adopting.offered
    show()
    assert coordinator.adopt_orphans() is True
    assert "late" in adopting.offered
    coordinator.shutdown()


def test_a_group_commit_writes_one_file_per_group_not_per_item() -> None:
    def files_and_fsyncs(commit_batch: int) -> tuple[int, int, Coordinator]:
        world = make_world(workers=4, items=40)
        coordinator = world.coordinator(max_in_flight=4, commit_batch=commit_batch)
        world.fs.log = []
        coordinator.run(max_steps=10_000)
        assert_clean_end(world, coordinator)
        log = world.fs.log
        ops = [call.op for call in log if "/slots" in call.path or call.op is Op.WRITE_TEMP]
        return ops.count(Op.WRITE_TEMP), ops.count(Op.FSYNC_DIR), coordinator

    # One at a time, each item writes four files (first record, claim,
    # commit, done) and fsyncs slots/ three times.
    assert files_and_fsyncs(1)[:2] == (160, 120)
    files, fsyncs, grouped = files_and_fsyncs(64)
    # Grouped, each group of claims, commits or dones is one file and one fsync.
    groups = files
    assert grouped.stats[Stat.RESULTS_IN_BATCHES] >= 2 * grouped.stats[Stat.COMMIT_BATCHES]
    assert fsyncs == groups < 40


def test_a_pass_publishes_its_commits_dones_and_next_claims_as_one_group() -> None:
    # Each pass of the loop takes results, and the worker each result frees
    # gets its next item at once: the commits, the last pass's `done`s and
    # those claims are one file and one fsync of slots/ (not one group of
    # claims and another of commits per pass).
    world = make_world(workers=4, items=40)
    coordinator = world.coordinator(max_in_flight=4, commit_batch=64)
    passes = {"n": 0}
    real_step = coordinator.step

    def step() -> None:
        passes["n"] += 1
        real_step()

    coordinator.step = step  # type: ignore[method-assign]
    world.fs.log = []
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)
    files = [call for call in world.fs.log if call.op is Op.WRITE_TEMP]
    fsyncs = [call for call in world.fs.log if call.op is Op.FSYNC_DIR and "/slots" in call.path]
    assert len(files) == len(fsyncs) <= passes["n"]
    # The claims of the workers a pass frees rode with its commits.
    assert coordinator.stats[Stat.CLAIMS_IN_BATCHES] == 40
    assert coordinator.stats[Stat.CLAIM_BATCHES] <= coordinator.stats[Stat.COMMIT_BATCHES] + 1


def test_a_triage_that_fails_in_a_group_parks_only_its_own_dispatch() -> None:
    world = make_world(workers=4, items=8)
    coordinator = world.coordinator(max_in_flight=2, commit_batch=64)
    real_triage = world.workload.triage
    failed: list[str] = []

    def triage(work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        if not failed:
            failed.append(work_id)
            raise RuntimeError("injected: triage failed once")
        real_triage(work_id, token, result, owner=owner)

    world.workload.triage = triage  # type: ignore[method-assign]
    coordinator.run(max_steps=10_000)
    assert failed and coordinator.stats[Stat.TRIAGE_FAILURES] == 1
    assert coordinator.stats[Stat.TRIAGE_RETRIES] >= 1  # retried, then committed
    assert coordinator.stats[Stat.COMMITTED] == 8
    assert_clean_end(world, coordinator)


def test_the_dones_of_a_poll_go_in_one_file_with_the_next_claims() -> None:
    world = make_world(workers=4, items=40)
    coordinator = world.coordinator(max_in_flight=2, commit_batch=64)
    coordinator.run(max_steps=10_000)
    assert_clean_end(world, coordinator)
    slots = f"{ROOT}/slots"
    files = [world.fs.read(f"{slots}/{name}") for name in world.fs.listdir(slots)]
    mixed = [data for data in files if b'"change":"done"' in data and b'"change":"claim"' in data]
    assert mixed, "no group held both the dones of a poll and the claims after it"


def test_answers_held_by_the_transport_are_taken_in_before_a_dispatch_counts_as_unanswered() -> (
    None
):
    # The grouped pass sends after its poll, and a long send drains answers
    # into the transport: the deadline sweep must hear them first, not call
    # their dispatches unanswered (with one strike, their workers lost).
    world = make_world(workers=2, items=2)
    coordinator = world.coordinator(max_in_flight=1, commit_batch=64, deadline=2.0)
    coordinator.step()  # both items sent
    assert len(list(coordinator.tables.in_flight())) == 2
    held = world.transport.poll(10.0)  # the answers, as a send would have drained them
    while len(held) < 2:
        held += world.transport.poll(10.0)
    real_poll = world.transport.poll

    def poll(timeout: float) -> list[tuple[int, Result | bytes]]:
        nonlocal held
        if held:
            arrived, held = held, []
            return arrived
        return real_poll(timeout)

    world.transport.poll = poll  # type: ignore[method-assign]
    coordinator._sweep_lost_workers(world.transport.now() + 5.0)
    assert coordinator.stats[Stat.DEADLINES_MISSED] == 0 and not coordinator.lost_workers
    coordinator.run(max_steps=1000)
    assert coordinator.stats[Stat.COMMITTED] == 2
    assert_clean_end(world, coordinator)
