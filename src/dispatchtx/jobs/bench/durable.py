"""4. The durable path: `mpi_job --fs real` beside its bound,
1 / (fsyncs per item x one fsync's latency)."""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.coordinator.config import DEFAULT_COMMIT_BATCH
from dispatchtx.coordinator.stats import Stat
from dispatchtx.fs import RealClock
from dispatchtx.jobs.bench.common import filesystem_of
from dispatchtx.jobs.bench.config import BenchConfig
from dispatchtx.jobs.bench.mpi import JobRunner, _rates
from dispatchtx.jobs.bench.scaling import SCALING_TTL
from dispatchtx.jobs.bench.store_counting import (
    CountingFS,
    fsync_bound,
    fsync_disabled,
    fsync_seconds,
    per_op,
    repeated,
    summary,
)
from dispatchtx.jobs.bench.store_figures import fsync_latencies
from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
from dispatchtx.store import WorkStore
from dispatchtx.transport import SimulatedTransport


def durable_counts(
    directory: str,
    items: int,
    workers: int,
    *,
    max_in_flight: int = 1,
    commit_batch: int = DEFAULT_COMMIT_BATCH,
) -> dict[str, Any]:
    """The shape of one `mpi_job --fs real` run in process: a fresh store on
    the real disk through `CountingFS`, `workers` simulated workers, the same
    items and settings; fsyncs per committed item by kind, and the rate."""
    fs = CountingFS()
    transport = SimulatedTransport(workers, hash_task)
    store = WorkStore(fs, directory, RealClock(), ttl=SCALING_TTL)
    workload = HashWorkload(items)
    config = CoordinatorConfig(
        "bench", deadline=2.0, max_in_flight=max_in_flight, commit_batch=commit_batch
    )
    coordinator = Coordinator(config, transport, store, workload)
    before = fs.count.snapshot()
    started = time.perf_counter()
    coordinator.run()
    elapsed = time.perf_counter() - started
    committed = coordinator.stats[Stat.COMMITTED]
    coordinator.shutdown()
    if committed != items:
        raise RuntimeError(f"durable path in process: {committed} of {items} committed")
    return {"rate": committed / elapsed, **per_op(fs.count.since(before), committed)}


