"""One coordinator and its workers as one `mpiexec` job, on real MPI ranks,
with the shared store on the real disk (docs/design.md: each coordinator runs
as its own job, so one can be killed and restarted while others go on).

    mpiexec -n 5 python -m dispatchtx.jobs.mpi_job --store DIR --report FILE [...]

Rank 0 runs the coordinator over `MPITransport`; every other rank runs the
worker loop. The coordinator writes a JSON report (its counts, faults fired,
leaks, the store's view of every item, results per second) to `--report`
before it stops the workers. A worker told to hang (`--hang-rank`) SIGSTOPs
itself, as a lost worker does in real runs: the coordinator's deadline finds
it, and the caller ends the job by killing its process group.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from typing import Any

from dispatchtx import COMPILED
from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.coordinator.audit import audit
from dispatchtx.coordinator.config import DEFAULT_COMMIT_BATCH
from dispatchtx.coordinator.faults import FaultPlan, FaultPoint
from dispatchtx.coordinator.stats import Stat
from dispatchtx.fs import FS, FaultyFS, RandomDiskFaults, RealClock, RealFS, SimulatedFS
from dispatchtx.jobs.arguments import (
    JobParser,
    float_between,
    int_at_least,
    new_file,
    positive_float,
)
from dispatchtx.jobs.bench.store_counting import CountingFS
from dispatchtx.jobs.workloads.fuzz import FuzzConfig, FuzzWorkload, fuzz_task
from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
from dispatchtx.store import StoreError, WorkStore
from dispatchtx.transport import DEFAULT_SPIN, MPITransport, Work, run_worker

__all__ = ["main", "parse_faults"]


def parse_faults(text: str) -> dict[FaultPoint, float]:
    """`"send=0.1,ambiguous-send=0.05"` -> rates by fault point."""
    rates: dict[FaultPoint, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, rate = part.partition("=")
        try:
            point = FaultPoint(name)
        except ValueError:
            known = ", ".join(p.value for p in FaultPoint)
            message = f"unknown fault point {name!r}; one of {known}"
            raise argparse.ArgumentTypeError(message) from None
        rates[point] = _rate(rate) if rate else 0.0
    return rates


_rate = float_between(0.0, 1.0)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = JobParser(
        prog="python -m dispatchtx.jobs.mpi_job",
        description=__doc__.splitlines()[0] if __doc__ else "",
    )
    parser.add_argument("--store", required=True, help="the shared store's directory")
    parser.add_argument(
        "--fs",
        choices=("real", "memory"),
        default="real",
        help="the store on the real disk, or on the simulated in-memory FS (rank 0 only: "
        "for measuring the runtime without fsync costs)",
    )
    parser.add_argument(
        "--report", type=new_file, required=True, help="where rank 0 writes its JSON report"
    )
    parser.add_argument("--coordinator-id", default="coord-0", help="its name in the store")
    parser.add_argument(
        "--workload",
        choices=("hash", "fuzz"),
        default="hash",
        help="hash: a small self-checking workload; fuzz: the campaign's coverage-guided "
        "fuzzing over bundled targets, every resource kind on every dispatch",
    )
    parser.add_argument("--items", type=int_at_least(1), default=200, help="the work budget")
    parser.add_argument(
        "--batches-per-seed",
        type=int_at_least(1),
        default=2,
        help="fuzz: mutation batches per seed",
    )
    parser.add_argument("--item-prefix", default="item", help="hash: work ids' prefix")
    parser.add_argument(
        "--max-in-flight", type=int_at_least(1), default=1, help="dispatches per worker at once"
    )
    parser.add_argument(
        "--deadline", type=positive_float, default=2.0, help="seconds a dispatch may take"
    )
    parser.add_argument(
        "--strikes",
        type=int_at_least(1),
        default=3,
        help="missed deadlines in a row that lose a worker",
    )
    parser.add_argument(
        "--ttl", type=positive_float, default=2.0, help="seconds a claim lives unrenewed"
    )
    parser.add_argument("--faults", type=parse_faults, default={}, help="point=rate,...")
    parser.add_argument("--journal", help="this coordinator's local journal (a file path)")
    parser.add_argument("--results", help="a directory where triage links each result")
    parser.add_argument(
        "--disk-fault-rate",
        type=float_between(0.0, 1.0),
        default=0.0,
        help="inject EIO, ENOSPC, ESTALE, lost link replies and stale look-ups into this "
        "share of the store's and the journal's FS calls (a fault-injecting wrapper)",
    )
    parser.add_argument(
        "--kill-at",
        type=FaultPoint,
        help="SIGKILL this whole job (its process group) at this commit stage",
    )
    parser.add_argument(
        "--kill-rate",
        type=float_between(0.0, 1.0),
        default=0.05,
        help="chance of the kill at each visit of --kill-at",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the fault draws")
    parser.add_argument(
        "--hang-rank", type=int_at_least(0), default=0, help="a worker rank that hangs (0: none)"
    )
    parser.add_argument(
        "--hang-after", type=int_at_least(0), default=3, help="...after this many tasks"
    )
    parser.add_argument(
        "--count-fsyncs",
        action="store_true",
        help="with --fs real: count every fsync the store does, reported per committed item",
    )
    parser.add_argument(
        "--commit-batch",
        type=int_at_least(1),
        default=DEFAULT_COMMIT_BATCH,
        help="claim, commit and complete up to this many items of one pass as one group "
        "(one file, one fsync); 1: one at a time",
    )
    parser.add_argument(
        "--spin",
        type=float_between(0.0, 1.0),
        default=DEFAULT_SPIN,
        help="seconds every rank yields between polls after its last message, "
        "before it backs off from 1 us to 1 ms",
    )
    args = parser.parse_args(argv)
    ranks = _world_size()
    if args.hang_rank and ranks is not None and args.hang_rank >= ranks:
        parser.error(f"--hang-rank {args.hang_rank} is not a worker rank of {ranks} ranks")
    return args


def _world_size() -> int | None:
    """The job's size as the launcher tells it, before MPI starts."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        if name in os.environ:
            return int(os.environ[name])
    return None


