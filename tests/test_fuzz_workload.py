"""The campaign's fuzzing workload: the targets' planted bugs, the task's
determinism, and whole runs under the coordinator over the simulated
transport, with the store and the campaign directory on a simulated disk
(docs/design.md "Triage and recovery: roll forward only", §6)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.coordinator.faults import CoordinatorKilled, FaultPlan, FaultPoint
from dispatchtx.coordinator.queue import QueueState
from dispatchtx.fs import DiskFaultPlan, Fault, FaultKind, FaultRule, Op, SimulatedFS
from dispatchtx.jobs.workloads import (
    STRATEGIES,
    TARGETS,
    BatchResult,
    CampaignCheck,
    FuzzConfig,
    FuzzLedger,
    FuzzPayload,
    FuzzWorkload,
    check_campaign_dir,
    committed_slots,
    execute,
    fuzz_locally,
    fuzz_task,
)
from dispatchtx.jobs.workloads.fuzz import (
    CampaignDir,
    MalformedResult,
    Published,
    encode_delta,
    mutate,
)
from dispatchtx.jobs.workloads.targets import MAX_INPUT, SIGNATURE_PATTERN
from dispatchtx.resources import ProposalState
from dispatchtx.store import ItemStatus, WorkStore, object_id_of
from dispatchtx.transport import SimFaults, SimulatedTransport, TransportClock, Work

ROOT = "/store"
CAMPAIGN = "/campaign"


# -- the targets and the task ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_planted_bug_is_found_within_a_bounded_number_of_batches(name: str) -> None:
    target = TARGETS[name]
    run = fuzz_locally(name, batches=400, batch_size=32, stop_when_found=target.bugs)
    assert set(target.bugs) <= run.crashes.keys(), run.crashes.keys()
    for signature, data in run.crashes.items():
        assert execute(target, data).crash == signature  # each one reproduces
    assert len(run.corpus) > len(target.seeds)  # coverage guided it


def test_the_seeds_parse_clean_and_the_bugs_are_real() -> None:
    for target in TARGETS.values():
        for seed in target.seeds:
            assert execute(target, seed).crash is None
    assert execute(TARGETS["kv_config"], b"[[core]\n").crash == "kv_config.nested-section"
    assert execute(TARGETS["expr_calc"], b"1/(2-2)").crash == "expr_calc.division-by-zero"
    assert execute(TARGETS["json_lite"], b'"\\u00e9"').crash == "json_lite.unicode-escape"


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(TARGETS)), st.binary(max_size=MAX_INPUT + 8))
def test_a_target_never_raises_and_names_its_crashes(name: str, data: bytes) -> None:
    target = TARGETS[name]
    run = execute(target, data)
    assert run.edges and all(edge >> 16 == target.number for edge in run.edges)
    assert run.crash is None or SIGNATURE_PATTERN.fullmatch(run.crash)
    assert execute(target, data) == run  # deterministic


@settings(max_examples=100, deadline=None)
@given(
    st.binary(max_size=MAX_INPUT),
    st.integers(0, 2**32),
    st.sampled_from(STRATEGIES),
    st.integers(1, 16),
)
def test_mutation_is_seeded_and_bounded(data: bytes, seed: int, strategy: str, depth: int) -> None:
    tokens = [b"[", b"include"]
    first = mutate(data, random.Random(seed), strategy, depth, tokens)
    assert first == mutate(data, random.Random(seed), strategy, depth, tokens)
    assert len(first) <= MAX_INPUT


def _work(payload: FuzzPayload) -> Work:
    return Work(1, "kv_config-0000000000000000-0", 3, payload.encode())


def test_the_task_is_deterministic_for_a_payload() -> None:
    target = TARGETS["kv_config"]
    seed = target.seeds[0]
    objects = {object_id_of(seed): seed}
    proposal = ("kv_config:5b", b"[")
    payload = FuzzPayload(
        "kv_config", object_id_of(seed), "havoc", 4, 64, 12345, (), (b"..",), proposal
    )
    first = fuzz_task(_work(payload), objects)
    assert fuzz_task(_work(payload), objects) == first
    result = BatchResult.decode(first)
    assert result.executions == 65
    assert result.proposal == ("kv_config:5b", True)
    assert set(result.new_edges) <= set(result.edges)
    for finding in result.new_inputs:
        assert execute(target, finding.input).edges == frozenset(finding.edges)
    # The known coverage shrinks what is new, and only that.
    known = FuzzPayload(
        "kv_config", object_id_of(seed), "havoc", 4, 64, 12345, result.edges, (b"..",), proposal
    )
    again = BatchResult.decode(fuzz_task(_work(known), objects))
    assert again.edges == result.edges and again.new_edges == () and again.new_inputs == ()
    other = FuzzPayload("kv_config", object_id_of(seed), "havoc", 4, 64, 54321)
    assert fuzz_task(_work(other), objects) != first


def test_the_task_refuses_a_missing_or_wrong_seed_and_bad_payloads() -> None:
    seed = TARGETS["json_lite"].seeds[0]
    payload = FuzzPayload("json_lite", object_id_of(seed), "bytes", 1, 4, 1)
    with pytest.raises(LookupError):
        fuzz_task(_work(payload), {})
    with pytest.raises(ValueError):
        fuzz_task(_work(payload), {object_id_of(seed): seed + b" "})
    with pytest.raises(ValueError):
        fuzz_task(Work(1, "x", 1, '{"target": "nope"}'), {})
    with pytest.raises(ValueError, match="bad fuzz payload"):
        FuzzPayload.decode("[" * 100_000 + "]" * 100_000)  # nested deeper than json recurses


def test_a_malformed_result_is_refused() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000  # deeper than json recurses
    for data in (b"", b"{}", b'{"v": 1, "target": "kv_config"}', b"\xff", deep):
        with pytest.raises(MalformedResult):
            BatchResult.decode(data)
    seed = TARGETS["expr_calc"].seeds[0]
    good = BatchResult.decode(
        fuzz_task(
            _work(FuzzPayload("expr_calc", object_id_of(seed), "bytes", 2, 8, 7)),
            {object_id_of(seed): seed},
        )
    )
    foreign_edge = (TARGETS["kv_config"].number << 16) | 1
    forged = BatchResult(good.target, good.seed, 1, (foreign_edge,), (), (), (), None).encode()
    with pytest.raises(MalformedResult):
        BatchResult.decode(forged)


# -- whole runs under the coordinator -----------------------------------------------


@dataclass
class World:
    transport: SimulatedTransport
    fs: SimulatedFS
    clock: TransportClock
    workload: FuzzWorkload

    def store(self) -> WorkStore:
        return WorkStore(self.fs, ROOT, self.clock, ttl=0.5, retry_pause=lambda seconds: None)

    def coordinator(
        self,
        plan: FaultPlan | None = None,
        *,
        journal_fs: SimulatedFS | None = None,
        max_in_flight: int = 1,
        deadline: float = 2.0,
    ) -> Coordinator:
        config = CoordinatorConfig(
            "coord-a",
            max_in_flight=max_in_flight,
            deadline=deadline,
            journal_path=None if journal_fs is None else "/journal/coord-a",
        )
        coordinator = Coordinator(
            config, self.transport, self.store(), self.workload, faults=plan, journal_fs=journal_fs
        )
        self.workload.attach(coordinator.tables, dispatch_log=coordinator.dispatch_log)
        return coordinator


def make_world(
    *,
    workers: int = 3,
    budget: int = 24,
    seed: int = 0,
    faults: SimFaults | None = None,
    disk: SimulatedFS | None = None,
) -> World:
    transport = SimulatedTransport(workers, fuzz_task, seed=seed, faults=faults or SimFaults())
    fs = SimulatedFS(seed=seed) if disk is None else disk
    config = FuzzConfig(budget=budget, batch_size=16, rng_seed=seed)
    return World(
        transport, fs, TransportClock(transport, 1.7e9), FuzzWorkload(fs, CAMPAIGN, config)
    )


def assert_clean_end(world: World, coordinator: Coordinator) -> CampaignCheck:
    coordinator.shutdown()
    workload = world.workload
    ledger = workload.ledger
    assert ledger.violations == []
    assert ledger.effects_applied_twice == 0
    assert workload.remaining() == 0
    assert coordinator.leaks() == []
    assert workload.leaks() == []
    assert coordinator.stats["compensation failures"] == 0
    states = coordinator.store.items()
    assert {state.status for state in states} == {ItemStatus.DONE}
    assert all(workload.status(item) is QueueState.DONE for item in workload.items)
    assert len(workload.items) <= workload.config.budget
    # Proposal attempts conserved: what the board counted is what went out.
    counted, sent = workload.proposal_attempts()
    assert counted == sent
    assert ProposalState.DISPATCHED not in workload.proposal_states()
    world.fs.fault = None  # the audit reads a healthy disk
    check = check_campaign_dir(
        world.fs, CAMPAIGN, committed=committed_slots(states), coverage=workload.coverage()
    )
    assert check.problems == []
    assert check.deltas == len(states)
    return check


def test_a_full_run_commits_every_item_once_using_every_resource_kind() -> None:
    world = make_world(budget=30)
    coordinator = world.coordinator()
    coordinator.run(max_steps=20_000)
    check = assert_clean_end(world, coordinator)
    workload, ledger = world.workload, world.workload.ledger
    assert coordinator.stats["committed"] == len(workload.items) == 30
    assert ledger.reruns == 0 and ledger.local_skipped == Counter()
    # Corpus entries became seeds, seeds became items, up to the budget.
    assert check.corpus_entries > 0 and check.coverage
    initial = sum(len(TARGETS[t].seeds) for t in workload.config.targets) * 2
    assert len(workload.items) > initial
    # Each committed dispatch rewarded the bandit and fed the selector once.
    adapters = workload.adapters
    effects = Counter(effect for _, _, effect in ledger.local_effects)
    assert effects["bandit reward"] == effects["algorithm feedback"] == 30
    assert sum(adapters.params.observations(arm) for arm in adapters.params.arms()) == 30
    assert all(adapters.algorithms.pulls(stage) >= 1 for stage in STRATEGIES)
    # Proposals were verified by workers; accepted tokens joined a dictionary.
    states = workload.proposal_states()
    assert states[ProposalState.ACCEPTED] >= 1 and effects["proposal verdict"] >= 1
    assert any(workload.dictionary(target) for target in workload.config.targets)
    # Pairing: every family went to a worker; shards and targets were held.
    assert coordinator.stats["objects shipped"] >= 1
    for target in workload.config.targets:
        leases = sum(adapters.shards.lease_count(f"coverage/{target}", f"view-{i}") for i in (0, 1))
        assert leases >= 1


def test_triage_is_idempotent_per_item_and_slot() -> None:
    world = make_world(workers=1, budget=6)
    coordinator = world.coordinator()
    coordinator.run(max_steps=5_000)
    assert_clean_end(world, coordinator)
    workload, ledger = world.workload, world.workload.ledger
    before = (dict(ledger.local_effects), workload.coverage(), len(workload.items))
    linked = ledger.files[Published.LINKED]
    # Rerun every committed triage, as the owner and as a peer: files are
    # found in place, nothing local is applied again.
    for state in coordinator.store.items():
        assert state.token is not None
        result = coordinator.store.stored_result(state.work_id)
        workload.triage(state.work_id, state.token, result, owner=True)
        workload.triage(state.work_id, state.token, result, owner=False)
    assert (dict(ledger.local_effects), workload.coverage(), len(workload.items)) == before
    assert ledger.files[Published.LINKED] == linked
    assert ledger.files[Published.PRESENT] >= 2 * 6
    assert ledger.reruns == 2 * 6 and ledger.effects_applied_twice == 0
    assert ledger.violations == []


@pytest.mark.parametrize(
    "point",
    [
        FaultPoint.KILL_AFTER_STORE_COMMIT,
        FaultPoint.KILL_MID_TRIAGE,
        FaultPoint.KILL_AFTER_TRIAGE,
        FaultPoint.KILL_AFTER_COMPLETE,
    ],
)
def test_a_coordinator_killed_at_a_commit_stage_is_rolled_forward_without_doubling(
    point: FaultPoint,
) -> None:
    world = make_world(budget=16, seed=2)
    first = world.coordinator(FaultPlan(at_least_once=[point]))
    with pytest.raises(CoordinatorKilled):
        first.run(max_steps=20_000)
    # The process died: its tables and adapters are gone; the store, the
    # campaign directory (process kill: the page cache survives) and the
    # workers remain. The workload's queue stands in for the journal.
    world.fs.crash("process")
    restarted = world.coordinator()
    assert restarted.incarnation == first.incarnation + 1
    restarted.run(max_steps=20_000)
    assert_clean_end(world, restarted)
    ledger = world.workload.ledger
    if point in (FaultPoint.KILL_AFTER_STORE_COMMIT, FaultPoint.KILL_MID_TRIAGE):
        # Every result of the killed group had passed the fence (group commit).
        rolled = restarted.stats["rolled forward"]
        assert rolled >= 1
        assert ledger.local_skipped["state lost"] == rolled  # died with the killed process
    if point is FaultPoint.KILL_AFTER_TRIAGE:
        assert ledger.reruns == 1 and ledger.files[Published.PRESENT] >= 1
        # The triaged one was applied once, before the kill; the rest of its
        # group (past the fence, not triaged) lost their local state too.
        assert ledger.local_skipped["state lost"] == restarted.stats["rolled forward"] >= 1
    assert ledger.effects_applied_twice == 0


@pytest.mark.parametrize(
    "point",
    [
        FaultPoint.SEND_AFTER_RESERVATIONS,
        FaultPoint.MESSAGE_BUILD,
        FaultPoint.OBJECT_TRANSFER,
        FaultPoint.SEND,
        FaultPoint.AMBIGUOUS_SEND,
        FaultPoint.BEGIN_COMMIT_EIO,
        FaultPoint.TRIAGE_EIO,
        FaultPoint.COMPLETE_EIO,
        FaultPoint.STALE_RESULT,
        FaultPoint.DUPLICATE_RESULT,
    ],
)
def test_each_fault_point_leaves_nothing_held_and_attempts_conserved(point: FaultPoint) -> None:
    world = make_world(budget=16, seed=4)
    plan = FaultPlan({point: 0.25}, seed=4, at_least_once=[point])
    coordinator = world.coordinator(plan, deadline=0.5)
    coordinator.run(max_steps=50_000)
    assert plan.fired[point] >= 1
    assert_clean_end(world, coordinator)
    if point is FaultPoint.COMPLETE_EIO:
        # triage ran again after complete failed: the local effects did not
        assert world.workload.ledger.local_skipped["already applied"] >= 1


def test_with_a_journal_the_dispatch_log_marks_local_effects_applied() -> None:
    world = make_world(budget=12, seed=5)
    journal_disk = SimulatedFS(seed=9)
    plan = FaultPlan(
        {FaultPoint.COMPLETE_EIO: 0.3}, seed=5, at_least_once=[FaultPoint.COMPLETE_EIO]
    )
    coordinator = world.coordinator(plan, journal_fs=journal_disk)
    coordinator.run(max_steps=20_000)
    assert_clean_end(world, coordinator)
    # One journaled mark per (item, commit slot), even where triage ran again
    # after complete failed.
    journal = journal_disk.read("/journal/coord-a")
    assert journal.count(b'"dispatch-log.applied"') == coordinator.stats["committed"] == 12
    assert world.workload.ledger.local_skipped["already applied"] >= 1
    assert coordinator.dispatch_log is not None and coordinator.dispatch_log.leaks() == []


def test_disk_errors_in_the_campaign_directory_are_retried_to_a_consistent_end() -> None:
    rules = [
        FaultRule(Fault(FaultKind.EIO), op=Op.LINK, nth=n, path_contains=CAMPAIGN)
        for n in (0, 3, 7)
    ] + [FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC_DIR, nth=5, path_contains=CAMPAIGN)]
    disk = SimulatedFS(seed=6, fault=DiskFaultPlan(*rules))
    world = make_world(budget=12, seed=6, disk=disk)
    coordinator = world.coordinator()
    coordinator.run(max_steps=20_000)
    assert coordinator.stats["triage failures"] >= 1
    assert_clean_end(world, coordinator)


def test_transport_faults_lost_stale_duplicate_results_still_end_clean() -> None:
    faults = SimFaults(duplicate=0.2, stale=0.05, loss=0.05, garble=0.05, stale_seconds=5.0)
    world = make_world(budget=18, seed=7, faults=faults)
    for fault in ("duplicate", "stale", "loss", "garble"):
        world.transport.force(fault)
    coordinator = world.coordinator(deadline=1.0)
    coordinator.run(max_steps=50_000)
    assert coordinator.stats["stale or duplicate results dropped"] >= 1
    assert_clean_end(world, coordinator)


def test_a_peer_rolls_forward_and_adopts_what_a_coordinator_killed_for_good_left() -> None:
    disk = SimulatedFS(seed=8)
    ledger = FuzzLedger()
    config = FuzzConfig(budget=20, batch_size=16, rng_seed=8)
    coordinators: list[Coordinator] = []
    workloads: list[FuzzWorkload] = []
    for index, name in enumerate(("coord-a", "coord-b")):
        transport = SimulatedTransport(2, fuzz_task, seed=index)
        store = WorkStore(
            disk, ROOT, TransportClock(transport, 1.7e9), ttl=0.5, retry_pause=lambda seconds: None
        )
        workload = FuzzWorkload(disk, CAMPAIGN, config, ledger=ledger)
        plan = FaultPlan({FaultPoint.KILL_AFTER_STORE_COMMIT: 0.05}, seed=3) if index == 0 else None
        coordinator = Coordinator(
            CoordinatorConfig(name, deadline=1.0), transport, store, workload, faults=plan
        )
        workload.attach(coordinator.tables, dispatch_log=coordinator.dispatch_log)
        coordinators.append(coordinator)
        workloads.append(workload)
    first, peer = coordinators
    survivor = workloads[1]
    first_alive = True
    unfinished = {ItemStatus.FREE, ItemStatus.CLAIMED, ItemStatus.ABANDONED, ItemStatus.COMMITTING}
    for step in range(100_000):
        if first_alive and step % 2 == 0:
            try:
                first.step()
            except CoordinatorKilled:
                first_alive = False  # for good: its tables and adapters are gone
            continue
        peer.step()
        if first_alive or step % 20:
            continue
        states = peer.store.items()
        for state in states:
            if state.status in unfinished:
                survivor.adopt(state.work_id)
        idle = survivor.remaining() == 0 and not len(peer.tables)
        if idle and all(state.status is ItemStatus.DONE for state in states):
            break
    else:
        pytest.fail("the survivor never finished")
    assert not first_alive
    assert peer.stats["rolled forward for a peer"] >= 1
    # coord-a had claimed items only it knew: without adopting them the
    # store would keep them claimed by a dead owner forever.
    assert survivor.stats["items adopted"] >= 1
    peer.shutdown()
    # The killed coordinator's local state died with it: only the shared
    # store and directory are checked on its behalf; the survivor leaks nothing.
    assert peer.leaks() == [] and survivor.leaks() == []
    assert ledger.violations == [] and ledger.effects_applied_twice == 0
    counted, sent = survivor.proposal_attempts()
    assert counted == sent
    states = peer.store.items()
    assert {state.status for state in states} == {ItemStatus.DONE}
    check = check_campaign_dir(
        disk,
        CAMPAIGN,
        committed=committed_slots(states),
        coverage=workloads[0].coverage() | survivor.coverage(),
    )
    assert check.problems == []


# -- the audit --------------------------------------------------------------------


def test_the_checker_finds_what_a_broken_triage_would_leave() -> None:
    world = make_world(workers=2, budget=8)
    coordinator = world.coordinator()
    coordinator.run(max_steps=10_000)
    check = assert_clean_end(world, coordinator)
    assert check.consistent
    fs, directory = world.fs, CampaignDir(world.fs, CAMPAIGN)
    item = world.workload.items[0]
    slot = committed_slots(coordinator.store.items())[item]
    # A second commit slot's delta for one item, a corpus entry under the
    # wrong name, a crash file that does not reproduce, an edge never triaged.
    directory.publish(CampaignDir.DELTAS, f"{item}.{slot + 7}", encode_delta("kv_config", [65537]))
    directory.publish(CampaignDir.CORPUS, "0" * 64, b"not that")
    directory.publish("crashes/kv_config.nested-section", f"{item}.{slot}", b"a = b\n")
    broken = check_campaign_dir(
        fs,
        CAMPAIGN,
        committed=committed_slots(coordinator.store.items()),
        coverage=world.workload.coverage(),
    )
    text = "\n".join(broken.problems)
    assert f"{item}: files under commit slots" in text
    assert "corpus/" + "0" * 64 in text
    assert "reproduces as None" in text
    assert "coverage:" in text
    assert not broken.consistent
    # A committed item whose delta is missing: a lost shared effect.
    lost = check_campaign_dir(fs, CAMPAIGN, committed={f"{item[:-1]}9": 1})
    assert any("has no coverage delta" in problem for problem in lost.problems)
