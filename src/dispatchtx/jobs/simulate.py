"""Whole-system simulation: coordinators, simulated workers, the shared store
on a simulated disk, per-host virtual clocks, and random fault schedules
(docs/design.md). The very same coordinator and store code runs here as on
real MPI ranks and a real disk.

Each schedule draws its shape (coordinators, workers, items, in-flight
depth) and its faults (coordinator fault points, transport faults, disk
faults, coordinator kills with a process kill or a power loss, one
coordinator killed for good) from one seed, runs until every item is done
or quarantined, and checks:

- nothing leaked: no lease, dispatch or reservation held by a live
  coordinator; no item left CLAIMED or COMMITTING in the store;
- nothing applied twice: no item committed under two tokens, no local
  effect applied twice for one (item, commit slot), no wrong result;
- every item done (or quarantined, and reported);
- no false object-cache hit: a worker never ran a task without the object
  content it needed.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.coordinator.audit import audit, unsettled_items
from dispatchtx.coordinator.faults import CoordinatorKilled, FaultPlan, FaultPoint
from dispatchtx.fs import JOURNAL_DISK_FAULTS, RandomDiskFaults, SimulatedCrash, SimulatedFS
from dispatchtx.jobs.chain_check import (
    Belief,
    OwnerEffect,
    RecordingStore,
    check_chains,
    record_owner_effects,
)
from dispatchtx.jobs.journal_check import journal_differs
from dispatchtx.jobs.ledger import CompensationLedger, checked_tables
from dispatchtx.jobs.resource_check import TrueCounts, fuzz_counts
from dispatchtx.jobs.workloads.fuzz import (
    FuzzConfig,
    FuzzLedger,
    FuzzWorkload,
    check_campaign_dir,
    committed_slots,
    fuzz_task,
)
from dispatchtx.jobs.workloads.hash import HashWorkload, TriageLedger, hash_task
from dispatchtx.journal import FsyncPolicy, JournalCorrupt
from dispatchtx.store import ItemStatus, StoreError, WorkStore
from dispatchtx.transport import SimFaults, SimulatedTransport, TransportClock

__all__ = ["ScheduleReport", "main", "run_schedule", "run_schedules"]

ROOT = "/store"
CAMPAIGN = "/campaign"
KILL_POINTS: tuple[FaultPoint, ...] = (
    FaultPoint.KILL_AFTER_STORE_COMMIT,
    FaultPoint.KILL_MID_TRIAGE,
    FaultPoint.KILL_AFTER_TRIAGE,
    FaultPoint.KILL_AFTER_COMPLETE,
)
# Transport faults, by the names of docs/design.md where it names them.
TRANSPORT_FAULTS: dict[str, str] = {
    "stale": FaultPoint.STALE_RESULT.value,
    "duplicate": FaultPoint.DUPLICATE_RESULT.value,
    "crash": "worker-crash",
    "loss": "result-lost",
    "reorder": "results-reordered",
    "garble": "result-garbled",
    "send_failure": "transport-send-failure",
    "ambiguous_send": "transport-ambiguous-send",
}
# Steps between checks of a journal against memory (each incarnation's end
# is checked as well).
JOURNAL_CHECK_EVERY = 64
# The most steps a paused coordinator's peer runs before the pause ends.
MAX_PAUSE_STEPS = 50_000


class StopSignal(BaseException):
    """A stop signal arrived mid-dispatch: its handler compensated every
    PREPARING and ACTIVE dispatch (`tables.shutdown()`), and the process
    ends. The sweep then meets dispatches that are still PREPARING."""


def _drawn_apart(seed: int, schedule: int, what: str) -> random.Random:
    """A generator of its own for one draw of a schedule: a draw added later
    leaves the schedule's other draws as they were."""
    return random.Random(f"{seed}:{schedule}:{what}")


def _stop_signal_step(seed: int, schedule: int) -> int | None:
    """The step at which a stop signal arrives in this schedule, if any;
    drawn apart so that the other draws stay as they were."""
    rng = _drawn_apart(seed, schedule, "stop-signal")
    return rng.randint(1, 400) if rng.random() < 0.25 else None


