"""Benchmark the dispatch core, both builds in one run.

Prints, for the pure and the compiled build: ns per full lifecycle (prepare,
8 compensations added, sent, fence_passed, finished) and per rollback
(prepare, 8 added, sent, fenced_out), each with compensations that declare
no callables (the core's own cost) and with no-op Python callables; and bytes
per in-flight dispatch with 8 compensations at 65,536 in flight
(tracemalloc). Figures are medians of several repetitions after a warm-up;
compare the ratios measured in one run, not absolute times across runs.

    python benchmarks/core_bench.py [--json FILE] [--quick]

The measurement lives in `dispatchtx.jobs.bench` (it ships with the package;
`dispatchtx bench` runs it beside the other sections): this script prints
these figures alone.
"""

from __future__ import annotations

import sys

from dispatchtx.jobs.bench import core_main

if __name__ == "__main__":
    sys.exit(core_main(description=(__doc__ or "").splitlines()[0]))