def _coordinator(comm: Any, args: argparse.Namespace) -> int:
    transport = MPITransport(comm, send_timeout=max(1.0, args.deadline), spin=args.spin)
    counting = CountingFS() if args.count_fsyncs else None
    fs: FS = (counting or RealFS()) if args.fs == "real" else SimulatedFS()
    disk_faults = RandomDiskFaults(random.Random(args.seed), args.disk_fault_rate)
    if args.disk_fault_rate > 0:
        fs = FaultyFS(fs, disk_faults)
    store = WorkStore(fs, args.store, RealClock(), ttl=args.ttl)
    workload: HashWorkload | FuzzWorkload
    if args.workload == "fuzz":
        if args.results is None:
            raise SystemExit("--workload fuzz needs --results, the campaign directory")
        workload = FuzzWorkload(
            fs,
            args.results,
            FuzzConfig(
                budget=args.items, batches_per_seed=args.batches_per_seed, rng_seed=args.seed
            ),
        )
    else:
        results = None if args.results is None else (fs, args.results)
        workload = HashWorkload(args.items, prefix=args.item_prefix, results=results)
    rates = dict(args.faults)
    if args.kill_at is not None:
        rates[args.kill_at] = args.kill_rate
    plan = FaultPlan(rates, seed=args.seed, at_least_once=list(args.faults), kill=_kill_job)
    config = CoordinatorConfig(
        args.coordinator_id,
        max_in_flight=args.max_in_flight,
        deadline=args.deadline,
        strikes=args.strikes,
        journal_path=args.journal,
        background_heartbeat=True,  # a long triage must not starve the leases
        commit_batch=args.commit_batch,
    )
    started = time.monotonic()
    coordinator = _start(config, transport, store, workload, plan, fs)
    status_path = f"{args.report}.status"
    recovered_after: float | None = None

    def write_status() -> None:
        # What a killed job leaves behind: its counts and faults so far.
        status = {
            "coordinator": args.coordinator_id,
            "incarnation": coordinator.incarnation,
            "seconds": round(time.monotonic() - started, 3),
            "counts": dict(coordinator.stats.counts),
            "faults_fired": {p.value: n for p, n in coordinator.faults.fired.items()},
            "disk_faults_fired": dict(disk_faults.fired),
            "lost_workers": sorted(coordinator.lost_workers),
            "not_done": workload.remaining(),
            "in_flight": len(coordinator.tables),
            "wasted_cpu_seconds": round(coordinator.wasted_cpu_seconds, 6),
            "recovered_after_seconds": (
                None if recovered_after is None else round(recovered_after, 4)
            ),
        }
        temporary = f"{status_path}.tmp"
        with open(temporary, "w") as out:
            json.dump(status, out)
        os.replace(temporary, status_path)

    plan.before_kill = write_status
    coordinator.step()  # the first step rolls forward what an earlier incarnation left
    recovered_after = time.monotonic() - started
    next_status = 0.0

    def status_when_due() -> None:
        nonlocal next_status
        if time.monotonic() >= next_status:
            next_status = time.monotonic() + 1.0
            write_status()

    while True:
        while not coordinator.idle:
            coordinator.step()
            status_when_due()
        if not coordinator.adopt_orphans():
            break
        coordinator.step()  # heartbeats and roll-forward go on meanwhile
        status_when_due()  # the faults of the wait too, as they fire
    write_status()
    elapsed = time.monotonic() - started
    leaks = [str(leak) for leak in coordinator.leaks()]
    coordinator_stats = Counter(coordinator.stats.counts)
    # The audit reads the store without injected faults: it is the caller's
    # check of what happened, not part of the run.
    audit_store = WorkStore(
        RealFS() if args.fs == "real" else fs, args.store, RealClock(), ttl=args.ttl
    )
    statuses = Counter(state.status.value for state in audit_store.items())
    report: dict[str, Any] = {
        "coordinator": args.coordinator_id,
        "build": "compiled" if COMPILED else "pure",
        "recovered_after_seconds": round(recovered_after, 4),
        "disk_faults_fired": dict(disk_faults.fired),
        "ranks": comm.Get_size(),
        "incarnation": coordinator.incarnation,
        "items": args.items,
        "max_in_flight": args.max_in_flight,
        "seconds": round(elapsed, 4),
        "results_per_second": round(coordinator_stats[Stat.COMMITTED] / elapsed, 1),
        "counts": dict(sorted(coordinator_stats.items())),
        "faults_fired": {point.value: n for point, n in sorted(coordinator.faults.fired.items())},
        "lost_workers": sorted(coordinator.lost_workers),
        "wasted_cpu_seconds": round(coordinator.wasted_cpu_seconds, 6),
        "store": dict(sorted(statuses.items())),
        "violations": list(workload.ledger.violations),
        "reruns": workload.ledger.reruns,
        "not_done": workload.remaining(),
    }
    if counting is not None:
        # The whole run's fsyncs (its start included), by kind, per item committed.
        committed = max(1, coordinator_stats[Stat.COMMITTED])
        report["fsyncs_per_committed_item"] = {
            kind: count / committed for kind, count in counting.count.by_kind.items()
        }
    # Shut down before reporting leaks: every PREPARING and ACTIVE dispatch
    # is compensated, COMMITTING ones are finished.
    coordinator.shutdown()
    run_audit = audit(coordinator, audit_store)
    report["audit"] = run_audit.as_json()
    report["leaks_after_shutdown"] = [str(leak) for leak in run_audit.leaks]
    report["violations"].extend(run_audit.problems)
    report["effects_applied_twice"] = workload.ledger.effects_applied_twice
    if workload.ledger.effects_applied_twice:
        report["violations"].append("local effects applied twice")
    report["leaks_before_shutdown"] = leaks
    report["items_not_done_in_store"] = list(run_audit.unsettled)
    report["passed"] = run_audit.passed and not report["violations"] and report["not_done"] == 0
    temporary = f"{args.report}.tmp.{os.getpid()}"
    with open(temporary, "w") as out:
        json.dump(report, out, indent=2)
    os.replace(temporary, args.report)  # the caller polls for the report: whole or absent
    transport.close()
    status = 0 if report["passed"] else 1
    if coordinator.lost_workers or not _workers_stopped(comm, grace=max(5.0, 2 * args.deadline)):
        # A hung rank never reads its stop, and mpiexec waits for every rank:
        # end the whole job (the report is written; nothing is left to do).
        lost = ", ".join(str(w + 1) for w in sorted(coordinator.lost_workers)) or "none declared"
        print(
            f"mpi_job: not every worker stopped (lost ranks: {lost}); ending the job with "
            "MPI_Abort",
            file=sys.stderr,
            flush=True,
        )
        comm.Abort(status)
    return status


