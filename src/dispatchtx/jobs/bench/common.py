"""The helpers every section shares: spread of samples, the progress line,
versions and the machine, the mpiexec found (if any)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import dispatchtx
from dispatchtx.launch import find_mpiexec

# ---------------------------------------------------------------------------
# Spread, progress, versions
# ---------------------------------------------------------------------------


def spread(samples: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and every sample of one figure."""
    if not samples:
        raise ValueError("no samples")
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": list(samples),
    }


class Progress:
    """One line on stderr saying what runs now: rewritten in place on a
    terminal, one line per step otherwise (a log keeps them all)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = time.monotonic()
        self._terminal = sys.stderr.isatty()

    def __call__(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"[{time.monotonic() - self.started:5.0f} s] {text}"
        if self._terminal:
            print(f"\r{line[:99]:<99}", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self._terminal:
            print(f"\r{'':<100}\r", end="", file=sys.stderr, flush=True)


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return None


def versions() -> dict[str, Any]:
    """What ran. mpi4py is not imported here (importing it would start MPI in
    this process, which then forks store claimers): the MPI library's own
    version comes from the raw loop's job."""
    try:
        from dispatchtx import _core

        compiled_module: str | None = _core.__file__
    except ImportError:
        compiled_module = None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "dispatchtx": dispatchtx.__version__,
        "dispatchtx_loaded_build": "compiled" if dispatchtx.COMPILED else "pure",
        "dispatchtx_compiled_module": compiled_module,
        "mpi4py": _distribution_version("mpi4py"),
        "mpich_wheel": _distribution_version("mpich"),
        "mpi_library": None,  # filled in from a job's report
        "mpiexec": _mpiexec_or_none(),
    }


def machine() -> dict[str, Any]:
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "hostname": platform.node(),
    }


def _mpiexec_or_none() -> str | None:
    try:
        return find_mpiexec()
    except RuntimeError:
        return None


# ---------------------------------------------------------------------------
# Where a store lives in memory
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


def filesystem_type(path: str) -> str:
    """Just the type ("tmpfs", "ext4") of the mount holding `path`."""
    return filesystem_of(path).split(" on ", 1)[0]


def memory_directory(fallback: str) -> tuple[str, str]:
    """A new directory for a store in memory, as a user would put one: under
    /dev/shm where it is a writable tmpfs, else under `fallback`. Returns the
    directory and its filesystem ("tmpfs on tmpfs"); the caller removes it."""
    parent = "/dev/shm"
    if not (os.path.isdir(parent) and os.access(parent, os.W_OK)):
        parent = fallback
    if not filesystem_of(parent).startswith("tmpfs "):
        parent = fallback
    path = tempfile.mkdtemp(prefix="dispatchtx-bench.", dir=parent)
    return path, filesystem_of(path)
