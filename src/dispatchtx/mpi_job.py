"""One coordinator and its workers as one `mpiexec` job, on real MPI ranks,
with the shared store on the real disk (DESIGN.md §6: each coordinator runs
as its own job, so one can be killed and restarted while others go on).

    mpiexec -n 5 python -m dispatchtx.mpi_job --store DIR --report FILE [...]

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
import sys
import time
from collections import Counter
from typing import Any

from dispatchtx import COMPILED
from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.faults import FaultPlan, FaultPoint
from dispatchtx.fs import FS, RealClock, RealFS, SimulatedFS
from dispatchtx.store import ItemStatus, WorkStore
from dispatchtx.transport import MPITransport, Work, run_worker
from dispatchtx.workloads import HashWorkload, hash_task

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
        rates[point] = float(rate) if rate else 0.0
    return rates


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--store", required=True, help="the shared store's directory")
    parser.add_argument(
        "--fs",
        choices=("real", "memory"),
        default="real",
        help="the store on the real disk, or on the simulated in-memory FS (rank 0 only: "
        "for measuring the runtime without fsync costs)",
    )
    parser.add_argument("--report", required=True, help="where rank 0 writes its JSON report")
    parser.add_argument("--coordinator-id", default="coord-0")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--item-prefix", default="item")
    parser.add_argument("--max-in-flight", type=int, default=1)
    parser.add_argument("--deadline", type=float, default=2.0)
    parser.add_argument(
        "--strikes", type=int, default=3, help="missed deadlines in a row that lose a worker"
    )
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--faults", type=parse_faults, default={}, help="point=rate,...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-rank", type=int, default=0, help="a worker rank that hangs")
    parser.add_argument("--hang-after", type=int, default=3, help="...after this many tasks")
    return parser.parse_args(argv)


def _coordinator(comm: Any, args: argparse.Namespace) -> int:
    transport = MPITransport(comm, send_timeout=max(1.0, args.deadline))
    fs: FS = RealFS() if args.fs == "real" else SimulatedFS()
    store = WorkStore(fs, args.store, RealClock(), ttl=args.ttl)
    workload = HashWorkload(args.items, prefix=args.item_prefix)
    plan = FaultPlan(args.faults, seed=args.seed, at_least_once=list(args.faults))
    config = CoordinatorConfig(
        args.coordinator_id,
        max_in_flight=args.max_in_flight,
        deadline=args.deadline,
        strikes=args.strikes,
    )
    coordinator = Coordinator(config, transport, store, workload, faults=plan)
    started = time.monotonic()
    coordinator.run()
    elapsed = time.monotonic() - started
    leaks = [str(leak) for leak in coordinator.leaks()]
    coordinator_stats = Counter(coordinator.stats.counts)
    statuses = Counter(state.status.value for state in store.items())
    report: dict[str, Any] = {
        "build": "compiled" if COMPILED else "pure",
        "ranks": comm.Get_size(),
        "incarnation": coordinator.incarnation,
        "items": args.items,
        "max_in_flight": args.max_in_flight,
        "seconds": round(elapsed, 4),
        "results_per_second": round(coordinator_stats["committed"] / elapsed, 1),
        "counts": dict(sorted(coordinator_stats.items())),
        "faults_fired": {point.value: n for point, n in sorted(coordinator.faults.fired.items())},
        "lost_workers": sorted(coordinator.lost_workers),
        "store": dict(sorted(statuses.items())),
        "violations": list(workload.violations),
        "reruns": workload.reruns,
        "not_done": workload.remaining(),
    }
    # Shut down before reporting leaks: every PREPARING and ACTIVE dispatch
    # is compensated, COMMITTING ones are finished.
    coordinator.shutdown()
    report["leaks_after_shutdown"] = [str(leak) for leak in coordinator.leaks()]
    report["leaks_before_shutdown"] = leaks
    left = [s.work_id for s in store.items() if s.status is not ItemStatus.DONE]
    report["items_not_done_in_store"] = left
    report["passed"] = (
        not report["violations"]
        and not report["leaks_after_shutdown"]
        and not left
        and report["not_done"] == 0
    )
    temporary = f"{args.report}.tmp.{os.getpid()}"
    with open(temporary, "w") as out:
        json.dump(report, out, indent=2)
    os.replace(temporary, args.report)  # the caller polls for the report: whole or absent
    transport.close()
    return 0 if report["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        return _coordinator(comm, args)
    rank = comm.Get_rank()
    tasks = 0

    def hang_when(work: Work) -> bool:
        nonlocal tasks
        tasks += 1
        return bool(rank == args.hang_rank and tasks > args.hang_after)

    run_worker(comm, hash_task, hang_when=hang_when)
    return 0


if __name__ == "__main__":
    sys.exit(main())
