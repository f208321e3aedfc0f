"""Start `mpiexec` jobs from Python: find the launcher, run each job in its
own process group, and end a job by killing its whole group (under MPICH a
rank that dies can take its job down; a job left behind must never hang a
caller)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

__all__ = ["MPIExecNotFound", "find_mpiexec", "kill_job", "run_job", "start_job"]


class MPIExecNotFound(RuntimeError):
    """No `mpiexec` next to this Python nor on PATH."""


def find_mpiexec() -> str:
    """The `mpiexec` of this environment (the `mpich` wheel installs it next
    to the interpreter), else the first one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise MPIExecNotFound(
            "mpiexec not found: install an MPI (e.g. `pip install 'dispatchtx[mpich]'`)"
        )
    return found


def start_job(
    n_ranks: int, module: str, args: Sequence[str] = (), output: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """Start `mpiexec -n N python -m module args...` in a new process group;
    with `output`, the launcher's and the ranks' stdout and stderr go there."""
    command = [find_mpiexec(), "-n", str(n_ranks), sys.executable, "-m", module, *args]
    errors = None if output is None else subprocess.STDOUT
    return subprocess.Popen(command, start_new_session=True, stdout=output, stderr=errors)


def kill_job(job: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal every process of the job's group (the launcher and its ranks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, sig)


def run_job(n_ranks: int, module: str, args: Sequence[str] = (), timeout: float = 300.0) -> int:
    """Run a job to its end; past `timeout`, kill its group and return 124."""
    job = start_job(n_ranks, module, args)
    try:
        return job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"job {module} ran past {timeout:.0f} s: killed", file=sys.stderr)
        kill_job(job)
        job.wait()
        return 124
    except BaseException:
        kill_job(job)
        job.wait()
        raise
