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

import argparse
import contextlib
import functools
import gc
import hashlib
import importlib.metadata
import itertools
import json
import multiprocessing
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final, NamedTuple

import dispatchtx
from dispatchtx import Transaction
from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.fs import RealAppendHandle, RealClock, RealFS, SimulatedFS
from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
from dispatchtx.journal import Event, FsyncPolicy, Journal, JournalModel, json_model
from dispatchtx.launch import find_mpiexec, kill_job
from dispatchtx.objects import object_id_of
from dispatchtx.store import ClaimOutcome, CommitOutcome, CompleteOutcome, WorkStore
from dispatchtx.transport import SimulatedTransport, TransportClock

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
]


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


# ---------------------------------------------------------------------------
# Spread, progress, versions
# ---------------------------------------------------------------------------


def spread(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and every sample of one figure."""
    if not samples:
        raise ValueError("no samples")
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": list(samples),
    }


class Progress:
    """One line on stderr saying what runs now: rewritten in place on a
    terminal, one line per step otherwise (a log keeps them all)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = time.monotonic()
        self._terminal = sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.monotonic() - self.started:5.0f} s] {text}"
        if self._terminal:
            print(f"\r{line[:99]:<99}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self._terminal:
            print(f"\r{'':<100}\r", end="", file=sys.stderr, flush=True)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return None


def versions() -> dict[str, Any]:
    """What ran. mpi4py is not imported here (importing it would start MPI in
    this process, which then forks store claimers): the MPI library's own
    version comes from the raw loop's job."""
    try:
        from dispatchtx import _core

        compiled_module: str | None = _core.__file__
    except ImportError:
        compiled_module = None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "dispatchtx": dispatchtx.__version__,
        "dispatchtx_loaded_build": "compiled" if dispatchtx.COMPILED else "pure",
        "dispatchtx_compiled_module": compiled_module,
        "mpi4py": _distribution_version("mpi4py"),
        "mpich_wheel": _distribution_version("mpich"),
        "mpi_library": None,  # filled in from a job's report
        "mpiexec": _mpiexec_or_none(),
    }


def machine() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


def _mpiexec_or_none() -> str | None:
    try:
        return find_mpiexec()
    except RuntimeError:
        return None


# ---------------------------------------------------------------------------
# 1. The core, pure and compiled (also benchmarks/core_bench.py)
# ---------------------------------------------------------------------------

N_COMPENSATIONS: Final = 8
IN_FLIGHT: Final = 65_536
CORE_FIGURES: Final = (
    ("lifecycle_ns", False, False),
    ("rollback_ns", True, False),
    ("lifecycle_noop_callables_ns", False, True),
    ("rollback_noop_callables_ns", True, True),
)


def _noop(arg: object) -> None:
    return None


def _compensations(tables: Any, callables: bool) -> list[Any]:
    fn = _noop if callables else None
    return [tables.compensation(f"resource{i}", fn, fn, fn) for i in range(N_COMPENSATIONS)]


def time_lifecycles(module: ModuleType, n: int, rollback: bool, callables: bool) -> float:
    """ns per dispatch over `n` dispatches to a rotating set of workers."""
    n_workers = 64
    tables = module.DispatchTables(n_workers)
    comps = _compensations(tables, callables)
    prepare, sent = tables.prepare, tables.sent
    end = tables.fenced_out if rollback else tables.fence_passed
    finished = tables.finished
    arg = object()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for i in range(n):
            txn = prepare(i & 63)
            add = txn.add
            for comp in comps:
                add(comp, arg)
            dispatch_id = txn.id
            sent(dispatch_id, 1.0)
            if rollback:
                end(dispatch_id)
            else:
                end(dispatch_id)
                finished(dispatch_id)
        elapsed = time.perf_counter_ns() - start
    finally:
        gc.enable()
    return elapsed / n


def time_lifecycles_across(module: ModuleType, n_workers: int, n: int) -> float:
    """ns per full lifecycle (8 compensations without callables) when the `n`
    dispatches go to workers spread over all `n_workers` (a fixed stride, so
    that large tables are touched all over, as a big coordinator touches them)."""
    tables = module.DispatchTables(n_workers)
    comps = _compensations(tables, callables=False)
    stride = 40_503  # odd: coprime with the power-of-two sizes measured
    workers = [(i * stride) % n_workers for i in range(n)]
    prepare, sent, fence_passed, finished = (
        tables.prepare,
        tables.sent,
        tables.fence_passed,
        tables.finished,
    )
    arg = object()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for worker in workers:
            txn = prepare(worker)
            add = txn.add
            for comp in comps:
                add(comp, arg)
            dispatch_id = txn.id
            sent(dispatch_id, 1.0)
            fence_passed(dispatch_id)
            finished(dispatch_id)
        elapsed = time.perf_counter_ns() - start
    finally:
        gc.enable()
    return elapsed / n


def bytes_in_flight(module: ModuleType, in_flight: int = IN_FLIGHT) -> tuple[float, float]:
    """(bytes per in-flight dispatch, bytes per worker of the empty tables)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tables = module.DispatchTables(in_flight)
    empty = tracemalloc.get_traced_memory()[0]
    comps = _compensations(tables, callables=True)
    arg = object()
    for worker in range(in_flight):
        txn = tables.prepare(worker)
        for comp in comps:
            txn.add(comp, arg)
        tables.sent(txn.id, 1.0)
    full = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(tables) == in_flight
    return (full - empty) / in_flight, (empty - base) / in_flight


def median_of(reps: int, fn: Callable[..., float], *args: Any) -> tuple[float, float, float]:
    fn(*args)  # warm-up
    samples = [fn(*args) for _ in range(reps)]
    return statistics.median(samples), min(samples), max(samples)


def load_builds(warn: Callable[[str], None] = print) -> dict[str, ModuleType]:
    """Both builds of the core, whatever `dispatchtx` itself loaded."""
    from dispatchtx import _core_py

    builds: dict[str, ModuleType] = {"pure": _core_py}
    try:
        from dispatchtx import _core
    except ImportError:
        warn("warning: the compiled core is not built; measuring the pure build only")
    else:
        builds["compiled"] = _core
    return builds


def _print_stage(text: str) -> None:
    print(text, end="\r", flush=True)


def core_run(
    n: int,
    reps: int,
    in_flight: int = IN_FLIGHT,
    progress: Callable[[str], None] = _print_stage,
    warn: Callable[[str], None] = print,
) -> dict[str, Any]:
    builds = load_builds(warn)
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor": platform.processor(),
        "dispatches_per_repetition": n,
        "repetitions": reps,
        "in_flight": in_flight,
        "builds": {},
    }
    for name, module in builds.items():
        row: dict[str, Any] = {}
        for label, rollback, callables in CORE_FIGURES:
            progress(f"  {name}: {label} ...")
            median, low, high = median_of(reps, time_lifecycles, module, n, rollback, callables)
            row[label] = {"median": median, "min": low, "max": high}
        progress(f"  {name}: bytes per in-flight dispatch ...")
        per_dispatch, per_worker = bytes_in_flight(module, in_flight)
        row["bytes_per_in_flight_dispatch"] = per_dispatch
        row["bytes_per_worker_empty_tables"] = per_worker
        results["builds"][name] = row
    if "compiled" in results["builds"]:
        pure, fast = results["builds"]["pure"], results["builds"]["compiled"]
        results["speedup"] = {
            key: pure[key]["median"] / fast[key]["median"] for key in pure if key.endswith("_ns")
        }
    return results


def print_core_table(results: dict[str, Any]) -> None:
    builds = results["builds"]
    names = list(builds)
    print(
        f"dispatch core, Python {results['python']}, {results['dispatches_per_repetition']:,} "
        f"dispatches x {results['repetitions']} repetitions (median)"
    )
    header = f"{'figure':<40}" + "".join(f"{name:>12}" for name in names)
    if "speedup" in results:
        header += f"{'pure/compiled':>15}"
    print(header)
    for key in builds[names[0]]:
        if key.endswith("_ns"):
            line = f"{key:<40}" + "".join(f"{builds[n][key]['median']:>12.0f}" for n in names)
            if "speedup" in results:
                line += f"{results['speedup'][key]:>14.2f}x"
        else:
            line = f"{key:<40}" + "".join(f"{builds[n][key]:>12.0f}" for n in names)
        print(line)


def core_main(argv: list[str] | None = None, description: str = "") -> int:
    """benchmarks/core_bench.py: the core's figures alone."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="fewer dispatches and repetitions")
    args = parser.parse_args(argv)
    n = 20_000 if args.quick else 200_000
    reps = 3 if args.quick else 7
    results = core_run(n, reps)
    print_core_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


# ---------------------------------------------------------------------------
# 2. Scaling: the coordinator over the simulated transport
# ---------------------------------------------------------------------------

SCALING_TTL: Final = 2.0  # as mpi_job's default


