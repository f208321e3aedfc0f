"""5. The journal and the store: its measurements (fsync latency, journal
appends, claims by 1 and 8 processes, commits) and `store_run`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import multiprocessing
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Final, NamedTuple

from dispatchtx.fs import RealClock
from dispatchtx.jobs.bench.common import filesystem_of
from dispatchtx.jobs.bench.config import StoreConfig
from dispatchtx.jobs.bench.store_counting import (
    BARRIER_TIMEOUT,
    COMPETING_PROCESSES,
    GROUP_SIZE,
    KINDS,
    REPORT_TIMEOUT,
    SMALL_WRITE,
    TTL,
    CountingFS,
    fsync_bound,
    fsync_disabled,
    fsync_seconds,
    per_op,
    repeated,
    summary,
)
from dispatchtx.journal import Event, FsyncPolicy, Journal, JournalModel, json_model
from dispatchtx.store import ClaimOutcome, CommitOutcome, CompleteOutcome, WorkStore

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
