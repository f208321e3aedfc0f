"""The table `dispatchtx bench` prints: every section's figures and the targets."""

from __future__ import annotations

from typing import Any

from dispatchtx.jobs.bench.store_counting import KINDS
from dispatchtx.jobs.bench.store_table import _fsyncs_shown

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
        real_fs = scaling.get("real_fs_row")
        if real_fs is not None:
            print(
                f"{real_fs['workers']:>10,}{_span(real_fs['us_per_item']):>28}"
                f"   <- the same, store and journal through RealFS on "
                f"{real_fs.get('filesystem', 'tmpfs')}"
            )
            fs = real_fs.get("fs")
            if fs is not None:
                calls = fs["calls_per_item"]
                spent = fs.get("us_per_item_by_kind", {})
                shown = ", ".join(
                    f"{n:.2g} {kind} {spent.get(kind, 0.0):.0f} us"
                    for kind, n in calls.items()
                    if n >= 0.05
                )
                print(
                    f"  its FS calls alone (a run with each call timed): {sum(calls.values()):.1f} "
                    f"per item ({shown}) = {fs['us_per_item']:.0f} us per item"
                )
                transport_us = fs.get("transport_us_per_item")
                if transport_us is not None:
                    print(
                        f"  in that run, inside the simulated transport (its workers run their "
                        f"tasks in poll): {transport_us:.0f} us per item"
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
            f"{mpi['repetitions']}); dispatchtx: mpi_job, store {mpi.get('store', '-')}; "
            "message bytes: dispatchtx "
            f"work {sizes.get('dispatchtx_work', 0):.0f} "
            f"({sizes.get('dispatchtx_work_first', 0):.0f} first) / result "
            f"{sizes.get('dispatchtx_result', 0):.0f}, raw pickled work "
            f"{sizes.get('raw_work') or 0:.0f} / result {sizes.get('raw_result') or 0:.0f}"
        )
        print(
            f"{'ranks':>5}{'depth':>6}{'dispatchtx':>26}{'raw, same polling':>31}"
            f"{'raw, best policy':>40}{'mpi4py.futures':>26}{'dtx/raw':>9}{'dtx/best':>9}"
            f"{'dtx/futures':>12}"
        )
        for row in mpi["rows"]:
            best = row.get("raw_best", {"median": None})
            best_text = f"{_span(best)} {best.get('policy') or ''}"
            print(
                f"{row['ranks']:>5}{row['max_in_flight']:>6}{_span(row['dispatchtx']):>26}"
                f"{_span(row['raw']):>31}{best_text:>40}{_span(row['futures']):>26}"
                f"{_x(row['dispatchtx_over_raw']):>9}{_x(row.get('dispatchtx_over_raw_best')):>9}"
                f"{_x(row['dispatchtx_over_futures']):>12}"
            )
            systems = {"dispatchtx": row["dispatchtx"], "futures": row["futures"]}
            for policy, figure in row.get("raw_by_policy", {"backoff": row["raw"]}).items():
                systems[f"raw ({policy})"] = figure
            for system, figure in systems.items():
                for error in dict.fromkeys(figure.get("errors", [])):
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
            in_job = row.get("fsyncs_per_item_in_mpi_job")
            print(
                f"  {'mpi_job --fs real, ' + label:<44}{_span(row['mpi']):>24} results/s  "
                f"{_fsyncs_shown(row['fsyncs_per_item'])} in process"
                + ("" if in_job is None else f", {_fsyncs_shown(in_job)} in the job")
            )
            for error in dict.fromkeys(row["mpi"]["errors"]):
                print(f"    failed: {error[:300]}")
        print(f"  grouped (the default) / one at a time: {_x(batching['speedup'])}")
        tmpfs = batching.get("tmpfs")
        if tmpfs is not None:
            print(
                f"  {'mpi_job, store on tmpfs (same settings)':<44}{_span(tmpfs):>24} results/s"
                f"  default durable / tmpfs: {_x(batching.get('default_over_tmpfs'))}"
            )
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
    print("targets (issues 12 and 17, ratios measured in this run)")
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