@dataclass
class Stall:
    """Where coord-0 of a two-coordinator schedule is paused: inside its
    `nth` store call `call`, while its peer's clock runs `seconds` on. With
    `until_taken_over`, the pause ends as soon as the peer claims the paused
    item: coord-0 then resumes with the peer's claim at the chain's head, not
    a finished item (the fence's hardest case)."""

    call: str  # "begin_commit" or "complete"
    nth: int
    seconds: float
    until_taken_over: bool = False
    calls: int = 0
    peer_crashed: bool = False


def _stall_draw(seed: int, schedule: int, n_hosts: int) -> Stall | None:
    """Half the two-coordinator schedules pause coord-0 once; drawn apart so
    that the other draws stay as they were."""
    rng = _drawn_apart(seed, schedule, "stall")
    if n_hosts < 2 or rng.random() >= 0.5:
        return None
    call = rng.choice(("begin_commit", "complete"))
    return Stall(call, rng.randint(1, 4), rng.choice((1.0, 3.0, 10.0)), rng.random() < 0.5)


@dataclass
class Host:
    """One coordinator with its workers (one `mpiexec` job in real runs)."""

    name: str
    transport: SimulatedTransport
    clock: TransportClock
    workload: HashWorkload | FuzzWorkload
    coordinator: Coordinator | None
    local_disk: SimulatedFS  # the host's own disk, for its journal
    dead_for_good: bool = False
    # Every move of the tables, checked against the compensation ledger
    # (one per incarnation: an incarnation's dispatches die with it).
    ledgers: list[CompensationLedger] = field(default_factory=list)
    incarnations: list[int] = field(default_factory=list)  # in the order they started
    # The counting adapters of the incarnation running, followed through its ledger.
    counts: list[TrueCounts] = field(default_factory=list)


@dataclass
class ScheduleReport:
    seed: int
    schedule: int
    shape: dict[str, Any]
    fired: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list, repr=False)  # for debugging a schedule


def _commit_batch(rng: random.Random) -> int:
    # Most schedules group commits (one file for a poll's commit records).
    return 1 if rng.random() < 0.4 else rng.choice((2, 3, 1024))


