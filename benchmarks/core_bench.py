"""Benchmark the dispatch core, both builds in one run.

Prints, for the pure and the compiled build: ns per full lifecycle (prepare,
8 compensations added, sent, fence_passed, finished) and per rollback
(prepare, 8 added, sent, fenced_out), each with compensations that declare
no callables (the core's own cost) and with no-op Python callables; and bytes
per in-flight dispatch with 8 compensations at 65,536 in flight
(tracemalloc). Figures are medians of several repetitions after a warm-up;
compare the ratios measured in one run, not absolute times across runs.

    python benchmarks/core_bench.py [--json FILE] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import tracemalloc
from types import ModuleType
from typing import Any

N_COMPENSATIONS = 8
IN_FLIGHT = 65_536


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


def bytes_in_flight(module: ModuleType) -> tuple[float, float]:
    """(bytes per in-flight dispatch, bytes per worker of the empty tables)."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tables = module.DispatchTables(IN_FLIGHT)
    empty = tracemalloc.get_traced_memory()[0]
    comps = _compensations(tables, callables=True)
    arg = object()
    for worker in range(IN_FLIGHT):
        txn = tables.prepare(worker)
        for comp in comps:
            txn.add(comp, arg)
        tables.sent(txn.id, 1.0)
    full = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(tables) == IN_FLIGHT
    return (full - empty) / IN_FLIGHT, (empty - base) / IN_FLIGHT


def median_of(reps: int, fn: Any, *args: Any) -> tuple[float, float, float]:
    fn(*args)  # warm-up
    samples = [fn(*args) for _ in range(reps)]
    return statistics.median(samples), min(samples), max(samples)


def load_builds() -> dict[str, ModuleType]:
    from dispatchtx import _core_py

    builds = {"pure": _core_py}
    try:
        from dispatchtx import _core
    except ImportError:
        print("warning: the compiled core is not built; measuring the pure build only")
    else:
        builds["compiled"] = _core
    return builds


def run(quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 200_000
    reps = 3 if quick else 7
    builds = load_builds()
    results: dict[str, Any] = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor": platform.processor(),
        "dispatches_per_repetition": n,
        "repetitions": reps,
        "builds": {},
    }
    for name, module in builds.items():
        row: dict[str, Any] = {}
        for label, rollback, callables in (
            ("lifecycle_ns", False, False),
            ("rollback_ns", True, False),
            ("lifecycle_noop_callables_ns", False, True),
            ("rollback_noop_callables_ns", True, True),
        ):
            print(f"  {name}: {label} ...", end="\r", flush=True)
            median, low, high = median_of(reps, time_lifecycles, module, n, rollback, callables)
            row[label] = {"median": median, "min": low, "max": high}
        per_dispatch, per_worker = bytes_in_flight(module)
        row["bytes_per_in_flight_dispatch"] = per_dispatch
        row["bytes_per_worker_empty_tables"] = per_worker
        results["builds"][name] = row
    if "compiled" in results["builds"]:
        pure, fast = results["builds"]["pure"], results["builds"]["compiled"]
        results["speedup"] = {
            key: pure[key]["median"] / fast[key]["median"] for key in pure if key.endswith("_ns")
        }
    return results


def print_table(results: dict[str, Any]) -> None:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="fewer dispatches and repetitions")
    args = parser.parse_args()
    results = run(args.quick)
    print_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
