"""1. The core, pure and compiled (also benchmarks/core_bench.py): ns per
lifecycle and per rollback, bytes per in-flight dispatch."""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

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