def run_schedule(seed: int, schedule: int, *, max_steps: int = 200_000) -> ScheduleReport:
    rng = random.Random(f"{seed}:{schedule}")
    n_hosts = rng.choice((1, 1, 2))
    n_items = rng.randint(4, 16)
    shape: dict[str, Any] = {
        "coordinators": n_hosts,
        "items": n_items,
        "workers": [rng.randint(1, 4) for _ in range(n_hosts)],
        "max_in_flight": rng.choice((1, 1, 2, 4)),
        "disk_fault_rate": rng.choice((0.0, 0.0, 0.01, 0.03)),
        "kills": rng.randint(0, 2),
        "kill_one_for_good": n_hosts == 2 and rng.random() < 0.4,
        # Half the schedules run the campaign's fuzzing workload: every
        # resource kind (targets, shards, bandit, algorithm selection,
        # pairing, proposals, object cache) on every dispatch.
        "workload": "fuzz" if rng.random() < 0.5 else "hash",
        # Half with group commit (store batches of 2, 3 or any size); drawn
        # apart so that the other draws, and thus the schedules of earlier
        # runs, stay as they were.
        "commit_batch": _commit_batch(_drawn_apart(seed, schedule, "group")),
    }
    fuzzing = shape["workload"] == "fuzz"
    report = ScheduleReport(seed, schedule, shape)
    # A stale "absent" sticks for a few look-ups of its path, as a cached
    # negative look-up does (drawn apart so that the other draws stay).
    absent_rng = _drawn_apart(seed, schedule, "absent")
    shape["absent_repeats"] = absent_rng.choice((0, 2, 4))
    # A real miss is cached as well, with this probability: a peer's new slot
    # stays unseen while a link onto it fails with EEXIST (the claim race a
    # read-back must not decide).
    shape["miss_cached"] = absent_rng.choice((0.0, 0.1, 0.5))
    disk_faults = RandomDiskFaults(
        random.Random(rng.random()),
        shape["disk_fault_rate"],
        absent_repeats=shape["absent_repeats"],
        miss_cached=shape["miss_cached"],
    )
    fs = SimulatedFS(seed=rng.randrange(2**32), fault=disk_faults)
    fs.on_miss = disk_faults.cache_miss
    # The coordinators' own disks fail apart, journal calls included (drawn
    # apart so that the other draws stay as they were).
    journal_rng = _drawn_apart(seed, schedule, "journal-disk")
    shape["journal_disk_fault_rate"] = journal_rng.choice((0.0, 0.01, 0.03))
    journal_faults = RandomDiskFaults(
        journal_rng, shape["journal_disk_fault_rate"], JOURNAL_DISK_FAULTS
    )
    ttl = 0.5
    shared_items = HashWorkload(n_items).items
    # One ledger of triage effects, as the shared corpus would be.
    ledger = TriageLedger()
    fuzz_ledger = FuzzLedger()
    expected = HashWorkload(n_items)
    hosts: list[Host] = []
    owner_effects: list[OwnerEffect] = []  # every triage run as the item's owner
    for index in range(n_hosts):
        sim_faults = SimFaults(
            send_failure=rng.choice((0.0, 0.05)),
            ambiguous_send=rng.choice((0.0, 0.03)),
            loss=rng.choice((0.0, 0.03)),
            duplicate=rng.choice((0.0, 0.1)),
            reorder=rng.choice((0.0, 0.1)),
            stale=rng.choice((0.0, 0.03)),
            garble=rng.choice((0.0, 0.03)),
            crash=rng.choice((0.0, 0.0, 0.02)),
            stale_seconds=3.0,
        )
        transport = SimulatedTransport(
            shape["workers"][index],
            fuzz_task if fuzzing else hash_task,
            seed=rng.randrange(2**32),
            faults=sim_faults,
        )
        workload: HashWorkload | FuzzWorkload
        if fuzzing:
            fuzz = FuzzConfig(budget=n_items, batch_size=4, rng_seed=rng.randrange(2**16))
            workload = FuzzWorkload(fs, CAMPAIGN, fuzz, ledger=fuzz_ledger)
        else:
            workload = HashWorkload(n_items, ledger=ledger)
        record_owner_effects(workload, f"coord-{index}", owner_effects)
        clock = TransportClock(transport, 1.7e9 + rng.uniform(-5, 5))
        local_disk = SimulatedFS(seed=rng.randrange(2**32), fault=journal_faults)
        hosts.append(Host(f"coord-{index}", transport, clock, workload, None, local_disk))

    kills_left = shape["kills"]
    stall = _stall_draw(seed, schedule, n_hosts)
    shape["stall"] = (
        None
        if stall is None
        else f"{stall.call} #{stall.nth}, {stall.seconds} s"
        + (", until taken over" if stall.until_taken_over else "")
    )
    beliefs: list[Belief] = []  # every claim won and commit made, once durable
    journal_policy = rng.choice(list(FsyncPolicy))
    shape["journal_policy"] = journal_policy.value
    plan_rates: dict[FaultPoint, float] = {
        point: rng.choice((0.0, 0.02, 0.05))
        for point in FaultPoint
        if point not in KILL_POINTS and point is not FaultPoint.WORKER_HUNG
    }

    def start(host: Host) -> None:
        plan_seed = rng.randrange(2**32)
        rates = dict(plan_rates)
        kill_rng = random.Random(plan_seed)
        if kills_left > 0:
            rates[kill_rng.choice(KILL_POINTS)] = 0.1
        plan = FaultPlan(rates, seed=plan_seed)
        config = CoordinatorConfig(
            host.name,
            max_in_flight=shape["max_in_flight"],
            deadline=1.0,
            journal_path=f"/journals/{host.name}.journal",
            journal_policy=journal_policy,
            commit_batch=shape["commit_batch"],
        )
        # A start that hits a disk fault (registering its incarnation) exits
        # and is started again, as a supervisor would.
        for _ in range(100):
            store = RecordingStore(
                fs,
                ROOT,
                host.clock,
                ttl=ttl,
                retry_pause=lambda seconds: None,
                beliefs=beliefs,
                before_call=before_store_call if host is hosts[0] else None,
            )
            moves = CompensationLedger()
            try:
                host.coordinator = Coordinator(
                    config,
                    host.transport,
                    store,
                    host.workload,
                    faults=plan,
                    journal_fs=host.local_disk,
                    wrap_tables=checked_tables(moves),
                )
                host.ledgers.append(moves)
                if isinstance(host.workload, FuzzWorkload):
                    host.counts = fuzz_counts(host.workload.adapters, moves)
                incarnation = host.coordinator.incarnation
                if host.incarnations and incarnation <= max(host.incarnations):
                    report.violations.append(
                        f"{host.name} started as incarnation {incarnation} after "
                        f"{host.incarnations}: incarnations out of order"
                    )
                host.incarnations.append(incarnation)
                return
            except (StoreError, OSError):
                report.counts["failed starts"] += 1
            except JournalCorrupt as error:  # its own journal, written by the code under test
                report.violations.append(f"{host.name} cannot restart: {error}")
                host.dead_for_good = True
                return
        raise RuntimeError(f"{host.name} could not start in 100 attempts")

    def check_journal(host: Host) -> None:
        if host.coordinator is not None:
            problem = journal_differs(host.coordinator, host.local_disk)
            if problem is not None:
                report.violations.append(f"{host.name} step {steps}: {problem}")

    def gather(host: Host) -> None:
        """An incarnation ends: its journal is checked, its counts kept."""
        coordinator = host.coordinator
        if coordinator is None:
            return
        check_journal(host)
        for counted in host.counts:
            report.violations.extend(f"{host.name}: {problem}" for problem in counted.problems())
        report.counts.update(coordinator.stats.counts)
        for point, count in coordinator.faults.fired.items():
            report.fired[point.value] += count

    def adopt_orphans(live: list[Host]) -> bool:
        """Items only a peer killed for good knew are still unsettled in the
        store: the live coordinators take them on. True while any is left."""
        adopting = [h.coordinator.adopt_orphans() for h in live if h.coordinator is not None]
        return any(adopting)

    steps = 0
    killed_for_good = False
    stop_signal_at = _stop_signal_step(seed, schedule)
    shape["stop_signal_at"] = stop_signal_at

    def arm_stop_signal(host: Host) -> None:
        """The host's next send is interrupted by a stop signal."""

        def handler(worker: int, work: object) -> None:
            host.transport.on_send = None
            if host.coordinator is not None:
                host.coordinator.tables.shutdown()
            raise StopSignal

        host.transport.on_send = handler

    def step_host(host: Host, *, while_peer_paused: bool = False) -> bool:
        """One step of `host`'s coordinator, with what a kill or a stop
        signal brings; False once the code under test crashed. While its
        peer is paused mid-call, a kill is a process kill: a power loss
        would end the paused peer too."""
        nonlocal kills_left, killed_for_good
        assert host.coordinator is not None
        try:
            host.coordinator.step()
            if steps % JOURNAL_CHECK_EVERY == 0 and not while_peer_paused:
                check_journal(host)
        except StopSignal:
            report.fired["stop-signal-mid-dispatch"] += 1
            gather(host)
            host.local_disk.crash("process")
            host.coordinator = None
            start(host)
        except (CoordinatorKilled, SimulatedCrash):
            report.fired["coordinator-killed"] += 1
            kills_left -= 1
            report.counts["kills"] += 1
            # A process kill ends this coordinator; a power loss ends the
            # machine: the shared store's disk and every coordinator on it.
            power = rng.random() < 0.5 and not while_peer_paused
            report.fired["power-loss" if power else "process-kill"] += 1
            victims = [h for h in hosts if h.coordinator is not None] if power else [host]
            if power:
                fs.crash("power")
            for victim in victims:
                gather(victim)
                victim.local_disk.crash("power" if power else "process")
                victim.coordinator = None
                if shape["kill_one_for_good"] and not killed_for_good and victim is hosts[0]:
                    killed_for_good = True
                    victim.dead_for_good = True
                    report.fired["killed-for-good"] += 1
                    continue
                start(victim)  # the workload's attach offers its taken items again
        except Exception as error:  # a crash of the code under test is a violation
            report.violations.append(f"{host.name} raised {type(error).__name__}: {error}")
            return False
        return True

    def pause(call: str, work_id: str) -> None:
        """coord-0 stops inside a store call (SIGSTOP, a long GC pause, a
        swapped-out VM) while coord-1 runs on: coord-0's claims expire and
        are taken over, its committed items are rolled forward by the peer;
        then coord-0 resumes the call with its old token, which the store's
        fence must refuse (or, for `complete`, find done)."""
        peer = hosts[1]
        assert stall is not None
        report.fired[f"coordinator-paused-in-{call.replace('_', '-')}"] += 1
        started = peer.transport.now()
        seen = len(beliefs)
        for _ in range(MAX_PAUSE_STEPS):
            if peer.transport.now() - started >= stall.seconds:
                return
            if peer.dead_for_good or peer.coordinator is None:
                return
            if not step_host(peer, while_peer_paused=True):
                stall.peer_crashed = True  # the schedule ends after this step
                return
            if stall.until_taken_over and any(
                b.kind == "claim" and b.work_id == work_id and b.owner.coordinator == peer.name
                for b in beliefs[seen:]
            ):
                report.counts["pauses ended by a takeover"] += 1
                return
            seen = len(beliefs)

    def before_store_call(call: str, work_id: str) -> None:
        if stall is not None and call == stall.call and stall.calls < stall.nth:
            stall.calls += 1
            if stall.calls == stall.nth:
                pause(call, work_id)

    for host in hosts:
        start(host)
    while True:
        live = [h for h in hosts if not h.dead_for_good]
        if all(h.coordinator is not None and h.coordinator.idle for h in live) and not (
            fuzzing and adopt_orphans(live)
        ):
            break
        steps += 1
        if steps > max_steps:
            report.violations.append(f"not done after {max_steps} steps (livelock or leak)")
            break
        if steps % 500 == 0:
            # A launcher restarts crashed workers; a worker found lost by its
            # deadlines but alive rejoins. A revived one has an empty cache.
            for host in live:
                if host.coordinator is None:
                    continue
                for worker in sorted(host.coordinator.lost_workers):
                    if host.transport.is_crashed(worker):
                        host.transport.revive(worker)
                    host.coordinator.readmit(worker)

        host = hosts[steps % len(hosts)]
        if host.dead_for_good or host.coordinator is None:
            continue
        if steps == stop_signal_at:
            arm_stop_signal(host)
        if not step_host(host) or (stall is not None and stall.peer_crashed):
            break

    for host in hosts:
        if host.coordinator is not None and not host.dead_for_good:
            try:
                host.coordinator.shutdown()
            except Exception as error:
                report.violations.append(f"{host.name} shutdown raised {error!r}")
            gather(host)
            # Every resource kind, per adapter (leases, assignments, pending
            # tokens, proposal states), and what the workload finds wrong.
            run_audit = audit(host.coordinator)
            report.violations.extend(f"{host.name} leaked {leak}" for leak in run_audit.leaks)
            report.violations.extend(f"{host.name}: {problem}" for problem in run_audit.problems)
            report.counts.update(run_audit.figures)
        for name, count in host.transport.stats.items():
            if name in TRANSPORT_FAULTS and count:
                report.fired[TRANSPORT_FAULTS[name]] += count
    report.fired.update(disk_faults.fired)
    report.fired.update({f"journal-{name}": n for name, n in journal_faults.fired.items()})
    report.hosts = hosts
    for host in hosts:
        for moves in host.ledgers:
            report.violations.extend(f"{host.name}: {v}" for v in moves.violations)
            report.counts["ledger moves checked"] += moves.moves_checked

    # What must hold after the run, re-derived from the store and the ledger.
    fs.fault = fs.on_miss = None
    store = WorkStore(fs, ROOT, hosts[0].clock, ttl=ttl, retry_pause=lambda seconds: None)
    report.violations.extend(check_chains(store, beliefs, owner_effects))
    states = store.survey().states  # an unreadable item is a violation, reported above
    for host in hosts:
        registered = store.incarnations(host.name)
        if registered and host.incarnations[-1] != max(registered):
            report.violations.append(
                f"{host.name} last ran as incarnation {host.incarnations[-1]}, but the store "
                f"holds incarnations up to {max(registered)}"
            )
    for state in unsettled_items(store):
        report.violations.append(f"{state.work_id} left {state.status.value} in the store")
    report.counts["quarantined"] += sum(
        1 for state in states if state.status is ItemStatus.QUARANTINED
    )
    if report.counts["task errors"]:
        report.violations.append(
            f"{report.counts['task errors']} tasks ran without their object (false cache hit)"
        )
    if fuzzing:
        check = check_campaign_dir(fs, CAMPAIGN, committed=committed_slots(states))
        report.violations.extend(check.problems)
        report.violations.extend(fuzz_ledger.violations)
        if fuzz_ledger.effects_applied_twice:
            report.violations.append(f"{fuzz_ledger.effects_applied_twice} effects applied twice")
        report.counts["triage reruns"] += fuzz_ledger.reruns
        report.counts["coverage edges"] += len(check.coverage)
        return report
    known = {state.work_id for state in states}
    for item in shared_items:
        if item not in known:
            report.violations.append(f"{item} never reached the store")
        elif store.read(item).status is ItemStatus.DONE:
            digest = ledger.digests.get(item)
            if digest != expected.expected(item):
                report.violations.append(f"{item} is done but its result was never triaged")
    report.violations.extend(ledger.violations)
    if ledger.effects_applied_twice:
        report.violations.append(f"{ledger.effects_applied_twice} local effects applied twice")
    report.counts["triage reruns"] += ledger.reruns
    return report


