"""What one run measures: `BenchConfig` (with the store section's `StoreConfig`),
the full run `DEFAULT` and the about-a-minute `QUICK`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dispatchtx.jobs.bench.core import IN_FLIGHT

# ---------------------------------------------------------------------------
# What one run measures
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    core_dispatches: int  # per repetition, per figure and build
    core_repetitions: int
    core_in_flight: int  # dispatches in flight for bytes per dispatch
    scaling_items: int  # per repetition, the same at every size
    scaling_repetitions: int
    scaling_workers: tuple[int, ...]
    scaling_million: bool  # try 1,048,576 workers if it fits `scaling_allowance`
    scaling_allowance: float  # seconds the 1,048,576-worker row may take
    tables_dispatches: int  # tables alone, per size
    mpi_ranks: tuple[int, ...]
    mpi_depths: tuple[int, ...]
    mpi_items: int  # per repetition, the same for the three systems
    mpi_repetitions: int
    durable_ranks: int
    durable_items: int
    durable_repetitions: int
    fsync_samples: int  # per kind of fsync, for the durable bound
    job_timeout: float  # seconds; past it a job's process group is killed
    store: StoreConfig


@dataclass(frozen=True)
class StoreConfig:
    repetitions: int
    fsync_samples: int  # per kind of fsync, per batch (start and end)
    journal_every: int  # records per repetition
    journal_group: int
    journal_none: int
    claim_items: int  # items in the shared pool, per repetition
    commit_items: int


STORE_DEFAULT: Final = StoreConfig(
    repetitions=5,
    fsync_samples=500,
    journal_every=400,
    journal_group=4096,
    journal_none=20_000,
    claim_items=300,
    commit_items=250,
)
STORE_QUICK: Final = StoreConfig(
    repetitions=3,
    fsync_samples=150,
    journal_every=100,
    journal_group=1024,
    journal_none=5_000,
    claim_items=60,
    commit_items=60,
)

# ---------------------------------------------------------------------------
# The whole run
# ---------------------------------------------------------------------------

DEFAULT: Final = BenchConfig(
    core_dispatches=100_000,
    core_repetitions=5,
    core_in_flight=IN_FLIGHT,
    scaling_items=2_000,
    scaling_repetitions=3,
    scaling_workers=(64, 1_024, 16_384, 65_536),
    scaling_million=True,
    scaling_allowance=30.0,
    tables_dispatches=100_000,
    mpi_ranks=(2, 3, 5, 9),
    mpi_depths=(1, 4),
    mpi_items=800,
    mpi_repetitions=3,
    durable_ranks=3,
    durable_items=120,
    durable_repetitions=3,
    fsync_samples=200,
    job_timeout=120.0,
    store=STORE_QUICK,
)
QUICK: Final = BenchConfig(
    core_dispatches=20_000,
    core_repetitions=3,
    core_in_flight=IN_FLIGHT,
    scaling_items=500,
    scaling_repetitions=2,
    scaling_workers=(64, 1_024, 16_384, 65_536),
    scaling_million=False,
    scaling_allowance=0.0,
    tables_dispatches=30_000,
    mpi_ranks=(2, 3, 5, 9),
    mpi_depths=(1, 4),
    mpi_items=300,
    mpi_repetitions=2,
    durable_ranks=3,
    durable_items=40,
    durable_repetitions=2,
    fsync_samples=60,
    job_timeout=60.0,
    store=StoreConfig(
        repetitions=2,
        fsync_samples=40,
        journal_every=50,
        journal_group=512,
        journal_none=2_000,
        claim_items=30,
        commit_items=30,
    ),
)
