"""`dispatchtx bench`: where dispatchtx stands, in one command and one run.

    python -m dispatchtx bench [--json FILE] [--quick]
    python -m dispatchtx.jobs.bench [--json FILE] [--quick]

What each section measures is told in `cli` (the command's docstring); one
module per section, and the pieces they share:

- `config`: `BenchConfig`, `StoreConfig`, the full run `DEFAULT`, `QUICK`;
- `common`: spread of samples, the progress line, versions, the machine;
- `core`: 1. the core, pure and compiled (benchmarks/core_bench.py);
- `scaling`: 2. the coordinator over the simulated transport;
- `mpi`: 3. real MPI, dispatchtx beside raw mpi4py and `mpi4py.futures`
  (`raw_mpi`, `futures_mpi` are the programs those jobs run);
- `durable`: 4. the durable path beside its fsync bound;
- `store_counting`, `store_figures`, `store_table`: 5. the journal and the
  store (benchmarks/store_bench.py): fsync counting, the measurements, the table;
- `sections`: the whole run over the chosen sections;
- `targets`: the targets of issue 12; `table`: the printed table;
- `cli`: `main`, the command line.
"""

from __future__ import annotations

from dispatchtx.jobs.bench.cli import main
from dispatchtx.jobs.bench.common import Progress, spread
from dispatchtx.jobs.bench.config import DEFAULT, QUICK, BenchConfig, StoreConfig
from dispatchtx.jobs.bench.core import (
    CORE_FIGURES,
    IN_FLIGHT,
    bytes_in_flight,
    core_main,
    core_run,
    load_builds,
    time_lifecycles,
    time_lifecycles_across,
)
from dispatchtx.jobs.bench.durable import durable_counts, durable_run
from dispatchtx.jobs.bench.mpi import JobRunner, dispatchtx_message_sizes, mpi_run, run_mpi_job
from dispatchtx.jobs.bench.scaling import (
    RefillableWorkload,
    coordinator_scaling,
    periodic_scans,
    scaling_run,
)
from dispatchtx.jobs.bench.sections import SECTIONS, run
from dispatchtx.jobs.bench.store_counting import KINDS, CountingFS, fsync_bound
from dispatchtx.jobs.bench.store_figures import store_run
from dispatchtx.jobs.bench.store_table import print_store_table, store_main
from dispatchtx.jobs.bench.table import print_table
from dispatchtx.jobs.bench.targets import targets

__all__ = [
    "BenchConfig",
    "DEFAULT",
    "QUICK",
    "core_main",
    "core_run",
    "main",
    "run",
    "store_main",
    "store_run",
    # also used by the tests and the bench's own modules
    "CORE_FIGURES",
    "CountingFS",
    "IN_FLIGHT",
    "JobRunner",
    "KINDS",
    "Progress",
    "RefillableWorkload",
    "SECTIONS",
    "StoreConfig",
    "bytes_in_flight",
    "coordinator_scaling",
    "dispatchtx_message_sizes",
    "durable_counts",
    "durable_run",
    "fsync_bound",
    "load_builds",
    "mpi_run",
    "periodic_scans",
    "print_store_table",
    "print_table",
    "run_mpi_job",
    "scaling_run",
    "spread",
    "targets",
    "time_lifecycles",
    "time_lifecycles_across",
]