def _workers_stopped(comm: Any, grace: float) -> bool:
    """Whether every worker rank left its loop (each enters this barrier
    after its stop), waiting up to `grace` seconds; polled with a bounded
    back-off so that a waiting rank burns no core."""
    request = comm.Ibarrier()
    give_up = time.monotonic() + grace
    pause = 0.0005
    while not request.Test():
        if time.monotonic() >= give_up:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def _kill_job(point: FaultPoint) -> None:
    """A real kill at a commit stage: SIGKILL the whole job (under MPICH a
    dead rank takes its job down anyway); the campaign restarts it."""
    sys.stdout.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _start(
    config: CoordinatorConfig,
    transport: MPITransport,
    store: WorkStore,
    workload: HashWorkload | FuzzWorkload,
    plan: FaultPlan,
    fs: FS,
) -> Coordinator:
    """Start the coordinator; a start that hits a disk fault (registering its
    incarnation, opening its journal) tries again, as a supervisor would."""
    for attempt in range(100):
        try:
            return Coordinator(config, transport, store, workload, faults=plan, journal_fs=fs)
        except (StoreError, OSError):
            if attempt == 99:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        try:
            return _coordinator(comm, args)
        except BaseException:
            # An MPI job whose rank 0 just exits hangs in MPI_Finalize while
            # its workers poll on: end the whole job instead.
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            comm.Abort(3)
            raise
    rank = comm.Get_rank()
    tasks = 0

    def hang_when(work: Work) -> bool:
        nonlocal tasks
        tasks += 1
        return bool(rank == args.hang_rank and tasks > args.hang_after)

    task = fuzz_task if args.workload == "fuzz" else hash_task
    run_worker(comm, task, hang_when=hang_when, spin=args.spin)
    # Tells rank 0 this worker stopped (a nonblocking barrier matches only
    # its own kind: rank 0 waits in one, see _workers_stopped).
    _workers_stopped(comm, grace=float("inf"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
