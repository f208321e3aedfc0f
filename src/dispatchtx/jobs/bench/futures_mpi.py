"""The `mpi4py.futures` baseline of `dispatchtx bench`: no-op tasks through an
`MPIPoolExecutor` whose workers are the job's other ranks.

    mpiexec -n N python -m mpi4py.futures -m dispatchtx.jobs.bench.futures_mpi \\
        --items 800 --repetitions 3 --report FILE

Every round submits `--items` no-op tasks at once and waits for them all:
the pool sends a task only to an idle worker (it has no per-worker depth to
set), so this is the executor at its best. One warm-up round, then
`--repetitions` timed rounds; the JSON report (results/s of each round) goes
to `--report`, or to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main", "noop_task"]


def noop_task(index: int) -> int:
    """The task: nothing but the round trip."""
    return index


def _task_by_name() -> Callable[[int], int]:
    # Run with `-m`, this module is `__main__` on rank 0; a task pickled as
    # `__main__.noop_task` would not resolve on the workers. Take it from the
    # module under its importable name.
    module = importlib.import_module("dispatchtx.jobs.bench.futures_mpi")
    task: Callable[[int], int] = module.noop_task
    return task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--items", type=int, default=800, help="tasks per round")
    parser.add_argument("--repetitions", type=int, default=3, help="timed rounds after a warm-up")
    parser.add_argument("--report", help="write the JSON report here (default: stdout)")
    args = parser.parse_args(argv)
    if args.items < 1 or args.repetitions < 1:
        parser.error("--items and --repetitions must be >= 1")
    from mpi4py import MPI
    from mpi4py.futures import MPIPoolExecutor

    from dispatchtx.jobs.bench.raw_mpi import write_report

    task = _task_by_name()
    rates: list[float] = []
    with MPIPoolExecutor() as executor:
        workers = executor.num_workers
        for _ in range(1 + args.repetitions):
            started = time.perf_counter()
            futures = [executor.submit(task, index) for index in range(args.items)]
            for future in futures:
                future.result()
            rates.append(args.items / (time.perf_counter() - started))
    report: dict[str, Any] = {
        "ranks": MPI.COMM_WORLD.Get_size(),
        "workers": workers,
        "items": args.items,
        "warm_up_rounds": 1,
        "results_per_second": rates[1:],
        "warm_up_results_per_second": rates[0],
    }
    write_report(report, args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
