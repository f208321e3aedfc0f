"""2. Scaling: the coordinator over the simulated transport, its store and
journal on the in-memory `SimulatedFS`, at 64 to 1,048,576 workers."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, Final

from dispatchtx import Transaction
from dispatchtx.coordinator import Coordinator, CoordinatorConfig
from dispatchtx.coordinator.queue import WorkQueue
from dispatchtx.coordinator.stats import Stat
from dispatchtx.coordinator.workload import DispatchTag, Workload
from dispatchtx.fs import FS, RealFS, SimulatedFS
from dispatchtx.jobs.bench.common import filesystem_type, spread
from dispatchtx.jobs.bench.config import BenchConfig
from dispatchtx.jobs.bench.core import load_builds, median_of, time_lifecycles_across
from dispatchtx.jobs.bench.fs_timing import CallTimer, TimedFS
from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
from dispatchtx.store import WorkStore, object_id_of
from dispatchtx.transport import SimulatedTransport, TransportClock

# ---------------------------------------------------------------------------
# 2. Scaling: the coordinator over the simulated transport
# ---------------------------------------------------------------------------

SCALING_TTL: Final = 2.0  # as mpi_job's default


class RefillableWorkload(Workload):
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
        self._queue = WorkQueue()
        self.wrong_results = 0

    def add(self, work_ids: Iterable[str]) -> None:
        work_ids = list(work_ids)
        self._queue.add(work_ids)
        for work_id in work_ids:
            if self._per_item:
                content = f"object of {work_id}".encode() * 4
                object_id = object_id_of(content)
                self._by_id[object_id] = content
            else:
                object_id = self.object_ids[len(self._object_of) % len(self.object_ids)]
            self._object_of[work_id] = object_id

    def take(self) -> str | None:
        return self._queue.take()

    def give_back(self, work_id: str) -> None:
        self._queue.give_back(work_id)

    def done(self, work_id: str) -> None:
        self._queue.done(work_id)

    def drop(self, work_id: str, reason: str) -> None:
        self._queue.drop(work_id)

    def remaining(self) -> int:
        return self._queue.remaining()

    def reserve(
        self, txn: Transaction[DispatchTag], worker: int, work_id: str
    ) -> tuple[object, list[str]]:
        object_id = self._object_of[work_id]
        return [work_id, object_id], [object_id]

    def object_content(self, object_id: str) -> bytes:
        return self._by_id[object_id]

    def triage(self, work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        content = self._by_id[self._object_of[work_id]]
        if result != hashlib.sha256(work_id.encode() + content).digest():
            self.wrong_results += 1


def coordinator_scaling(
    workers: int, items: int, reps: int, store_dir: str | None = None, *, timed: bool = False
) -> dict[str, Any]:
    """Wall µs per committed item of one coordinator with `workers` simulated
    workers, its store and journal on `SimulatedFS` (or, with `store_dir`,
    through `RealFS` in that directory: a user's store on tmpfs): `items`
    per run, a warm-up run then `reps` timed runs of the same coordinator.
    With `timed`, every FS call is timed too (`TimedFS`), and "fs" gives the
    calls per item and their µs per item: the part of the cost that is the
    disk calls themselves (the wrapper's own cost is in the wall figure)."""
    setup_started = time.perf_counter()
    transport = SimulatedTransport(workers, hash_task)
    clock = TransportClock(transport, wall_offset=1.7e9)
    store_fs: FS = SimulatedFS() if store_dir is None else RealFS()
    journal_fs: FS = SimulatedFS() if store_dir is None else RealFS()
    timing: TimedFS | None = None
    in_transport: CallTimer | None = None
    if timed:
        timing = TimedFS(store_fs)
        store_fs = journal_fs = timing
        # The simulated workers run their tasks inside poll(): that time is
        # theirs (and the test double's), not the coordinator's.
        in_transport = CallTimer()
        in_transport.wrap_methods(transport, ("poll", "send"), "")
    root = "/store" if store_dir is None else os.path.join(store_dir, f"store-{workers}")
    journal_dir = "/journal" if store_dir is None else os.path.join(store_dir, f"journal-{workers}")
    if store_dir is not None:
        os.makedirs(journal_dir)
    store = WorkStore(store_fs, root, clock, ttl=SCALING_TTL)
    # Each item ships its own object, so every size does the same work per
    # dispatch: with shared objects, 64 workers would hit their caches and
    # 65,536 would miss (a different workload, not a scan).
    workload = RefillableWorkload(n_objects=None)
    config = CoordinatorConfig("bench", journal_path=f"{journal_dir}/bench.journal")
    coordinator = Coordinator(config, transport, store, workload, journal_fs=journal_fs)
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
        warmed = _scaling_repetitions(
            coordinator,
            workload,
            counts,
            workers,
            items,
            reps,
            samples,
            shipped,
            timing,
            in_transport,
        )
        transport_seconds = 0.0 if in_transport is None else in_transport.total_seconds()
    finally:
        gc.unfreeze()
    if workload.wrong_results:
        raise RuntimeError(f"{workers} workers: {workload.wrong_results} wrong results committed")
    leaks = coordinator.leaks()
    coordinator.shutdown()
    fs_figures: dict[str, Any] | None = None
    if timing is not None and warmed is not None:
        committed = items * reps
        calls, seconds, warm_seconds, warm_transport = warmed
        fs_figures = {
            "calls_per_item": {
                kind: (timing.calls[kind] - calls.get(kind, 0)) / committed
                for kind in sorted(timing.calls)
                if timing.calls[kind] > calls.get(kind, 0)
            },
            "us_per_item": (timing.total_seconds() - seconds) / committed * 1e6,
            "transport_us_per_item": (transport_seconds - warm_transport) / committed * 1e6,
            "us_per_item_by_kind": {
                kind: (timing.seconds[kind] - warm_seconds.get(kind, 0.0)) / committed * 1e6
                for kind in sorted(timing.seconds)
            },
        }
    return {
        "fs": fs_figures,
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
    counts: Counter[Stat],
    workers: int,
    items: int,
    reps: int,
    samples: list[float],
    shipped: list[float],
    timing: TimedFS | None = None,
    in_transport: CallTimer | None = None,
) -> tuple[dict[str, int], float, dict[str, float], float] | None:
    """The runs; with `timing`, its calls and seconds once warmed up (and
    the seconds spent in the transport)."""
    warmed: tuple[dict[str, int], float, dict[str, float], float] | None = None
    for rep in range(1 + reps):
        if rep == 1 and timing is not None:
            warmed = (
                dict(timing.calls),
                timing.total_seconds(),
                dict(timing.seconds),
                0.0 if in_transport is None else in_transport.total_seconds(),
            )
        workload.add(f"r{rep}-item-{i}" for i in range(items))
        committed, dispatches, objects = (
            counts[Stat.COMMITTED],
            counts[Stat.DISPATCHES],
            counts[Stat.OBJECTS_SHIPPED],
        )
        started = time.perf_counter()
        coordinator.run()
        elapsed = time.perf_counter() - started
        committed = counts[Stat.COMMITTED] - committed
        if committed != items:
            raise RuntimeError(f"{workers} workers: {committed} of {items} items committed")
        if rep:  # the first run is the warm-up
            samples.append(elapsed / committed * 1e6)
            shipped.append(
                (counts[Stat.OBJECTS_SHIPPED] - objects) / (counts[Stat.DISPATCHES] - dispatches)
            )
    return warmed


def _empty(directory: str) -> None:
    """In memory: give it back at once."""
    for name in os.listdir(directory):
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


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


def scaling_run(
    config: BenchConfig, progress: Callable[[str], None], memory_dir: str | None = None
) -> dict[str, Any]:
    """The coordinator and the tables alone at every size (store on
    SimulatedFS), and with `memory_dir` the first size once more with the
    store and journal through RealFS there (tmpfs: what a user runs)."""
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
    on_memory: dict[str, Any] | None = None
    if memory_dir is not None:
        first = sizes[0]
        progress(f"2. scaling: coordinator, {first:,} workers, store through RealFS on tmpfs")
        on_memory = coordinator_scaling(
            first, config.scaling_items, config.scaling_repetitions, store_dir=memory_dir
        )
        on_memory["filesystem"] = filesystem_type(memory_dir)
        _empty(memory_dir)
        progress("2. scaling: the same, every FS call timed (TimedFS)")
        on_memory["fs"] = coordinator_scaling(
            first, config.scaling_items, 1, store_dir=memory_dir, timed=True
        )["fs"]
        _empty(memory_dir)
    progress("2. scaling: scans that grow with the items")
    scans = periodic_scans(config.scaling_items * (1 + config.scaling_repetitions))
    return {
        "items_per_repetition": config.scaling_items,
        "repetitions": config.scaling_repetitions,
        "tables_build": "compiled" if compiled is not None else "pure",
        "rows": rows,
        "real_fs_row": on_memory,
        "notes": notes,
        "periodic_scans": scans,
    }
