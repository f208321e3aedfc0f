"""5. The journal and the store: its table and `store_main`
(benchmarks/store_bench.py)."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from typing import Any, Final

from dispatchtx.jobs.bench.config import STORE_DEFAULT, STORE_QUICK
from dispatchtx.jobs.bench.store_counting import COMPETING_PROCESSES, KINDS
from dispatchtx.jobs.bench.store_figures import store_run

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
