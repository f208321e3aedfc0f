"""`dispatchtx bench`: where dispatchtx stands, in one command and one run.

    python -m dispatchtx bench [--json FILE] [--quick]
    python -m dispatchtx.jobs.bench [--json FILE] [--quick]

Five sections, all measured in the same run on this machine:

1. core: the pure and the compiled build side by side: ns per full
   lifecycle (prepare, 8 compensations added, sent, fence_passed, finished)
   and per rollback (prepare, 8 added, sent, fenced_out), their ratio, and
   bytes per in-flight dispatch at 65,536 in flight (tracemalloc);
2. scaling: wall time per committed item of the `Coordinator` over the
   `SimulatedTransport`, its store and journal on the in-memory
   `SimulatedFS`, the same number of items at 64 to 65,536 workers (and
   1,048,576 when it fits the time budget), beside the tables' own ns per
   lifecycle at that many workers;
3. real MPI at 2, 3, 5 and 9 ranks, `max_in_flight` 1 and 4: results/s of
   `dispatchtx.jobs.mpi_job --fs memory`, of a raw mpi4py loop with the same
   polling and message sizes (`dispatchtx.jobs.bench.raw_mpi`) and of
   `mpi4py.futures` with a no-op task (`dispatchtx.jobs.bench.futures_mpi`);
4. the durable path: `mpi_job --fs real` at 3 ranks beside its bound,
   1 / (fsyncs per item x one fsync's latency), both measured in this run;
5. the journal and the store (the figures of benchmarks/store_bench.py).

Every figure is the median of several repetitions after a warm-up, with its
min and max; `--json` also records versions, the machine, the load and
every sample. The machine may be shared and noisy: compare the ratios
measured in one run, not absolute rates across runs. Every mpiexec job runs
in its own process group and is killed as a group past its timeout.
"""

from __future__ import annotations

import json
import sys

from dispatchtx.jobs.arguments import JobParser, directory, new_file
from dispatchtx.jobs.bench.common import Progress
from dispatchtx.jobs.bench.config import DEFAULT, QUICK
from dispatchtx.jobs.bench.sections import SECTIONS, run
from dispatchtx.jobs.bench.table import print_table


def main(argv: list[str] | None = None) -> int:
    parser = JobParser(prog="dispatchtx bench", description=__doc__)
    parser.add_argument(
        "--json", type=new_file, help="write every figure, sample and version to this file"
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer items and repetitions: about a minute"
    )
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only this section (repeatable; default: all five)",
    )
    parser.add_argument(
        "--dir",
        type=directory,
        help="make the temp directory under this one (default: $TMPDIR)",
    )
    args = parser.parse_args(argv)
    progress = Progress()
    results = run(QUICK if args.quick else DEFAULT, progress, args.only or SECTIONS, args.dir)
    progress.done()
    print_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