class RefillableWorkload:
    """HashWorkload's tasks and triage check, with O(1) bookkeeping per call
    and items added between runs, so that one coordinator (whose setup is
    O(workers)) serves a warm-up and every repetition. (HashWorkload's
    `remaining()` counts every item on each call: a scan per coordinator
    step, measured apart in `periodic_scans`.)"""

    def __init__(self, n_objects: int | None = 4) -> None:
        """`n_objects` objects shared round-robin by the items, or with None
        one object of its own per item (every dispatch ships one)."""
        self._per_item = n_objects is None
        contents = [f"object {i}".encode() * 8 for i in range(n_objects or 0)]
        self.object_ids = [object_id_of(content) for content in contents]
        self._by_id = dict(zip(self.object_ids, contents, strict=True))
        self._object_of: dict[str, str] = {}
        self._status: dict[str, str] = {}
        self._queue: deque[str] = deque()
        self._remaining = 0
        self.wrong_results = 0

    def add(self, work_ids: Iterable[str]) -> None:
        for work_id in work_ids:
            if work_id in self._status:
                raise ValueError(f"{work_id!r} was added before")
            if self._per_item:
                content = f"object of {work_id}".encode() * 4
                object_id = object_id_of(content)
                self._by_id[object_id] = content
            else:
                object_id = self.object_ids[len(self._object_of) % len(self.object_ids)]
            self._object_of[work_id] = object_id
            self._status[work_id] = "pending"
            self._queue.append(work_id)
            self._remaining += 1

    def take(self) -> str | None:
        while self._queue:
            work_id = self._queue.popleft()
            if self._status[work_id] == "pending":
                self._status[work_id] = "taken"
                return work_id
        return None

    def give_back(self, work_id: str) -> None:
        if self._status.get(work_id) == "taken":
            self._status[work_id] = "pending"
            self._queue.append(work_id)

    def _end(self, work_id: str, status: str) -> None:
        if self._status.get(work_id) in ("pending", "taken"):
            self._remaining -= 1
            self._status[work_id] = status

    def done(self, work_id: str) -> None:
        self._end(work_id, "done")

    def drop(self, work_id: str, reason: str) -> None:
        self._end(work_id, "dropped")

    def remaining(self) -> int:
        return self._remaining

    def reserve(self, txn: Transaction, worker: int, work_id: str) -> tuple[object, list[str]]:
        object_id = self._object_of[work_id]
        return [work_id, object_id], [object_id]

    def object_content(self, object_id: str) -> bytes:
        return self._by_id[object_id]

    def triage(self, work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        content = self._by_id[self._object_of[work_id]]
        if result != hashlib.sha256(work_id.encode() + content).digest():
            self.wrong_results += 1


def coordinator_scaling(workers: int, items: int, reps: int) -> dict[str, Any]:
    """Wall µs per committed item of one coordinator with `workers` simulated
    workers, its store and journal on `SimulatedFS`: `items` per run, a
    warm-up run then `reps` timed runs of the same coordinator."""
    setup_started = time.perf_counter()
    transport = SimulatedTransport(workers, hash_task)
    clock = TransportClock(transport, wall_offset=1.7e9)
    store = WorkStore(SimulatedFS(), "/store", clock, ttl=SCALING_TTL)
    # Each item ships its own object, so every size does the same work per
    # dispatch: with shared objects, 64 workers would hit their caches and
    # 65,536 would miss (a different workload, not a scan).
    workload = RefillableWorkload(n_objects=None)
    config = CoordinatorConfig("bench", journal_path="/journal/bench.journal")
    coordinator = Coordinator(config, transport, store, workload, journal_fs=SimulatedFS())
    setup_seconds = time.perf_counter() - setup_started
    samples: list[float] = []
    shipped: list[float] = []
    counts = coordinator.stats.counts
    # The setup's O(workers) objects leave the collector's view (as a long-
    # running coordinator would do after its start): each full collection
    # would otherwise walk them, a cost of the heap, not of a dispatch.
    gc.collect()
    gc.freeze()
    try:
        _scaling_repetitions(coordinator, workload, counts, workers, items, reps, samples, shipped)
    finally:
        gc.unfreeze()
    if workload.wrong_results:
        raise RuntimeError(f"{workers} workers: {workload.wrong_results} wrong results committed")
    leaks = coordinator.leaks()
    coordinator.shutdown()
    return {
        "workers": workers,
        "items": items,
        "us_per_item": spread(samples),
        "objects_shipped_per_dispatch": statistics.median(shipped),
        "setup_seconds": setup_seconds,
        "leaks": [str(leak) for leak in leaks],
        "counts": dict(sorted(counts.items())),
    }


def _scaling_repetitions(
    coordinator: Coordinator,
    workload: RefillableWorkload,
    counts: Counter[str],
    workers: int,
    items: int,
    reps: int,
    samples: list[float],
    shipped: list[float],
) -> None:
    for rep in range(1 + reps):
        workload.add(f"r{rep}-item-{i}" for i in range(items))
        committed, dispatches, objects = (
            counts["committed"],
            counts["dispatches"],
            counts["objects shipped"],
        )
        started = time.perf_counter()
        coordinator.run()
        elapsed = time.perf_counter() - started
        committed = counts["committed"] - committed
        if committed != items:
            raise RuntimeError(f"{workers} workers: {committed} of {items} items committed")
        if rep:  # the first run is the warm-up
            samples.append(elapsed / committed * 1e6)
            shipped.append(
                (counts["objects shipped"] - objects) / (counts["dispatches"] - dispatches)
            )


def periodic_scans(items: int) -> dict[str, Any]:
    """Per-call costs that grow with the number of items (not of workers),
    paid once per coordinator step or heartbeat: `HashWorkload.remaining()`
    (called by `Coordinator.run` every step) and the store's
    `roll_forward_candidates()` (every heartbeat: it reads every item's state).
    µs per call with `items` items, all done, in the workload and the store."""
    workload = HashWorkload(items)
    for _ in range(items):
        work_id = workload.take()
        assert work_id is not None
        workload.done(work_id)
    calls = 50
    started = time.perf_counter()
    for _ in range(calls):
        workload.remaining()
    remaining_us = (time.perf_counter() - started) / calls * 1e6
    transport = SimulatedTransport(2, hash_task)
    store = WorkStore(SimulatedFS(), "/store", TransportClock(transport, 1.7e9), ttl=SCALING_TTL)
    coordinator = Coordinator(CoordinatorConfig("scan"), transport, store, HashWorkload(items))
    coordinator.run()
    started = time.perf_counter()
    store.roll_forward_candidates()
    roll_forward_us = (time.perf_counter() - started) * 1e6
    started = time.perf_counter()
    store.roll_forward_candidates(full=True)
    full_look_us = (time.perf_counter() - started) * 1e6
    return {
        "items": items,
        "workload_remaining_us_per_call": remaining_us,
        "store_roll_forward_candidates_us_per_call": roll_forward_us,
        "store_full_look_us_per_call": full_look_us,
    }


def scaling_run(config: BenchConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    compiled = load_builds(lambda text: None).get("compiled")
    tables_module = compiled if compiled is not None else load_builds()["pure"]
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    sizes = list(config.scaling_workers)
    million = 1 << 20
    for workers in sizes:
        progress(f"2. scaling: coordinator, {workers:,} workers")
        row = coordinator_scaling(workers, config.scaling_items, config.scaling_repetitions)
        progress(f"2. scaling: tables alone, {workers:,} workers")
        median, low, high = median_of(
            3, time_lifecycles_across, tables_module, workers, config.tables_dispatches
        )
        row["tables_ns_per_lifecycle"] = {"median": median, "min": low, "max": high}
        rows.append(row)
    largest = rows[-1]
    # What the 1,048,576-worker row would take: setup grows with the workers,
    # the runs with the items.
    factor = million / largest["workers"]
    run_seconds = largest["us_per_item"]["median"] * 1e-6 * config.scaling_items
    estimate = largest["setup_seconds"] * factor + (1 + config.scaling_repetitions) * run_seconds
    if not config.scaling_million:
        notes.append(f"{million:,} workers skipped (--quick); estimated {estimate:.0f} s")
    elif estimate > config.scaling_allowance:
        notes.append(
            f"{million:,} workers skipped: estimated {estimate:.0f} s, over the "
            f"{config.scaling_allowance:.0f} s this row may take"
        )
    else:
        progress(f"2. scaling: coordinator, {million:,} workers")
        row = coordinator_scaling(million, config.scaling_items, config.scaling_repetitions)
        progress(f"2. scaling: tables alone, {million:,} workers")
        median, low, high = median_of(
            3, time_lifecycles_across, tables_module, million, config.tables_dispatches
        )
        row["tables_ns_per_lifecycle"] = {"median": median, "min": low, "max": high}
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["ratio_to_first"] = row["us_per_item"]["median"] / base["us_per_item"]["median"]
        row["tables_ratio_to_first"] = (
            row["tables_ns_per_lifecycle"]["median"] / base["tables_ns_per_lifecycle"]["median"]
        )
    notes.append(
        "each item ships an object of its own (the same work per dispatch at every size); "
        "the collector is frozen after each coordinator's setup (gc.freeze), so that its "
        "O(workers) objects are not walked by every full collection during the runs"
    )
    progress("2. scaling: scans that grow with the items")
    scans = periodic_scans(config.scaling_items * (1 + config.scaling_repetitions))
    return {
        "items_per_repetition": config.scaling_items,
        "repetitions": config.scaling_repetitions,
        "tables_build": "compiled" if compiled is not None else "pure",
        "rows": rows,
        "notes": notes,
        "periodic_scans": scans,
    }


# ---------------------------------------------------------------------------
# 3 and 4. mpiexec jobs
# ---------------------------------------------------------------------------


class JobOutcome(NamedTuple):
    report: dict[str, Any] | None
    error: str | None
    seconds: float


def _job_environment() -> dict[str, str]:
    """This environment, with the directory that holds this very dispatchtx
    first on PYTHONPATH, so every rank imports the code being measured."""
    package_parent = str(Path(dispatchtx.__file__).resolve().parents[1])
    paths = [package_parent, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def _tail(path: str, lines: int = 6) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as log:
        return " | ".join(line.rstrip() for line in log.readlines()[-lines:])
    return ""


def run_mpi_job(
    ranks: int, python_args: Sequence[str], report: str, timeout: float, log: str
) -> JobOutcome:
    """`mpiexec -n ranks python ARGS` in its own process group, its output to
    `log` (stdout stays the table); the JSON it writes to `report`. Past
    `timeout` the whole group is killed."""
    command = [find_mpiexec(), "-n", str(ranks), sys.executable, *python_args]
    started = time.monotonic()
    timed_out = False
    with open(log, "wb") as output:
        job = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_job_environment(),
        )
        try:
            code = job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_job(job)
            code = job.wait()
        except BaseException:
            kill_job(job)
            job.wait()
            raise
    seconds = time.monotonic() - started
    try:
        with open(report) as source:
            data: dict[str, Any] = json.load(source)
    except (OSError, ValueError):
        why = f"ran past {timeout:.0f} s: killed" if timed_out else f"exit status {code}"
        return JobOutcome(None, f"{why}, no report; log: {_tail(log)}", seconds)
    # A report whose job was then killed (hung at exit) still counts.
    return JobOutcome(data, None, seconds)


class JobRunner:
    """Names every job's files under one directory."""

    def __init__(self, directory: str, timeout: float) -> None:
        self.directory = directory
        self.timeout = timeout
        self.jobs = 0
        self.job_seconds = 0.0

    def run(self, ranks: int, python_args: Sequence[str], tag: str) -> JobOutcome:
        self.jobs += 1
        report = os.path.join(self.directory, f"{self.jobs:03d}-{tag}.json")
        log = os.path.join(self.directory, f"{self.jobs:03d}-{tag}.log")
        outcome = run_mpi_job(ranks, [*python_args, "--report", report], report, self.timeout, log)
        self.job_seconds += outcome.seconds
        return outcome

    def store_dir(self, tag: str) -> str:
        return os.path.join(self.directory, f"store-{self.jobs + 1:03d}-{tag}")

    def dispatchtx(
        self, ranks: int, depth: int, items: int, fs: str, tag: str, *, group_commit: bool = False
    ) -> tuple[float | None, str | None]:
        """results/s of one `dispatchtx.jobs.mpi_job` run, or the error."""
        outcome = self.run(
            ranks,
            [
                "-m",
                "dispatchtx.jobs.mpi_job",
                "--fs",
                fs,
                "--store",
                self.store_dir(tag),
                "--items",
                str(items),
                "--max-in-flight",
                str(depth),
                "--coordinator-id",
                "bench",
                *(["--group-commit"] if group_commit else []),
            ],
            tag,
        )
        if outcome.report is None:
            return None, outcome.error
        if not outcome.report.get("passed"):
            return None, f"the run did not pass its own checks: {outcome.report}"
        return float(outcome.report["results_per_second"]), None


def _rates(samples: list[float], errors: list[str]) -> dict[str, Any]:
    figure: dict[str, Any] = spread(samples) if samples else {"median": None}
    figure["errors"] = errors
    return figure


def mpi_run(
    config: BenchConfig, runner: JobRunner, progress: Callable[[str], None]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    library: str | None = None
    message_bytes: dict[str, Any] = {}
    depths = config.mpi_depths
    items = config.mpi_items
    depth_args = [str(depth) for depth in depths]
    for ranks in config.mpi_ranks:
        progress(f"3. real MPI, {ranks} ranks: dispatchtx warm-up job")
        runner.dispatchtx(ranks, depths[0], max(10, items // 4), "memory", f"warm-{ranks}")
        samples: dict[int, list[float]] = {depth: [] for depth in depths}
        errors: dict[int, list[str]] = {depth: [] for depth in depths}
        for rep in range(config.mpi_repetitions):
            for depth in depths:
                progress(
                    f"3. real MPI, {ranks} ranks: dispatchtx, max_in_flight {depth}, "
                    f"repetition {rep + 1}/{config.mpi_repetitions}"
                )
                rate, error = runner.dispatchtx(
                    ranks, depth, items, "memory", f"dtx-{ranks}-{depth}"
                )
                if rate is not None:
                    samples[depth].append(rate)
                if error is not None:
                    errors[depth].append(error)
        progress(f"3. real MPI, {ranks} ranks: raw mpi4py loop, max_in_flight {depths}")
        outcome = runner.run(
            ranks,
            [
                "-m",
                "dispatchtx.jobs.bench.raw_mpi",
                "--items",
                str(items),
                "--max-in-flight",
                *depth_args,
                "--repetitions",
                str(config.mpi_repetitions),
            ],
            f"raw-{ranks}",
        )
        raw: dict[int, dict[str, Any]] = {}
        for depth in depths:
            if outcome.report is None:
                raw[depth] = _rates([], [str(outcome.error)])
            else:
                rates = outcome.report["by_max_in_flight"][str(depth)]["results_per_second"]
                raw[depth] = _rates(rates, [])
        if outcome.report is not None:
            library = library or outcome.report.get("mpi_library")
            message_bytes = {
                "raw_work": outcome.report.get("work_message_bytes"),
                "raw_result": outcome.report.get("result_message_bytes"),
            }
        progress(f"3. real MPI, {ranks} ranks: mpi4py.futures")
        outcome = runner.run(
            ranks,
            [
                "-m",
                "mpi4py.futures",
                "-m",
                "dispatchtx.jobs.bench.futures_mpi",
                "--items",
                str(items),
                "--repetitions",
                str(config.mpi_repetitions),
            ],
            f"futures-{ranks}",
        )
        if outcome.report is None:
            futures = _rates([], [str(outcome.error)])
        else:
            futures = _rates(outcome.report["results_per_second"], [])
        for depth in depths:
            ours = _rates(samples[depth], errors[depth])
            row: dict[str, Any] = {
                "ranks": ranks,
                "max_in_flight": depth,
                "dispatchtx": ours,
                "raw": raw[depth],
                "futures": futures,
                "dispatchtx_over_raw": _ratio(ours, raw[depth]),
                "dispatchtx_over_futures": _ratio(ours, futures),
            }
            rows.append(row)
    message_bytes.update(dispatchtx_message_sizes())
    return {
        "items_per_repetition": items,
        "repetitions": config.mpi_repetitions,
        "rows": rows,
        "mpi_library": library,
        "message_bytes": message_bytes,
        "notes": [
            "dispatchtx: one mpiexec job per repetition (mpi_job runs once), after a warm-up "
            "job; raw: one job for both depths, futures: one job; each a warm-up round, then "
            "the repetitions",
            "mpi4py.futures has no per-worker depth: every round submits all its tasks at "
            "once (the pool at its best); the same figure stands beside both depths",
        ],
    }


def _ratio(numerator: dict[str, Any], denominator: dict[str, Any]) -> float | None:
    top, bottom = numerator.get("median"), denominator.get("median")
    if top is None or not bottom:
        return None
    return float(top) / float(bottom)


def dispatchtx_message_sizes() -> dict[str, float]:
    """Wire bytes of a HashWorkload Work (first dispatch to a worker, with the
    object; later ones, without) and of its Result."""
    from dispatchtx.transport import Result, Work, encode

    workload = HashWorkload(8)
    item = workload.items[3]
    object_id = workload.object_for(item)
    payload = [item, object_id]
    digest = workload.expected(item)
    with_object = Work(1 << 40, item, 3, payload, {object_id: workload.object_content(object_id)})
    return {
        "dispatchtx_work_first": float(len(encode(with_object))),
        "dispatchtx_work": float(len(encode(Work(1 << 40, item, 3, payload, {})))),
        "dispatchtx_result": float(len(encode(Result(1 << 40, item, 3, digest, 0.001)))),
    }


def durable_counts(
    directory: str,
    items: int,
    workers: int,
    *,
    max_in_flight: int = 1,
    group_commit: bool = False,
) -> dict[str, Any]:
    """The shape of one `mpi_job --fs real` run in process: a fresh store on
    the real disk through `CountingFS`, `workers` simulated workers, the same
    items and settings; fsyncs per committed item by kind, and the rate."""
    fs = CountingFS()
    transport = SimulatedTransport(workers, hash_task)
    store = WorkStore(fs, directory, RealClock(), ttl=SCALING_TTL)
    workload = HashWorkload(items)
    config = CoordinatorConfig(
        "bench", deadline=2.0, max_in_flight=max_in_flight, group_commit=group_commit
    )
    coordinator = Coordinator(config, transport, store, workload)
    before = fs.count.snapshot()
    started = time.perf_counter()
    coordinator.run()
    elapsed = time.perf_counter() - started
    committed = coordinator.stats.counts["committed"]
    coordinator.shutdown()
    if committed != items:
        raise RuntimeError(f"durable path in process: {committed} of {items} committed")
    return {"rate": committed / elapsed, **per_op(fs.count.since(before), committed)}


def durable_run(
    config: BenchConfig, runner: JobRunner, base: str, progress: Callable[[str], None]
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
    batching = durable_batching(config, runner, base, counter, progress)
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
            "starts on a fresh store too: its first commits also make objects/<aa>/ durable)",
            "group commit (claims of one pass over the free workers, results of one poll: "
            "their directory fsyncs at the end of one store batch) is off by default and on "
            "only in the 'grouped' row; mpi_job runs no journal (the journal's group policy "
            "is in section 5)",
        ],
    }


BATCHING_DEPTH: Final = 4


def durable_batching(
    config: BenchConfig,
    runner: JobRunner,
    base: str,
    counter: Iterator[int],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """How group commit moves the durable path: mpi_job --fs real at
    `max_in_flight` BATCHING_DEPTH, batches on and off, in the same run;
    fsyncs per item counted in process for both."""
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
                group_commit=grouped,
            )

        counted = repeated(reps, count)
        samples: list[float] = []
        errors: list[str] = []
        for rep in range(reps):
            progress(f"4. durable path, batching: mpi_job --fs real, {label}, {rep + 1}/{reps}")
            rate, error = runner.dispatchtx(
                ranks, BATCHING_DEPTH, items, "real", "durable-batch", group_commit=grouped
            )
            if rate is not None:
                samples.append(rate)
            if error is not None:
                errors.append(error)
        rows[label] = {
            "mpi": _rates(samples, errors),
            "fsyncs_per_item": counted["fsyncs_per_op"],
            "in_process": {key: counted[key] for key in ("median", "min", "max", "samples")},
        }
    grouped_rate = rows["grouped"]["mpi"]["median"]
    single_rate = rows["one at a time"]["mpi"]["median"]
    return {
        "max_in_flight": BATCHING_DEPTH,
        "rows": rows,
        "speedup": None if grouped_rate is None or not single_rate else grouped_rate / single_rate,
    }


def _without_fsync(
    fn: Callable[[str, int, int], dict[str, Any]], directory: str, items: int, workers: int
) -> dict[str, Any]:
    with fsync_disabled():
        return fn(directory, items, workers)


# ---------------------------------------------------------------------------
# 5. The journal and the store (also benchmarks/store_bench.py, whose
#    docstring says what each figure is and how fsyncs are counted)
# ---------------------------------------------------------------------------

GROUP_SIZE: Final = 16
COMPETING_PROCESSES: Final = 8
TTL: Final = 3600.0  # no claim expires during a run: every claim is of a new item
SMALL_WRITE: Final = b"x" * 64
_KEY: Final = re.compile(r"[0-9a-f]{64}")  # an item's directory name, shortened in traces
BARRIER_TIMEOUT: Final = 120.0
REPORT_TIMEOUT: Final = 600.0


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
# Counting fsyncs
# ---------------------------------------------------------------------------


#: The kinds of fsync counted and timed: a file just created and written; an
#: existing file written (appended to, or rewritten in place); a directory
#: with a name changed in it since its last fsync; a directory unchanged
#: ("clean": much cheaper on ext4).
KINDS: Final = ("new", "rewrite", "dir", "clean")


class FsyncCount:
    """Fsyncs done so far, by kind (see `KINDS`)."""

    __slots__ = ("by_kind",)

    def __init__(self) -> None:
        self.by_kind = dict.fromkeys(KINDS, 0)

    def add(self, kind: str) -> None:
        self.by_kind[kind] += 1

    def snapshot(self) -> dict[str, int]:
        return dict(self.by_kind)

    def since(self, before: dict[str, int]) -> dict[str, int]:
        return {kind: self.by_kind[kind] - before[kind] for kind in KINDS}


class CountingAppendHandle(RealAppendHandle):
    """A `RealAppendHandle` that counts its fsyncs."""

    __slots__ = ("_fs",)

    def __init__(self, path: str, fd: int, fs: CountingFS) -> None:
        super().__init__(path, fd)
        self._fs = fs

    def fsync(self) -> None:
        super().fsync()
        self._fs.count.add("rewrite")
        self._fs.note("rewrite", f"append handle fsync({self.path})")


class CountingFS(RealFS):
    """`RealFS` counting every fsync it does, those inside `mkdir` included
    (it calls `self.fsync_dir`), at the cost of a few Python operations per
    call. A directory fsync counts as "clean" if this FS changed nothing in
    that directory since it last fsynced it (a name created, linked, renamed
    or unlinked). With `trace` set, each fsync is also listed there."""

    __slots__ = ("_dirty", "_in_mkdir", "_root", "count", "trace")

    def __init__(self, root: str = "/") -> None:
        self.count = FsyncCount()
        self.trace: list[str] | None = None
        self._root = root  # paths in the trace are shown relative to it
        self._dirty: set[str] = set()
        self._in_mkdir = False

    def note(self, kind: str, what: str) -> None:
        if self.trace is not None:
            inside = " inside mkdir" if self._in_mkdir else ""
            line = f"{kind:<7} {what}{inside}".replace(self._root + os.sep, "")
            self.trace.append(_KEY.sub(lambda key: key.group()[:8] + "...", line))

    def _changed(self, directory: str) -> None:
        self._dirty.add(os.path.normpath(directory))

    def write_temp(self, directory: str, data: bytes) -> str:
        self._changed(directory)
        path = super().write_temp(directory, data)
        self.count.add("new")
        self.note("new", f"write_temp({directory})")
        return path

    def link(self, src: str, dst: str) -> None:
        super().link(src, dst)
        self._changed(os.path.dirname(dst))

    def rename(self, src: str, dst: str) -> None:
        self._changed(os.path.dirname(src))
        self._changed(os.path.dirname(dst))
        super().rename(src, dst)

    def unlink(self, path: str) -> None:
        super().unlink(path)
        self._changed(os.path.dirname(path))

    def mkdir(self, path: str) -> None:
        current = path
        while not os.path.isdir(current):
            parent = os.path.dirname(current) or "."
            self._changed(parent)
            if parent == current:
                break
            current = parent
        self._in_mkdir = True
        try:
            super().mkdir(path)
        finally:
            self._in_mkdir = False

    def pwrite(self, path: str, offset: int, data: bytes, *, sync: bool = True) -> None:
        created = not os.path.lexists(path)
        if created:
            self._changed(os.path.dirname(path))
        super().pwrite(path, offset, data, sync=sync)
        if sync:
            kind = "new" if created else "rewrite"
            self.count.add(kind)
            self.note(kind, f"pwrite({path})")

    def fsync_dir(self, path: str) -> None:
        super().fsync_dir(path)
        key = os.path.normpath(path)
        if key in self._dirty:
            self._dirty.discard(key)
            self.count.add("dir")
            self.note("dir", f"fsync_dir({path})")
        else:
            self.count.add("clean")
            self.note("clean", f"fsync_dir({path}), unchanged since its last fsync")

    def open_append(self, path: str) -> CountingAppendHandle:
        self._changed(os.path.dirname(path))
        # The flags of RealFS.open_append, with a counting handle.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return CountingAppendHandle(path, fd, self)


def _no_fsync(fd: object) -> None:
    return None


@contextlib.contextmanager
def fsync_disabled(disabled: bool = True) -> Iterator[None]:
    """Make `os.fsync` a no-op in this process (for the "where time goes"
    split only: nothing measured this way is durable)."""
    if not disabled:
        yield
        return
    real = os.fsync
    os.fsync = _no_fsync
    try:
        yield
    finally:
        os.fsync = real


# ---------------------------------------------------------------------------
# Statistics and bounds
# ---------------------------------------------------------------------------


def summary(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "min": ordered[0],
        "max": ordered[-1],
    }


def repeated(reps: int, fn: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Run `fn(tag)` once as a warm-up, then `reps` times, each with a tag of
    its own; keep the median, min and max of its "rate", and the other
    figures (fsyncs per op, ...) of the median run."""
    fn("w")
    runs = [fn(f"r{rep}") for rep in range(reps)]
    rates = [run["rate"] for run in runs]
    median_run = sorted(runs, key=lambda run: float(run["rate"]))[len(runs) // 2]
    result: dict[str, Any] = {
        "median": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "samples": rates,
    }
    result.update({key: value for key, value in median_run.items() if key != "rate"})
    return result


def per_op(fsyncs: dict[str, int], ops: int) -> dict[str, Any]:
    return {"fsyncs_per_op": {kind: fsyncs[kind] / ops for kind in KINDS}}


def fsync_seconds(figure: dict[str, Any], latency: dict[str, float]) -> float:
    """The time one operation's counted fsyncs take, one after another."""
    counts: dict[str, float] = figure["fsyncs_per_op"]
    return sum(count * latency[kind] for kind, count in counts.items())


def fsync_bound(figure: dict[str, Any], latency: dict[str, float]) -> float | None:
    """Operations/s that the fsyncs alone allow (None: no fsync)."""
    seconds = fsync_seconds(figure, latency)
    return None if seconds <= 0 else 1.0 / seconds


# ---------------------------------------------------------------------------
# 5.1 The store and the journal: fsync latency
# ---------------------------------------------------------------------------


def fsync_latencies(directory: str, samples: int, tag: str) -> dict[str, list[float]]:
    """Seconds per fsync, by kind: write 64 B to a new file + fsync (as
    `write_temp`); append 64 B to an open file + fsync (as a journal); fsync a
    directory a name was just linked into (as every publication); fsync it
    again, unchanged."""
    files = os.path.join(directory, f"fsync-{tag}-files")
    links = os.path.join(directory, f"fsync-{tag}-links")
    os.mkdir(files)
    os.mkdir(links)
    file_times: list[float] = []
    append_times: list[float] = []
    dir_times: list[float] = []
    clean_times: list[float] = []
    warm_up = 10
    append_path = os.path.join(directory, f"fsync-{tag}-appended")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    append_fd = os.open(append_path, flags, 0o644)
    for i in range(samples + warm_up):
        start = time.perf_counter()
        os.write(append_fd, SMALL_WRITE)
        os.fsync(append_fd)
        append_time = time.perf_counter() - start
        path = os.path.join(files, f"f{i}")
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        try:
            start = time.perf_counter()
            os.write(fd, SMALL_WRITE)
            os.fsync(fd)
            file_time = time.perf_counter() - start
        finally:
            os.close(fd)
        os.link(path, os.path.join(links, f"l{i}"))
        dir_fd = os.open(links, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            start = time.perf_counter()
            os.fsync(dir_fd)
            dir_time = time.perf_counter() - start
            start = time.perf_counter()
            os.fsync(dir_fd)  # again: nothing changed since
            clean_time = time.perf_counter() - start
        finally:
            os.close(dir_fd)
        if i >= warm_up:
            append_times.append(append_time)
            file_times.append(file_time)
            dir_times.append(dir_time)
            clean_times.append(clean_time)
    os.close(append_fd)
    return {"new": file_times, "rewrite": append_times, "dir": dir_times, "clean": clean_times}


# ---------------------------------------------------------------------------
# 5.2 The store and the journal: Journal appends
# ---------------------------------------------------------------------------


def _count_event(state: int, event: Event) -> int:
    return state + 1


MODEL: Final[JournalModel[int]] = json_model(0, _count_event)


def journal_run(
    directory: str, policy: FsyncPolicy, n: int, group: int | None, tag: str
) -> dict[str, Any]:
    fs = CountingFS()
    # compact_every=None: a compaction would rewrite the file mid-run.
    journal = Journal(
        fs, os.path.join(directory, f"{tag}.journal"), MODEL, policy=policy, compact_every=None
    )
    events = [
        Event("dispatch", {"id": i, "worker": i % 8, "token": i + 1, "state": "sent"})
        for i in range(n)
    ]
    before = fs.count.snapshot()
    try:
        start = time.perf_counter()
        if group is None:
            for event in events:
                journal.append(event)
        else:
            for first in range(0, n, group):
                with journal.group():
                    for event in events[first : first + group]:
                        journal.append(event)
        elapsed = time.perf_counter() - start
    finally:
        journal.close()
    if journal.state != n:
        raise RuntimeError(f"journal {tag}: {journal.state} records applied, expected {n}")
    return {"rate": n / elapsed, **per_op(fs.count.since(before), n)}


# ---------------------------------------------------------------------------
# 5.3 The store and the journal: Claims, 1 and 8 processes
# ---------------------------------------------------------------------------


class ClaimerReport(NamedTuple):
    start: float  # time.monotonic(): one system-wide clock for every process
    end: float
    claimed: list[int]  # indices into the pool
    outcomes: dict[str, int]
    fsyncs: dict[str, int]  # by kind
    error: str | None


def _claimer(
    root: str,
    coordinator: str,
    work_ids: list[str],
    seed: str | None,
    no_fsync: bool,
    barrier: Any,
    reports: Any,
) -> None:
    """One competing coordinator (a forked child): claim every item of the
    pool it can, in its order, once the barrier lets every child start."""
    try:
        fs = CountingFS()
        store = WorkStore(fs, root, RealClock(), ttl=TTL)
        store.register(coordinator)
        # Untimed: a first claim creates the store's directories and caches.
        if store.claim(f"warm-up-{coordinator}") is None:
            raise RuntimeError("the warm-up claim failed")
        order = list(range(len(work_ids)))
        if seed is not None:
            random.Random(seed).shuffle(order)
        claimed: list[int] = []
        outcomes: dict[str, int] = {}
        with fsync_disabled(no_fsync):
            barrier.wait(BARRIER_TIMEOUT)
            before = fs.count.snapshot()
            start = time.monotonic()
            for index in order:
                outcome = store.try_claim(work_ids[index]).outcome
                if outcome is ClaimOutcome.CLAIMED:
                    claimed.append(index)
                outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
            end = time.monotonic()
        report = ClaimerReport(start, end, claimed, outcomes, fs.count.since(before), None)
    except BaseException as error:  # report it: the parent must not wait forever
        with contextlib.suppress(Exception):
            barrier.abort()
        report = ClaimerReport(0.0, 0.0, [], {}, {}, f"{coordinator}: {error!r}")
    reports.put(report)


def claim_run(
    root: str, processes: int, n: int, shuffled: bool, no_fsync: bool, tag: str
) -> dict[str, Any]:
    """Claims/s of `processes` forked coordinators sharing one pool of `n` new items."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    reports = context.Queue()
    work_ids = [f"{tag}-item-{i}" for i in range(n)]
    children = [
        context.Process(
            target=_claimer,
            args=(
                root,
                f"{tag}-p{p}",
                work_ids,
                f"{tag}-p{p}" if shuffled else None,
                no_fsync,
                barrier,
                reports,
            ),
        )
        for p in range(processes)
    ]
    for child in children:
        child.start()
    got: list[ClaimerReport] = [reports.get(timeout=REPORT_TIMEOUT) for _ in children]
    for child in children:
        child.join()
    errors = [report.error for report in got if report.error is not None]
    if errors:
        raise RuntimeError("claimer failed: " + "; ".join(errors))
    claimed = [index for report in got for index in report.claimed]
    if len(claimed) != len(set(claimed)) or len(claimed) != n:
        # A correctness check of the store, not of timing: report and stop.
        raise RuntimeError(
            f"claims {tag}: {len(claimed)} successful claims of {len(set(claimed))} distinct "
            f"items out of {n}: every item must be claimed exactly once"
        )
    elapsed = max(report.end for report in got) - min(report.start for report in got)
    outcomes: dict[str, int] = {}
    for report in got:
        for name, count in report.outcomes.items():
            outcomes[name] = outcomes.get(name, 0) + count
    return {
        "rate": n / elapsed,
        **per_op({kind: sum(report.fsyncs[kind] for report in got) for kind in KINDS}, n),
        "outcomes_per_claim": {name: count / n for name, count in sorted(outcomes.items())},
    }


# ---------------------------------------------------------------------------
# 5.4 The store and the journal: Commits
# ---------------------------------------------------------------------------


def warm_object_directories(store: WorkStore) -> None:
    """Put 256 objects whose ids start with every two-hex-digit prefix, so that
    this store has made each `objects/<aa>/` durable once, as a long-running
    coordinator has: the first object a store instance puts under a prefix
    costs one directory fsync more (and two more if the directory is new)."""
    by_prefix: dict[str, bytes] = {}
    i = 0
    while len(by_prefix) < 256:
        content = b"warm-up object %d" % i
        by_prefix.setdefault(hashlib.sha256(content).hexdigest()[:2], content)
        i += 1
    for content in by_prefix.values():
        store.objects.put(content)


def _object_with_prefix(prefix: str) -> bytes:
    i = 0
    while hashlib.sha256(b"warm-up object %d" % i).hexdigest()[:2] != prefix:
        i += 1
    return b"warm-up object %d" % i


def trace_operations(base: str) -> dict[str, list[str]]:
    """The fsyncs of single operations of one process, in order, each store
    directory already made durable (as in the timed runs)."""
    root = os.path.join(base, "trace")
    fs = CountingFS(root)
    store = WorkStore(fs, root, RealClock(), ttl=TTL)
    store.register("tracer")
    store.claim("trace-warm-up")
    result = b"a result"
    store.objects.put(_object_with_prefix(hashlib.sha256(result).hexdigest()[:2]))
    traces: dict[str, list[str]] = {}

    def traced(label: str, operation: Callable[[], object]) -> None:
        fs.trace = []
        operation()
        traces[label] = fs.trace
        fs.trace = None

    tokens: dict[str, int | None] = {}
    traced("claim of a new item", lambda: tokens.update(a=store.claim("item-a")))
    token = tokens["a"]
    assert token is not None
    traced("heartbeat", lambda: store.heartbeat("item-a", token))
    traced("begin_commit", lambda: store.begin_commit("item-a", token, result))
    traced("complete", lambda: store.complete("item-a", token))
    tokens.update(b=store.claim("item-b"))
    token_b = tokens["b"]
    assert token_b is not None
    traced("abandon", lambda: store.abandon("item-b", token_b))
    traced("claim of an abandoned item", lambda: store.claim("item-b"))
    return traces


class Committer:
    """One registered store that commits claimed items."""

    def __init__(self, root: str) -> None:
        self.fs = CountingFS()
        self.store = WorkStore(self.fs, root, RealClock(), ttl=TTL)
        self.store.register("committer")
        warm_object_directories(self.store)

    def run(self, tag: str, n: int, no_fsync: bool = False) -> dict[str, Any]:
        work_ids = [f"{tag}-item-{i}" for i in range(n)]
        tokens: list[int] = []
        for work_id in work_ids:  # untimed: claim them first
            token = self.store.claim(work_id)
            if token is None:
                raise RuntimeError(f"could not claim {work_id}")
            tokens.append(token)
        results = [
            b"result of %s: %d\n" % (work_id.encode(), i) for i, work_id in enumerate(work_ids)
        ]
        failures = 0
        with fsync_disabled(no_fsync):
            before = self.fs.count.snapshot()
            start = time.perf_counter()
            for work_id, token, result in zip(work_ids, tokens, results, strict=True):
                committed = self.store.begin_commit(work_id, token, result)
                completed = self.store.complete(work_id, token)
                if committed is not CommitOutcome.COMMITTED:
                    failures += 1
                if completed is not CompleteOutcome.COMPLETED:
                    failures += 1
            elapsed = time.perf_counter() - start
        if failures:
            raise RuntimeError(f"commits {tag}: {failures} commit or complete calls failed")
        return {"rate": n / elapsed, **per_op(self.fs.count.since(before), n)}


# ---------------------------------------------------------------------------
# 5. The store and the journal: the run
# ---------------------------------------------------------------------------


def filesystem_of(path: str) -> str:
    """'type on device' of the mount holding `path`, from /proc/mounts."""
    real = os.path.realpath(path)
    best = ("", "unknown")
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 3:
                continue
            device, mount_point, kind = fields[0], fields[1], fields[2]
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[0]):
                best = (mount_point, f"{kind} on {device}")
    return best[1]


def progress_on_terminal(text: str) -> None:
    """Say what runs now, on a terminal only (stdout stays the table)."""
    if sys.stderr.isatty():
        print(f"  {text} ...".ljust(70), end="\r", file=sys.stderr, flush=True)


def store_run(
    config: StoreConfig, base: str, progress: Callable[[str], None] = progress_on_terminal
) -> dict[str, Any]:
    reps = config.repetitions
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "directory": base,
        "filesystem": filesystem_of(base),
        "config": asdict(config),
        "load_average_at_start": os.getloadavg(),
        "figures": {},
    }

    progress("fsync latency")
    first = fsync_latencies(base, config.fsync_samples, "start")

    figures: dict[str, Any] = results["figures"]
    for name, policy, n, group in (
        ("journal append, every", FsyncPolicy.EVERY, config.journal_every, None),
        (
            f"journal append, group of {GROUP_SIZE}",
            FsyncPolicy.GROUP,
            config.journal_group,
            GROUP_SIZE,
        ),
        ("journal append, none", FsyncPolicy.NONE, config.journal_none, None),
    ):
        progress(name)
        directory = os.path.join(base, f"journal-{policy.value}")
        os.mkdir(directory)
        figures[name] = repeated(reps, functools.partial(journal_run, directory, policy, n, group))

    claim_figures: list[tuple[str, int, bool, bool]] = [
        ("claim, 1 process", 1, False, False),
        (f"claim, {COMPETING_PROCESSES} processes, same order", COMPETING_PROCESSES, False, False),
        (
            f"claim, {COMPETING_PROCESSES} processes, own shuffled order",
            COMPETING_PROCESSES,
            True,
            False,
        ),
        ("claim, 1 process, os.fsync a no-op", 1, False, True),
    ]
    for index, (name, processes, shuffled, no_fsync) in enumerate(claim_figures):
        progress(name)
        root = os.path.join(base, f"claims-{index}")  # a store directory per figure
        figures[name] = repeated(
            reps,
            functools.partial(claim_run, root, processes, config.claim_items, shuffled, no_fsync),
        )

    progress("commit+complete")
    committer = Committer(os.path.join(base, "commits"))
    figures["commit+complete, 1 process"] = repeated(
        reps, lambda tag: committer.run(f"c{tag}", config.commit_items)
    )
    figures["commit+complete, 1 process, os.fsync a no-op"] = repeated(
        reps, lambda tag: committer.run(f"n{tag}", config.commit_items, no_fsync=True)
    )

    progress("fsync latency again")
    last = fsync_latencies(base, config.fsync_samples, "end")
    progress("tracing the fsyncs of single operations")
    results["fsync_traces"] = trace_operations(base)
    progress("")

    results["load_average_at_end"] = os.getloadavg()
    latency = {kind: statistics.median(first[kind] + last[kind]) for kind in first}
    results["fsync_latency_s"] = {
        "samples_per_batch": config.fsync_samples,
        "used_for_bounds": latency,
        "start": {kind: summary(samples) for kind, samples in first.items()},
        "end": {kind: summary(samples) for kind, samples in last.items()},
    }

    # Bounds: what one operation's own fsyncs allow (the 1-process count).
    alone = {
        "claim": figures["claim, 1 process"],
        "commit": figures["commit+complete, 1 process"],
    }
    for name, figure in figures.items():
        if "no-op" in name:
            figure["bound"] = None
            continue
        base_figure = alone["claim"] if name.startswith("claim") else figure
        if name.startswith("commit"):
            base_figure = alone["commit"]
        bound = fsync_bound(base_figure, latency)
        figure["bound"] = bound
        figure["fraction_of_bound"] = None if bound is None else figure["median"] / bound

    breakdown: dict[str, Any] = {}
    for label, with_fsync, without in (
        ("claim of a new item", "claim, 1 process", "claim, 1 process, os.fsync a no-op"),
        (
            "begin_commit + complete",
            "commit+complete, 1 process",
            "commit+complete, 1 process, os.fsync a no-op",
        ),
    ):
        measured = 1.0 / figures[with_fsync]["median"]
        figure = figures[with_fsync]
        fsync_time = fsync_seconds(figure, latency)
        rest = 1.0 / figures[without]["median"]
        breakdown[label] = {
            "measured_s": measured,
            "fsync_estimate_s": fsync_time,
            "without_fsync_s": rest,
            "unexplained_s": measured - fsync_time - rest,
        }
    results["where_time_goes"] = breakdown
    return results


# ---------------------------------------------------------------------------
# 5. The store and the journal: printing (benchmarks/store_bench.py)
# ---------------------------------------------------------------------------


def _count(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 0.005 else f"{value:.2f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


LATENCY_LABELS: Final = {
    "new": "new: write 64 B to a new file + fsync",
    "rewrite": "rewrite: append 64 B to a file + fsync",
    "dir": "dir: fsync a directory after a link() into it",
    "clean": "clean: fsync an unchanged directory",
}


def _fsyncs_shown(per_op: dict[str, float]) -> str:
    """Like '3n+3d+1c': the nonzero counts, each with its kind's initial."""
    parts = [f"{_count(count)}{kind[0]}" for kind, count in per_op.items() if count]
    return "+".join(parts) or "0"


def print_store_table(results: dict[str, Any]) -> None:
    config = results["config"]
    latency = results["fsync_latency_s"]
    print(
        f"dispatchtx store and journal, Python {results['python']}, {results['machine']}, "
        f"{results['cpus']} CPUs"
    )
    print(f"disk: {results['directory']} ({results['filesystem']})")
    print(
        "load average (1, 5, 15 min) at start "
        + ", ".join(f"{load:.2f}" for load in results["load_average_at_start"])
        + "; at end "
        + ", ".join(f"{load:.2f}" for load in results["load_average_at_end"])
    )
    print(
        f"{config['repetitions']} repetitions after a warm-up; median [min .. max]; "
        "bounds from the fsync medians below"
    )
    print()
    print(f"{'fsync latency, ms':<56}{'median':>9}{'p90':>9}{'min':>9}{'max':>9}")
    for kind, label in LATENCY_LABELS.items():
        for batch in ("start", "end"):
            stats = latency[batch][kind]
            print(
                f"{f'{label} ({batch})':<56}"
                + "".join(f"{_ms(stats[key]):>9}" for key in ("median", "p90", "min", "max"))
            )
    used = latency["used_for_bounds"]
    print(
        "used for bounds (median of both batches): "
        + ", ".join(f"{kind} {_ms(used[kind])} ms" for kind in KINDS)
    )
    print()
    print(
        f"{'figure (ops/s)':<44}{'median':>9}{'min':>9}{'max':>9}"
        f"{'fsyncs/op':>26}{'fsync bound':>13}{'of bound':>10}"
    )
    print(f"{'':<71}{'(kinds: below)':>26}")
    for name, figure in results["figures"].items():
        fsyncs = _fsyncs_shown(figure["fsyncs_per_op"])
        if figure.get("bound") is not None:
            bound = f"{figure['bound']:>13,.0f}{figure['fraction_of_bound']:>10.0%}"
        elif "no-op" in name:
            bound = f"{'(diagnostic)':>13}"
        else:
            bound = f"{'no fsync':>13}{'-':>10}"
        print(
            f"{name:<44}{figure['median']:>9,.0f}{figure['min']:>9,.0f}{figure['max']:>9,.0f}"
            f"{fsyncs:>26}{bound}"
        )
    print(
        "  fsyncs/op by kind: n = new file, r = rewritten or appended file, d = directory "
        "with a change,\n  c = clean (unchanged) directory. Bounds: 1-process counts; "
        f"{COMPETING_PROCESSES} processes may pass them\n  (concurrent fsyncs share "
        "filesystem journal commits)."
    )
    print()
    print("claims with competition, per successful claim:")
    for name, figure in results["figures"].items():
        if "outcomes_per_claim" in figure and "processes" in name:
            shown = ", ".join(
                f"{outcome} {count:.2f}" for outcome, count in figure["outcomes_per_claim"].items()
            )
            print(f"  {name}: {shown}")
    print()
    print("the fsyncs of one operation, in order (1 process; paths under the store root):")
    for label, trace in results["fsync_traces"].items():
        print(f"  {label}:")
        for line in trace:
            print(f"    {line}")
    print()
    print(
        f"{'where time goes, ms/op (1 process)':<36}{'measured':>10}{'fsyncs':>10}"
        f"{'no fsync':>10}{'rest':>10}"
    )
    for label, parts in results["where_time_goes"].items():
        print(
            f"{label:<36}"
            + "".join(
                f"{_ms(parts[key]):>10}"
                for key in ("measured_s", "fsync_estimate_s", "without_fsync_s", "unexplained_s")
            )
        )
    print(
        "  (fsyncs = counted fsyncs x median latency; no fsync = the same run with os.fsync a "
        "no-op;\n   rest = measured - both, e.g. fsyncs slower in the mix than alone)"
    )


def store_main(argv: list[str] | None = None, description: str = "") -> int:
    """benchmarks/store_bench.py: the store's and the journal's figures alone."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="fewer items and repetitions")
    parser.add_argument("--dir", help="make the temp directory under this one (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = parser.parse_args(argv)
    config = STORE_QUICK if args.quick else STORE_DEFAULT
    base = tempfile.mkdtemp(prefix="store_bench.", dir=args.dir)
    started = time.monotonic()
    try:
        results = store_run(config, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    results["wall_seconds"] = time.monotonic() - started
    print_store_table(results)
    print(f"\n{results['wall_seconds']:.0f} s" + (f"; kept {base}" if args.keep else ""))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


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

SECTIONS: Final = ("core", "scaling", "mpi", "durable", "store")


def _prefixed(progress: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    """`progress` with `prefix: ` before each text; an empty text (a stage's end) is dropped."""

    def say(text: str) -> None:
        if text.strip(" ."):
            progress(f"{prefix}: {text.strip(' .')}")

    return say


def run(
    config: BenchConfig,
    progress: Callable[[str], None],
    sections: Sequence[str] = SECTIONS,
    directory: str | None = None,
) -> dict[str, Any]:
    """Every section of `sections`, in order, in this process and its jobs."""
    started = time.monotonic()
    results: dict[str, Any] = {
        "versions": versions(),
        "machine": machine(),
        "config": asdict(config),
        "load_average_at_start": os.getloadavg(),
        "sections": {},
    }
    figures: dict[str, Any] = results["sections"]
    base = tempfile.mkdtemp(prefix="dispatchtx-bench.", dir=directory)
    try:
        if "core" in sections:
            progress("1. core")
            figures["core"] = core_run(
                config.core_dispatches,
                config.core_repetitions,
                config.core_in_flight,
                progress=_prefixed(progress, "1. core"),
                warn=progress,
            )
        if "scaling" in sections:
            figures["scaling"] = scaling_run(config, progress)
        runner = JobRunner(base, config.job_timeout)
        if "mpi" in sections:
            figures["mpi"] = mpi_run(config, runner, progress)
            results["versions"]["mpi_library"] = figures["mpi"]["mpi_library"]
        if "durable" in sections:
            durable_base = os.path.join(base, "durable")
            os.mkdir(durable_base)
            figures["durable"] = durable_run(config, runner, durable_base, progress)
        if "store" in sections:
            store_base = os.path.join(base, "store")
            os.mkdir(store_base)
            figures["store"] = store_run(config.store, store_base, _prefixed(progress, "5. store"))
        results["mpiexec_jobs"] = runner.jobs
        results["mpiexec_job_seconds"] = runner.job_seconds
    finally:
        shutil.rmtree(base, ignore_errors=True)
    results["load_average_at_end"] = os.getloadavg()
    results["targets"] = targets(figures)
    results["wall_seconds"] = time.monotonic() - started
    return results


# ---------------------------------------------------------------------------
# Targets (issue 12)
# ---------------------------------------------------------------------------


def _target(text: str, measured: str, met: bool | None) -> dict[str, Any]:
    return {"target": text, "measured": measured, "met": met}


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    core = figures.get("core")
    if core is not None and "compiled" in core["builds"]:
        speedup = core["speedup"]["lifecycle_ns"]
        found.append(
            _target("compiled lifecycle >= 3x faster than pure", f"{speedup:.2f}x", speedup >= 3)
        )
        compiled = core["builds"]["compiled"]
        ns = compiled["lifecycle_ns"]["median"]
        found.append(_target("compiled lifecycle <= 1 us", f"{ns:.0f} ns", ns <= 1000))
        size = compiled["bytes_per_in_flight_dispatch"]
        found.append(
            _target("<= 512 bytes per in-flight dispatch (compiled)", f"{size:.0f} B", size <= 512)
        )
    scaling = figures.get("scaling")
    if scaling is not None:
        rows = {row["workers"]: row for row in scaling["rows"]}
        first = scaling["rows"][0]["workers"]
        if 65_536 in rows:
            ratio = rows[65_536]["ratio_to_first"]
            found.append(
                _target(
                    f"per-dispatch cost at 65,536 workers <= 1.2x that at {first:,}",
                    f"{ratio:.2f}x",
                    ratio <= 1.2,
                )
            )
    mpi = figures.get("mpi")
    if mpi is not None:
        for label, key, threshold in (
            ("dispatchtx >= 90% of the raw mpi4py loop", "dispatchtx_over_raw", 0.9),
            ("dispatchtx >= 5x mpi4py.futures", "dispatchtx_over_futures", 5.0),
            ("dispatchtx beats the raw pickle loop outright", "dispatchtx_over_raw", 1.0),
        ):
            ratios = [row[key] for row in mpi["rows"]]
            known = [ratio for ratio in ratios if ratio is not None]
            if not known:
                found.append(_target(label, "no figure", None))
                continue
            met = sum(ratio >= threshold for ratio in known)
            measured = (
                f"met at {met} of {len(ratios)} (ranks, depth); "
                f"ratios {min(known):.2f} .. {max(known):.2f}"
            )
            found.append(
                _target(f"{label}, each rank count and depth", measured, met == len(ratios))
            )
    durable = figures.get("durable")
    if durable is not None:
        fraction = durable["fraction_of_bound"]
        found.append(
            _target(
                "durable path >= 50% of its fsync bound",
                "no figure" if fraction is None else f"{fraction:.0%}",
                None if fraction is None else fraction >= 0.5,
            )
        )
    return found


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


def _span(figure: dict[str, Any], digits: int = 0, scale: float = 1.0) -> str:
    """'median [min .. max]'."""
    if figure.get("median") is None:
        return "failed"
    median, low, high = (figure[key] * scale for key in ("median", "min", "max"))
    return f"{median:,.{digits}f} [{low:,.{digits}f} .. {high:,.{digits}f}]"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(results: dict[str, Any]) -> None:
    v, m = results["versions"], results["machine"]
    figures = results["sections"]
    build = v["dispatchtx_loaded_build"]
    print(
        f"dispatchtx bench: Python {v['python']}, dispatchtx {v['dispatchtx']} "
        f"({build} core loaded), mpi4py {v['mpi4py']}, {v['mpi_library'] or 'MPI library: -'}"
    )
    memory = f", {m['memory_gib']:.0f} GiB" if m["memory_gib"] else ""
    print(f"machine: {m['machine']}, {m['cpu']}, {m['cpus']} CPUs{memory}")
    loads = (results["load_average_at_start"][0], results["load_average_at_end"][0])
    print(
        f"load average (1 min) {loads[0]:.2f} at start, {loads[1]:.2f} at end; each figure: "
        "median [min .. max] of the repetitions after a warm-up"
    )
    core = figures.get("core")
    if core is not None:
        builds = core["builds"]
        print()
        print(
            f"1. core, ns per dispatch with 8 compensations ({core['dispatches_per_repetition']:,} "
            f"dispatches x {core['repetitions']})"
        )
        print(
            f"{'figure':<34}" + "".join(f"{name:>28}" for name in builds) + f"{'pure/compiled':>15}"
        )
        for key, label in (
            ("lifecycle_ns", "lifecycle"),
            ("rollback_ns", "rollback"),
            ("lifecycle_noop_callables_ns", "lifecycle, no-op callables"),
            ("rollback_noop_callables_ns", "rollback, no-op callables"),
        ):
            speedup = core.get("speedup", {}).get(key)
            print(
                f"{label:<34}"
                + "".join(f"{_span(builds[name][key]):>28}" for name in builds)
                + f"{_x(speedup):>15}"
            )
        in_flight_label = f"bytes per in-flight dispatch ({core['in_flight']:,})"
        print(
            f"{in_flight_label:<34}"
            + "".join(f"{builds[name]['bytes_per_in_flight_dispatch']:>28.0f}" for name in builds)
        )
        print(
            f"{'bytes per worker, empty tables':<34}"
            + "".join(f"{builds[name]['bytes_per_worker_empty_tables']:>28.0f}" for name in builds)
        )
    scaling = figures.get("scaling")
    if scaling is not None:
        print()
        print(
            "2. scaling: Coordinator over SimulatedTransport, store + journal on SimulatedFS, "
            f"{scaling['items_per_repetition']:,} items x {scaling['repetitions']}"
        )
        tables_label = f"tables ns ({scaling['tables_build']})"
        print(
            f"{'workers':>10}{'us per committed item':>28}{'x first':>9}{'objects/dispatch':>18}"
            f"{tables_label:>28}{'x first':>9}"
        )
        for row in scaling["rows"]:
            print(
                f"{row['workers']:>10,}{_span(row['us_per_item']):>28}"
                f"{_x(row['ratio_to_first']):>9}{row['objects_shipped_per_dispatch']:>18.2f}"
                f"{_span(row['tables_ns_per_lifecycle']):>28}{_x(row['tables_ratio_to_first']):>9}"
            )
        for note in scaling["notes"]:
            print(f"  note: {note}")
        scans = scaling["periodic_scans"]
        print(
            f"  scans per step/heartbeat at {scans['items']:,} items: HashWorkload.remaining() "
            f"{scans['workload_remaining_us_per_call']:,.0f} us per call (every step); "
            f"store.roll_forward_candidates() "
            f"{scans['store_roll_forward_candidates_us_per_call']:,.0f} us (every heartbeat: "
            f"marked items only), {scans['store_full_look_us_per_call']:,.0f} us with full=True "
            "(once per coordinator start)"
        )
    mpi = figures.get("mpi")
    if mpi is not None:
        print()
        sizes = mpi["message_bytes"]
        print(
            f"3. real MPI, results/s ({mpi['items_per_repetition']:,} items x "
            f"{mpi['repetitions']}); dispatchtx: mpi_job --fs memory; message bytes: dispatchtx "
            f"work {sizes.get('dispatchtx_work', 0):.0f} "
            f"({sizes.get('dispatchtx_work_first', 0):.0f} first) / result "
            f"{sizes.get('dispatchtx_result', 0):.0f}, raw pickled work "
            f"{sizes.get('raw_work') or 0:.0f} / result {sizes.get('raw_result') or 0:.0f}"
        )
        print(
            f"{'ranks':>5}{'depth':>6}{'dispatchtx':>24}{'raw mpi4py loop':>24}"
            f"{'mpi4py.futures':>24}{'dtx/raw':>9}{'dtx/futures':>12}"
        )
        for row in mpi["rows"]:
            print(
                f"{row['ranks']:>5}{row['max_in_flight']:>6}{_span(row['dispatchtx']):>24}"
                f"{_span(row['raw']):>24}{_span(row['futures']):>24}"
                f"{_x(row['dispatchtx_over_raw']):>9}{_x(row['dispatchtx_over_futures']):>12}"
            )
            for system in ("dispatchtx", "raw", "futures"):
                for error in dict.fromkeys(row[system]["errors"]):
                    print(f"  {system} at {row['ranks']} ranks failed: {error[:300]}")
        for note in mpi["notes"]:
            print(f"  note: {note}")
    durable = figures.get("durable")
    if durable is not None:
        print()
        print(
            f"4. durable path: mpi_job --fs real, {durable['ranks']} ranks, max_in_flight 1, "
            f"{durable['items_per_repetition']:,} items x {durable['repetitions']} "
            f"({durable['filesystem']})"
        )
        latency = durable["fsync_latency_s"]
        print(
            "  one fsync, ms (median): "
            + ", ".join(f"{kind} {latency[kind]['median'] * 1e3:.3f}" for kind in KINDS)
        )
        print(
            f"  fsyncs per item {_fsyncs_shown(durable['fsyncs_per_item'])} = "
            f"{durable['fsync_seconds_per_item'] * 1e3:.2f} ms of fsync per item: bound "
            f"{durable['bound'] or 0:,.0f} items/s"
        )
        fraction = durable["fraction_of_bound"]
        print(
            f"  {'mpi_job --fs real':<44}{_span(durable['mpi']):>24} results/s"
            + ("" if fraction is None else f"  {fraction:.0%} of bound")
        )
        print(
            f"  {'in process, same store and settings':<44}{_span(durable['in_process']):>24} "
            f"results/s  {durable['in_process_fraction_of_bound']:.0%} of bound"
        )
        print(
            f"  {'in process, os.fsync a no-op':<44}"
            f"{_span(durable['in_process_without_fsync']):>24} results/s"
        )
        for error in dict.fromkeys(durable["mpi"]["errors"]):
            print(f"  mpi_job --fs real failed: {error[:300]}")
        batching = durable["batching"]
        print(
            f"  batching, max_in_flight {batching['max_in_flight']} (results/s; fsyncs per item):"
        )
        for label, row in batching["rows"].items():
            print(
                f"  {'mpi_job --fs real, ' + label:<44}{_span(row['mpi']):>24} results/s  "
                f"{_fsyncs_shown(row['fsyncs_per_item'])}"
            )
            for error in dict.fromkeys(row["mpi"]["errors"]):
                print(f"    failed: {error[:300]}")
        print(f"  grouped / one at a time: {_x(batching['speedup'])}")
        for note in durable["notes"]:
            print(f"  note: {note}")
    store = figures.get("store")
    if store is not None:
        print()
        print(
            f"5. journal and store on the real disk ({store['filesystem']}), ops/s, "
            f"{store['config']['repetitions']} repetitions"
        )
        print(
            f"{'figure':<44}{'median':>9}{'min':>9}{'max':>9}{'fsyncs/op':>26}"
            f"{'fsync bound':>13}{'of bound':>10}"
        )
        for name, figure in store["figures"].items():
            if figure.get("bound") is not None:
                bound = f"{figure['bound']:>13,.0f}{figure['fraction_of_bound']:>10.0%}"
            elif "no-op" in name:
                bound = f"{'(diagnostic)':>13}"
            else:
                bound = f"{'no fsync':>13}{'-':>10}"
            print(
                f"{name:<44}{figure['median']:>9,.0f}{figure['min']:>9,.0f}"
                f"{figure['max']:>9,.0f}{_fsyncs_shown(figure['fsyncs_per_op']):>26}{bound}"
            )
        print("  fsyncs by kind: n new file, r rewritten file, d changed directory, c clean one")
    print()
    print("targets (issue 12, ratios measured in this run)")
    for target in results["targets"]:
        mark = {True: "met", False: "MISSED", None: "no figure"}[target["met"]]
        print(f"  {mark:<10}{target['target']}: {target['measured']}")
    print()
    print(
        f"wall time {results['wall_seconds']:.0f} s"
        + (
            f" ({results['mpiexec_jobs']} mpiexec jobs, {results['mpiexec_job_seconds']:.0f} s)"
            if "mpiexec_jobs" in results
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dispatchtx bench", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("--json", help="write every figure, sample and version to this file")
    parser.add_argument(
        "--quick", action="store_true", help="fewer items and repetitions: about a minute"
    )
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only this section (repeatable; default: all five)",
    )
    parser.add_argument("--dir", help="make the temp directory under this one (default: $TMPDIR)")
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
