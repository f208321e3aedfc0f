"""5. The journal and the store: its constants, the fsync-counting `CountingFS`,
and the statistics and bounds of its figures."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from dispatchtx.fs import RealAppendHandle, RealFS

# ---------------------------------------------------------------------------
# 5. The journal and the store (also benchmarks/store_bench.py, whose
#    docstring says what each figure is and how fsyncs are counted)
# ---------------------------------------------------------------------------

GROUP_SIZE: Final = 16
COMPETING_PROCESSES: Final = 8
TTL: Final = 3600.0  # no claim expires during a run: every claim is of a new item
SMALL_WRITE: Final = b"x" * 64
_KEY: Final = re.compile(r"[0-9a-f]{64}")  # an item's directory name, shortened in traces
BARRIER_TIMEOUT: Final = 120.0
REPORT_TIMEOUT: Final = 600.0

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

    def pwrite(
        self, path: str, offset: int, data: bytes, *, sync: bool = True, create: bool = True
    ) -> None:
        created = not os.path.lexists(path)
        if created and create:
            self._changed(os.path.dirname(path))
        super().pwrite(path, offset, data, sync=sync, create=create)
        if sync:
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
