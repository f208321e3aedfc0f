"""3. Real MPI: mpiexec jobs (each in its own process group) of
`dispatchtx.jobs.mpi_job`, the raw mpi4py loop and `mpi4py.futures`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import dispatchtx
from dispatchtx.jobs.bench.common import filesystem_type, spread
from dispatchtx.jobs.bench.config import BenchConfig
from dispatchtx.jobs.workloads.hash import HashWorkload
from dispatchtx.launch import find_mpiexec, kill_job

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
        # The report of the last `dispatchtx` job that passed (its figures
        # beyond the rate, e.g. the fsyncs it counted).
        self.last_report: dict[str, Any] | None = None

    def run(self, ranks: int, python_args: Sequence[str], tag: str) -> JobOutcome:
        self.jobs += 1
        report = os.path.join(self.directory, f"{self.jobs:03d}-{tag}.json")
        log = os.path.join(self.directory, f"{self.jobs:03d}-{tag}.log")
        outcome = run_mpi_job(ranks, [*python_args, "--report", report], report, self.timeout, log)
        self.job_seconds += outcome.seconds
        return outcome

    def store_dir(self, tag: str, parent: str | None = None) -> str:
        return os.path.join(parent or self.directory, f"store-{self.jobs + 1:03d}-{tag}")

    def dispatchtx(
        self,
        ranks: int,
        depth: int,
        items: int,
        fs: str,
        tag: str,
        *,
        commit_batch: int | None = None,
        store_parent: str | None = None,
        count_fsyncs: bool = False,
    ) -> tuple[float | None, str | None]:
        """results/s of one `dispatchtx.jobs.mpi_job` run, or the error; its
        store under `store_parent` (default: the jobs' directory)."""
        store = self.store_dir(tag, store_parent)
        outcome = self.run(
            ranks,
            [
                "-m",
                "dispatchtx.jobs.mpi_job",
                "--fs",
                fs,
                "--store",
                store,
                "--items",
                str(items),
                "--max-in-flight",
                str(depth),
                "--coordinator-id",
                "bench",
                *([] if commit_batch is None else ["--commit-batch", str(commit_batch)]),
                *(["--count-fsyncs"] if count_fsyncs else []),
            ],
            tag,
        )
        if store_parent is not None:  # in memory: give it back at once
            shutil.rmtree(store, ignore_errors=True)
        if outcome.report is None:
            return None, outcome.error
        if not outcome.report.get("passed"):
            return None, f"the run did not pass its own checks: {outcome.report}"
        self.last_report = outcome.report
        return float(outcome.report["results_per_second"]), None


def _rates(samples: list[float], errors: list[str]) -> dict[str, Any]:
    figure: dict[str, Any] = spread(samples) if samples else {"median": None}
    figure["errors"] = errors
    return figure


# How the raw loop's ranks wait (`raw_mpi --policy`); "backoff" is the
# transport's own policy, the raw baseline dispatchtx is held to.
RAW_POLICIES: Final = ("backoff", "yield", "block")


def _raw_loop(
    config: BenchConfig, runner: JobRunner, ranks: int, policy: str
) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """The raw loop's results/s per depth with one waiting policy (one job)."""
    depths = config.mpi_depths
    outcome = runner.run(
        ranks,
        [
            "-m",
            "dispatchtx.jobs.bench.raw_mpi",
            "--items",
            str(config.mpi_items),
            "--max-in-flight",
            *(str(depth) for depth in depths),
            "--repetitions",
            str(config.mpi_repetitions),
            "--policy",
            policy,
        ],
        f"raw-{policy}-{ranks}",
    )
    if outcome.report is None:
        return {depth: _rates([], [str(outcome.error)]) for depth in depths}, None
    by_depth = outcome.report["by_max_in_flight"]
    rates = {depth: _rates(by_depth[str(depth)]["results_per_second"], []) for depth in depths}
    return rates, outcome.report


def _best(by_policy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fastest policy's figure (by median), named."""
    known = {name: figure for name, figure in by_policy.items() if figure.get("median")}
    if not known:
        return {"median": None, "policy": None, "errors": ["no policy ran"]}
    name = max(known, key=lambda policy: known[policy]["median"])
    return {**known[name], "policy": name}


def mpi_run(
    config: BenchConfig,
    runner: JobRunner,
    progress: Callable[[str], None],
    memory_dir: str | None = None,
) -> dict[str, Any]:
    """dispatchtx (store through RealFS under `memory_dir`, tmpfs; else the
    simulated in-memory FS), the raw loop with each waiting policy, and
    mpi4py.futures, at every rank count and depth."""
    rows: list[dict[str, Any]] = []
    library: str | None = None
    message_bytes: dict[str, Any] = {}
    depths = config.mpi_depths
    items = config.mpi_items
    fs = "memory" if memory_dir is None else "real"
    for ranks in config.mpi_ranks:
        progress(f"3. real MPI, {ranks} ranks: dispatchtx warm-up job")
        runner.dispatchtx(
            ranks, depths[0], max(10, items // 4), fs, f"warm-{ranks}", store_parent=memory_dir
        )
        samples: dict[int, list[float]] = {depth: [] for depth in depths}
        errors: dict[int, list[str]] = {depth: [] for depth in depths}
        for rep in range(config.mpi_repetitions):
            for depth in depths:
                progress(
                    f"3. real MPI, {ranks} ranks: dispatchtx, max_in_flight {depth}, "
                    f"repetition {rep + 1}/{config.mpi_repetitions}"
                )
                rate, error = runner.dispatchtx(
                    ranks, depth, items, fs, f"dtx-{ranks}-{depth}", store_parent=memory_dir
                )
                if rate is not None:
                    samples[depth].append(rate)
                if error is not None:
                    errors[depth].append(error)
        raw: dict[str, dict[int, dict[str, Any]]] = {}
        for policy in RAW_POLICIES:
            progress(f"3. real MPI, {ranks} ranks: raw mpi4py loop ({policy}), depths {depths}")
            raw[policy], report = _raw_loop(config, runner, ranks, policy)
            if report is not None and policy == RAW_POLICIES[0]:
                library = library or report.get("mpi_library")
                message_bytes = {
                    "raw_work": report.get("work_message_bytes"),
                    "raw_result": report.get("result_message_bytes"),
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
            same_policy = raw[RAW_POLICIES[0]][depth]
            best = _best({policy: raw[policy][depth] for policy in RAW_POLICIES})
            row: dict[str, Any] = {
                "ranks": ranks,
                "max_in_flight": depth,
                "dispatchtx": ours,
                "raw": same_policy,
                "raw_by_policy": {policy: raw[policy][depth] for policy in RAW_POLICIES},
                "raw_best": best,
                "futures": futures,
                "dispatchtx_over_raw": _ratio(ours, same_policy),
                "dispatchtx_over_raw_best": _ratio(ours, best),
                "dispatchtx_over_futures": _ratio(ours, futures),
            }
            rows.append(row)
    message_bytes.update(dispatchtx_message_sizes())
    return {
        "items_per_repetition": items,
        "repetitions": config.mpi_repetitions,
        "store": f"RealFS on {filesystem_type(memory_dir)}"
        if memory_dir is not None
        else "SimulatedFS (rank 0's memory)",
        "store_directory": memory_dir,
        "rows": rows,
        "mpi_library": library,
        "message_bytes": message_bytes,
        "notes": [
            "dispatchtx: one mpiexec job per repetition (mpi_job runs once), after a warm-up "
            "job; raw: one job per waiting policy for both depths, futures: one job; each a "
            "warm-up round, then the repetitions",
            "raw with dispatchtx's own polling (backoff: yield for the transport's spin, then "
            "1 us .. 1 ms) is the baseline; raw best is the fastest of backoff, yield and "
            "block per cell (what a user could hand-write for that cell)",
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
