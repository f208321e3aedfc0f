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
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, NamedTuple

from dispatchtx.fs import RealAppendHandle, RealClock, RealFS
from dispatchtx.journal import Event, FsyncPolicy, Journal, JournalModel, json_model
from dispatchtx.store import ClaimOutcome, CommitOutcome, CompleteOutcome, WorkStore

GROUP_SIZE: Final = 16
COMPETING_PROCESSES: Final = 8
TTL: Final = 3600.0  # no claim expires during a run: every claim is of a new item
SMALL_WRITE: Final = b"x" * 64
_KEY: Final = re.compile(r"[0-9a-f]{64}")  # an item's directory name, shortened in traces
BARRIER_TIMEOUT: Final = 120.0
REPORT_TIMEOUT: Final = 600.0


@dataclass(frozen=True)
class Config:
    repetitions: int
    fsync_samples: int  # per kind of fsync, per batch (start and end)
    journal_every: int  # records per repetition
    journal_group: int
    journal_none: int
    claim_items: int  # items in the shared pool, per repetition
    commit_items: int


DEFAULT: Final = Config(
    repetitions=5,
    fsync_samples=500,
    journal_every=400,
    journal_group=4096,
    journal_none=20_000,
    claim_items=300,
    commit_items=250,
)
QUICK: Final = Config(
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

    def pwrite(self, path: str, offset: int, data: bytes) -> None:
        created = not os.path.lexists(path)
        if created:
            self._changed(os.path.dirname(path))
        super().pwrite(path, offset, data)
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
# 1. fsync latency
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
# 2. Journal appends
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
# 3. Claims, 1 and 8 processes
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
# 4. Commits
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
# The run
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


def progress(text: str) -> None:
    """Say what runs now, on a terminal only (stdout stays the table)."""
    if sys.stderr.isatty():
        print(f"  {text} ...".ljust(70), end="\r", file=sys.stderr, flush=True)


def run(config: Config, base: str) -> dict[str, Any]:
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
# Printing
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


def print_table(results: dict[str, Any]) -> None:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="fewer items and repetitions")
    parser.add_argument("--dir", help="make the temp directory under this one (default: $TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory")
    args = parser.parse_args()
    config = QUICK if args.quick else DEFAULT
    base = tempfile.mkdtemp(prefix="store_bench.", dir=args.dir)
    started = time.monotonic()
    try:
        results = run(config, base)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    results["wall_seconds"] = time.monotonic() - started
    print_table(results)
    print(f"\n{results['wall_seconds']:.0f} s" + (f"; kept {base}" if args.keep else ""))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
