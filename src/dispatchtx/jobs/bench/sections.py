"""The whole run: `SECTIONS` and `run`, which measures the chosen sections."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Final

from dispatchtx.jobs.bench.common import machine, memory_directory, versions
from dispatchtx.jobs.bench.config import BenchConfig
from dispatchtx.jobs.bench.core import core_run
from dispatchtx.jobs.bench.durable import durable_run
from dispatchtx.jobs.bench.mpi import JobRunner, mpi_run
from dispatchtx.jobs.bench.scaling import scaling_run
from dispatchtx.jobs.bench.store_figures import store_run
from dispatchtx.jobs.bench.targets import targets

SECTIONS: Final = ("core", "scaling", "mpi", "durable", "store")


def _prefixed(progress: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    """`progress` with `prefix: ` before each text; an empty text (a stage's end) is dropped."""

    def say(text: str) -> None:
        if text.strip(" ."):
            progress(f"{prefix}: {text.strip(' .')}")

    return say


def run(
    config: BenchConfig,
    progress: Callable[[str], None],
    sections: Sequence[str] = SECTIONS,
    directory: str | None = None,
) -> dict[str, Any]:
    """Every section of `sections`, in order, in this process and its jobs."""
    started = time.monotonic()
    results: dict[str, Any] = {
        "versions": versions(),
        "machine": machine(),
        "config": asdict(config),
        "load_average_at_start": os.getloadavg(),
        "sections": {},
    }
    figures: dict[str, Any] = results["sections"]
    base = tempfile.mkdtemp(prefix="dispatchtx-bench.", dir=directory)
    memory_dir: str | None = None
    try:
        # The stores "in memory" live where a user would put one: on tmpfs.
        memory_dir, memory_fs = memory_directory(base)
        results["memory_store"] = {"directory": memory_dir, "filesystem": memory_fs}
        if "core" in sections:
            progress("1. core")
            figures["core"] = core_run(
                config.core_dispatches,
                config.core_repetitions,
                config.core_in_flight,
                progress=_prefixed(progress, "1. core"),
                warn=progress,
            )
        if "scaling" in sections:
            figures["scaling"] = scaling_run(config, progress, memory_dir)
        runner = JobRunner(base, config.job_timeout)
        if "mpi" in sections:
            figures["mpi"] = mpi_run(config, runner, progress, memory_dir)
            results["versions"]["mpi_library"] = figures["mpi"]["mpi_library"]
        if "durable" in sections:
            durable_base = os.path.join(base, "durable")
            os.mkdir(durable_base)
            figures["durable"] = durable_run(config, runner, durable_base, progress, memory_dir)
        if "store" in sections:
            store_base = os.path.join(base, "store")
            os.mkdir(store_base)
            figures["store"] = store_run(config.store, store_base, _prefixed(progress, "5. store"))
        results["mpiexec_jobs"] = runner.jobs
        results["mpiexec_job_seconds"] = runner.job_seconds
    finally:
        if memory_dir is not None:
            shutil.rmtree(memory_dir, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    results["load_average_at_end"] = os.getloadavg()
    results["targets"] = targets(figures)
    results["wall_seconds"] = time.monotonic() - started
    return results