@dataclass
class SimulationSummary:
    seed: int
    schedules: int
    seconds: float = 0.0
    fired: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    failed: list[tuple[int, list[str]]] = field(default_factory=list)
    grouped: int = 0  # schedules whose coordinators ran group commit (commit_batch > 1)

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "schedules": self.schedules,
            "schedules_with_group_commit": self.grouped,
            "seconds": round(self.seconds, 3),
            "violations": len(self.failed),  # schedules with at least one
            "failed_schedules": [{"schedule": n, "violations": v} for n, v in self.failed],
            "faults_fired": dict(sorted(self.fired.items())),
            "counts": dict(sorted(self.counts.items())),
        }


def run_schedules(seed: int, schedules: int, *, progress: bool = False) -> SimulationSummary:
    # Thousands of injected faults each log a line: keep only errors.
    logging.getLogger("dispatchtx").setLevel(logging.ERROR)
    summary = SimulationSummary(seed, schedules)
    started = time.perf_counter()
    for schedule in range(schedules):
        report = run_schedule(seed, schedule)
        summary.fired.update(report.fired)
        summary.counts.update(report.counts)
        summary.grouped += report.shape["commit_batch"] > 1
        if report.violations:
            summary.failed.append((schedule, report.violations))
        if progress and (schedule % 50 == 0 or schedule == schedules - 1):
            print(
                f"\rschedule {schedule + 1}/{schedules}  violations {len(summary.failed)}",
                end="",
                file=sys.stderr,
                flush=True,
            )
    if progress:
        print(file=sys.stderr)
    summary.seconds = time.perf_counter() - started
    return summary


def main(schedules: int, seed: int, json_path: str | None) -> int:
    summary = run_schedules(seed, schedules, progress=True)
    result = summary.as_json()
    print(f"simulate: {schedules} schedules, seed {seed}, {summary.seconds:.1f} s")
    print(f"schedules with group commit (commit_batch > 1): {summary.grouped}")
    print(f"{'fault point':<32}{'fired':>10}")
    for name, count in result["faults_fired"].items():
        print(f"{name:<32}{count:>10}")
    for name in (
        "dispatches",
        "committed",
        "triage reruns",
        "rolled forward",
        "rolled forward for a peer",
        "kills",
        "quarantined",
    ):
        print(f"{name:<32}{summary.counts[name]:>10}")
    print(f"violations: {result['violations']}")
    for schedule, violations in summary.failed[:10]:
        print(f"  seed {seed} schedule {schedule}: {'; '.join(violations[:3])}")
    if json_path:
        with open(json_path, "w") as out:
            json.dump(result, out, indent=2)
    return 1 if summary.failed else 0