def durable_run(
    config: BenchConfig,
    runner: JobRunner,
    base: str,
    progress: Callable[[str], None],
    memory_dir: str | None = None,
) -> dict[str, Any]:
    ranks, items, reps = config.durable_ranks, config.durable_items, config.durable_repetitions
    workers = ranks - 1
    progress("4. durable path: fsync latency")
    latencies = fsync_latencies(base, config.fsync_samples, "durable")
    latency = {kind: statistics.median(samples) for kind, samples in latencies.items()}
    progress("4. durable path: fsyncs per item, counted in process")
    counter = itertools.count()
    in_process = repeated(
        reps,
        lambda tag: durable_counts(os.path.join(base, f"durable-{next(counter)}"), items, workers),
    )
    progress("4. durable path: the same in process, os.fsync a no-op")
    without_fsync = repeated(
        reps,
        lambda tag: _without_fsync(
            durable_counts, os.path.join(base, f"durable-{next(counter)}"), items, workers
        ),
    )
    bound = fsync_bound(in_process, latency)
    progress("4. durable path: mpi_job --fs real, warm-up job")
    runner.dispatchtx(ranks, 1, max(10, items // 4), "real", "durable-warm")
    samples: list[float] = []
    errors: list[str] = []
    for rep in range(reps):
        progress(f"4. durable path: mpi_job --fs real, repetition {rep + 1}/{reps}")
        rate, error = runner.dispatchtx(ranks, 1, items, "real", "durable")
        if rate is not None:
            samples.append(rate)
        if error is not None:
            errors.append(error)
    mpi = _rates(samples, errors)
    batching = durable_batching(config, runner, base, counter, progress, memory_dir)
    return {
        "ranks": ranks,
        "max_in_flight": 1,
        "items_per_repetition": items,
        "repetitions": reps,
        "directory": base,
        "filesystem": filesystem_of(base),
        "fsync_latency_s": {kind: summary(samples) for kind, samples in latencies.items()},
        "fsyncs_per_item": in_process["fsyncs_per_op"],
        "fsync_seconds_per_item": fsync_seconds(in_process, latency),
        "bound": bound,
        "mpi": mpi,
        "fraction_of_bound": None
        if bound is None or mpi["median"] is None
        else mpi["median"] / bound,
        "in_process": {key: in_process[key] for key in ("median", "min", "max", "samples")},
        "in_process_fraction_of_bound": None if bound is None else in_process["median"] / bound,
        "in_process_without_fsync": {
            key: without_fsync[key] for key in ("median", "min", "max", "samples")
        },
        "batching": batching,
        "notes": [
            "fsyncs counted on a fresh store per run, the shape of one mpi_job run (the job "
            "starts on a fresh store too: its first publications also make its directories "
            "durable)",
            f"group commit (one group per pass: the commits of its poll's results, the dones "
            f"of its last triage, the claims of its next dispatches; one file, one fsync of it "
            f"and one of slots/) is on by default (commit_batch {DEFAULT_COMMIT_BATCH}); 'one at a "
            f"time' is commit_batch 1; mpi_job runs no journal (the journal's group policy is "
            f"in section 5)",
        ],
    }


BATCHING_DEPTH: Final = 4
GROUPED: Final = DEFAULT_COMMIT_BATCH  # "grouped", the default settings


def durable_batching(
    config: BenchConfig,
    runner: JobRunner,
    base: str,
    counter: Iterator[int],
    progress: Callable[[str], None],
    memory_dir: str | None = None,
) -> dict[str, Any]:
    """How group commit moves the durable path: mpi_job --fs real at
    `max_in_flight` BATCHING_DEPTH, batches on and off, in the same run;
    fsyncs per item counted in process for both. With `memory_dir`, the
    same job with the default settings and its store on tmpfs, for the
    durable path's distance to it."""
    ranks, items, reps = config.durable_ranks, config.durable_items, config.durable_repetitions
    workers = ranks - 1
    rows: dict[str, Any] = {}
    for label, grouped in (("grouped", True), ("one at a time", False)):
        progress(f"4. durable path, batching: fsyncs per item counted, {label}")

        def count(tag: str, grouped: bool = grouped) -> dict[str, Any]:
            return durable_counts(
                os.path.join(base, f"durable-{next(counter)}"),
                items,
                workers,
                max_in_flight=BATCHING_DEPTH,
                commit_batch=GROUPED if grouped else 1,
            )

        counted = repeated(reps, count)
        samples: list[float] = []
        errors: list[str] = []
        in_job: list[dict[str, float]] = []
        for rep in range(reps):
            progress(f"4. durable path, batching: mpi_job --fs real, {label}, {rep + 1}/{reps}")
            rate, error = runner.dispatchtx(
                ranks,
                BATCHING_DEPTH,
                items,
                "real",
                "durable-batch",
                commit_batch=GROUPED if grouped else 1,
                count_fsyncs=True,
            )
            if rate is not None:
                samples.append(rate)
                assert runner.last_report is not None
                in_job.append(runner.last_report["fsyncs_per_committed_item"])
            if error is not None:
                errors.append(error)
        rows[label] = {
            "mpi": _rates(samples, errors),
            "fsyncs_per_item": counted["fsyncs_per_op"],
            # Counted in the real job itself (its start included): the results
            # of one poll there are as many as arrived meanwhile.
            "fsyncs_per_item_in_mpi_job": {
                kind: statistics.median(job[kind] for job in in_job) for kind in in_job[0]
            }
            if in_job
            else None,
            "in_process": {key: counted[key] for key in ("median", "min", "max", "samples")},
        }
    grouped_rate = rows["grouped"]["mpi"]["median"]
    single_rate = rows["one at a time"]["mpi"]["median"]
    on_tmpfs: dict[str, Any] | None = None
    if memory_dir is not None:
        samples, errors = [], []
        for rep in range(reps):
            progress(f"4. durable path: mpi_job, store on tmpfs, {rep + 1}/{reps}")
            rate, error = runner.dispatchtx(
                ranks, BATCHING_DEPTH, items, "real", "tmpfs", store_parent=memory_dir
            )
            if rate is not None:
                samples.append(rate)
            if error is not None:
                errors.append(error)
        on_tmpfs = _rates(samples, errors)
    default = rows["grouped"]  # the default settings
    tmpfs_rate = None if on_tmpfs is None else on_tmpfs["median"]
    return {
        "max_in_flight": BATCHING_DEPTH,
        "rows": rows,
        "speedup": None if grouped_rate is None or not single_rate else grouped_rate / single_rate,
        "tmpfs": on_tmpfs,
        "default_fsyncs_per_item": sum(
            (default["fsyncs_per_item_in_mpi_job"] or default["fsyncs_per_item"]).values()
        ),
        "default_fsyncs_counted_in": "mpi_job"
        if default["fsyncs_per_item_in_mpi_job"]
        else "process",
        "default_over_tmpfs": None
        if grouped_rate is None or not tmpfs_rate
        else grouped_rate / tmpfs_rate,
    }


def _without_fsync(
    fn: Callable[[str, int, int], dict[str, Any]], directory: str, items: int, workers: int
) -> dict[str, Any]:
    with fsync_disabled():
        return fn(directory, items, workers)
