"""Benchmark the shared work store and the local journal on this machine's disk.

Prints, from one run on the real disk (a temp directory under /tmp, or under
--dir), each figure beside the bound that its fsyncs set:

- one fsync's latency, for each kind of fsync the store and the journal
  do: write a small new file + fsync it (`write_temp`); append to a file +
  fsync it (the journal); fsync a directory after linking a name into it
  (every store publication); fsync a directory that did not change.
  Measured at the start and at the end of the run; the bounds use the
  medians of both batches together.
- journal appends/s under each fsync policy (`every`; `group`, in groups of
  16 records; `none`, which has no fsync bound);
- claims/s of new items with 1 process and with 8 competing processes
  (forked, started together by a barrier, each its own `WorkStore` with its
  own coordinator id), all claiming from one shared pool of distinct items,
  in the same order or each in its own shuffled order;
- commits/s: `begin_commit` + `complete` of claimed items, 1 process.

Fsyncs are counted, not assumed: every timed run goes through `CountingFS`,
a `RealFS` that counts its fsyncs by kind (`write_temp`, `pwrite`, an append
handle's `fsync`, `fsync_dir`, also those inside `mkdir`); a trace of the
fsyncs of single operations is printed too. An operation's fsync bound is
1 / (sum over kinds of its fsyncs x that kind's median latency), for the
fsyncs that one operation needs alone (1 process), as if they ran one after
another with nothing in between. With 8 processes the fsync column shows what they
spent per successful claim, losers' work included; concurrent fsyncs may
share one filesystem journal commit, so 8 processes can pass that serial
bound. "Where time goes" reruns the 1-process figures with `os.fsync` made
a no-op, to split the time into fsync and everything else.

Figures are medians of several repetitions after a warm-up, min and max
kept; compare the ratios measured in one run, not absolute rates across
machines or runs.

    python benchmarks/store_bench.py [--json FILE] [--quick] [--dir DIR] [--keep]

The measurement lives in `dispatchtx.jobs.bench` (it ships with the package;
`dispatchtx bench` runs it beside the other sections): this script prints
these figures alone.
"""

from __future__ import annotations

import sys

from dispatchtx.jobs.bench import store_main

if __name__ == "__main__":
    sys.exit(store_main(description=(__doc__ or "").splitlines()[0]))
