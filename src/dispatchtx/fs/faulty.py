"""Faults over any FS: `FaultyFS` wraps one (the real disk in the campaign)
with faults at chosen calls and an injectable kill (`sigkill_self` for a
real one); `RandomDiskFaults` draws a disk fault per call at a rate, for
the simulator and the MPI job.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
from collections import Counter
from collections.abc import Callable, Mapping

from dispatchtx.fs.faults import (
    Fault,
    FaultHook,
    FaultKind,
    Op,
    SimulatedCrash,
    _error,
    _FaultPoints,
    _is,
)
from dispatchtx.fs.interface import FS, AppendHandle

__all__ = [
    "DISK_FAULTS",
    "FaultyAppendHandle",
    "FaultyFS",
    "JOURNAL_DISK_FAULTS",
    "KillAction",
    "RandomDiskFaults",
    "sigkill_self",
]


# ---------------------------------------------------------------------------
# Faults over any FS (the real-disk campaign)
# ---------------------------------------------------------------------------

#: What a kill fault does before `FaultyFS` raises `SimulatedCrash`.
KillAction = Callable[[Op, str], None]


def sigkill_self(op: Op, path: str) -> None:
    """The real kill: SIGKILL this process, so nothing after the call runs
    (no `finally`, no flush), as when an operator or the OOM killer does it."""
    os.kill(os.getpid(), signal.SIGKILL)


class FaultyAppendHandle:
    """An append handle of a `FaultyFS`: the inner handle, with faults."""

    __slots__ = ("_closed", "_fs", "_generation", "_inner")

    def __init__(self, fs: FaultyFS, inner: AppendHandle, generation: int) -> None:
        self._fs = fs
        self._inner = inner
        self._generation = generation
        self._closed = False

    @property
    def path(self) -> str:
        return self._inner.path

    def _begin(self, op: Op) -> Fault | None:
        return self._fs._begin_handle(op, self._inner.path, self._generation, self._closed)

    def append(self, data: bytes) -> int:
        fault = self._begin(Op.APPEND)
        with self._fs._after(fault, Op.APPEND, self.path):
            if _is(fault, FaultKind.ENOSPC):
                self._inner.append(data[: fault.kept(len(data))])
                raise _error(errno.ENOSPC, self.path)
            if _is(fault, FaultKind.SHORT_WRITE):
                return self._inner.append(data[: fault.kept(len(data))])
            return self._inner.append(data)

    def fsync(self) -> None:
        fault = self._begin(Op.FSYNC)
        with self._fs._after(fault, Op.FSYNC, self.path):
            self._inner.fsync()

    def truncate(self, size: int) -> None:
        fault = self._begin(Op.TRUNCATE)
        with self._fs._after(fault, Op.TRUNCATE, self.path):
            self._inner.truncate(size)

    def size(self) -> int:
        fault = self._begin(Op.SIZE)
        with self._fs._after(fault, Op.SIZE, self.path):
            return self._inner.size()

    def close(self) -> None:
        """Close the handle; closing twice, or after `revive`, is a no-op."""
        if self._fs.killed:
            raise SimulatedCrash(Op.CLOSE, self.path, "dead")
        if self._closed:
            return
        if self._generation != self._fs._generation:
            self._release()
            return
        try:
            fault = self._begin(Op.CLOSE)
        except BaseException:
            self._release()  # close gives the descriptor back even when it fails
            raise
        with self._fs._after(fault, Op.CLOSE, self.path):
            self._release()

    def _release(self) -> None:
        self._closed = True
        self._fs._open_handles.discard(self)
        self._inner.close()

    def __repr__(self) -> str:
        return f"FaultyAppendHandle({self._inner!r}, closed={self._closed})"


class FaultyFS(_FaultPoints):
    """Any `FS` with faults injected at chosen calls, described with the
    same `Fault`s as `SimulatedFS`. EIO, ESTALE and ENOSPC outside a write
    raise without calling the inner FS; ENOSPC on a write and `SHORT_WRITE`
    write a prefix through it; `LOST_LINK_REPLY` links, then raises
    `FileExistsError`; `STALE_ABSENT` answers without asking. A real disk
    cannot drop dirty pages, so an fsync EIO here only raises.

    A kill runs `kill` (SIGKILL of this process by default; tests pass one
    that records or raises) and then raises `SimulatedCrash`; calls are
    refused until `revive()`.
    """

    def __init__(
        self, inner: FS, fault: FaultHook | None = None, *, kill: KillAction = sigkill_self
    ) -> None:
        super().__init__(fault)
        self.inner = inner
        self.kill: KillAction = kill
        self._open_handles: set[FaultyAppendHandle] = set()

    def _on_kill(self, op: Op, path: str) -> None:
        self.kill(op, path)

    def revive(self) -> None:
        """The killed process was restarted: accept calls again. Handles
        opened before are closed (as the OS does for a dead process)."""
        self._killed = False
        self._generation += 1
        for handle in list(self._open_handles):
            with contextlib.suppress(OSError):
                handle._release()

    def read(self, path: str) -> bytes:
        fault = self._begin(Op.READ, path)
        with self._after(fault, Op.READ, path):
            if _is(fault, FaultKind.STALE_ABSENT):
                raise _error(errno.ENOENT, path)
            return self.inner.read(path)

    def write_temp(self, directory: str, data: bytes) -> str:
        fault = self._begin(Op.WRITE_TEMP, directory)
        with self._after(fault, Op.WRITE_TEMP, directory):
            if _is(fault, FaultKind.ENOSPC):
                orphan = self.inner.write_temp(directory, data[: fault.kept(len(data))])
                raise _error(errno.ENOSPC, orphan)
            return self.inner.write_temp(directory, data)

    def link(self, src: str, dst: str) -> None:
        fault = self._begin(Op.LINK, dst)
        with self._after(fault, Op.LINK, dst):
            self.inner.link(src, dst)
            if _is(fault, FaultKind.LOST_LINK_REPLY):
                raise _error(errno.EEXIST, src, dst)

    def rename(self, src: str, dst: str) -> None:
        fault = self._begin(Op.RENAME, dst)
        with self._after(fault, Op.RENAME, dst):
            self.inner.rename(src, dst)

    def unlink(self, path: str) -> None:
        fault = self._begin(Op.UNLINK, path)
        with self._after(fault, Op.UNLINK, path):
            self.inner.unlink(path)

    def mkdir(self, path: str) -> None:
        fault = self._begin(Op.MKDIR, path)
        with self._after(fault, Op.MKDIR, path):
            self.inner.mkdir(path)

    def fsync_dir(self, path: str) -> None:
        fault = self._begin(Op.FSYNC_DIR, path)
        with self._after(fault, Op.FSYNC_DIR, path):
            self.inner.fsync_dir(path)

    def listdir(self, path: str) -> list[str]:
        fault = self._begin(Op.LISTDIR, path)
        with self._after(fault, Op.LISTDIR, path):
            return self.inner.listdir(path)

    def exists(self, path: str) -> bool:
        fault = self._begin(Op.EXISTS, path)
        with self._after(fault, Op.EXISTS, path):
            if _is(fault, FaultKind.STALE_ABSENT):
                return False
            return self.inner.exists(path)

    def open_append(self, path: str) -> FaultyAppendHandle:
        fault = self._begin(Op.OPEN_APPEND, path)
        with self._after(fault, Op.OPEN_APPEND, path):
            handle = FaultyAppendHandle(self, self.inner.open_append(path), self._generation)
            self._open_handles.add(handle)
            return handle

    def pwrite(
        self, path: str, offset: int, data: bytes, *, sync: bool = True, create: bool = True
    ) -> None:
        fault = self._begin(Op.PWRITE, path)
        with self._after(fault, Op.PWRITE, path):
            if _is(fault, FaultKind.ENOSPC):
                kept = data[: fault.kept(len(data))]
                self.inner.pwrite(path, offset, kept, sync=sync, create=create)
                raise _error(errno.ENOSPC, path)
            self.inner.pwrite(path, offset, data, sync=sync, create=create)

    def __repr__(self) -> str:
        return f"FaultyFS({self.inner!r}, calls={self.total_calls}, killed={self._killed})"


# Disk faults per FS call, and the ones each call can suffer.
DISK_FAULTS: dict[Op, tuple[FaultKind, ...]] = {
    Op.READ: (FaultKind.EIO, FaultKind.STALE_ABSENT, FaultKind.ESTALE),
    Op.EXISTS: (FaultKind.STALE_ABSENT,),
    Op.WRITE_TEMP: (FaultKind.EIO, FaultKind.ENOSPC),
    Op.LINK: (FaultKind.EIO, FaultKind.LOST_LINK_REPLY, FaultKind.ESTALE),
    Op.FSYNC_DIR: (FaultKind.EIO,),
    Op.PWRITE: (FaultKind.EIO, FaultKind.ENOSPC),
}
# What a coordinator's own disk adds for its journal: appends that fail or
# land torn, fsyncs and cut-backs that fail, a compaction's rename or reopen
# that fails.
JOURNAL_DISK_FAULTS: dict[Op, tuple[FaultKind, ...]] = {
    **DISK_FAULTS,
    Op.APPEND: (FaultKind.EIO, FaultKind.ENOSPC, FaultKind.SHORT_WRITE),
    Op.FSYNC: (FaultKind.EIO,),
    Op.TRUNCATE: (FaultKind.EIO,),
    Op.RENAME: (FaultKind.EIO,),
    Op.OPEN_APPEND: (FaultKind.EIO,),
}


class RandomDiskFaults:
    """A fault hook for SimulatedFS: each call fails with probability `rate`,
    with one of the kinds `faults` lists for its op (by default the shared
    store's, `DISK_FAULTS`).

    A stale "absent" sticks, as a client's cached negative look-up does
    until it expires: after one, the next `absent_repeats` reads or exists
    checks of that path say "absent" too (so a read-back right after a
    failed look-up meets it again). `cache_miss` (a `SimulatedFS.on_miss`)
    caches a real miss the same way, with probability `miss_cached`: a file
    a peer creates just after stays invisible for those look-ups, while
    `link` onto it fails with EEXIST."""

    def __init__(
        self,
        rng: random.Random,
        rate: float,
        faults: Mapping[Op, tuple[FaultKind, ...]] | None = None,
        *,
        absent_repeats: int = 0,
        miss_cached: float = 0.0,
    ) -> None:
        self._rng = rng
        self.rate = rate
        self.faults = DISK_FAULTS if faults is None else faults
        self.absent_repeats = absent_repeats
        self.miss_cached = miss_cached
        self._absent: dict[str, int] = {}  # path -> look-ups still cached absent
        self.fired: Counter[str] = Counter()

    def cache_miss(self, path: str) -> None:
        if (
            self.absent_repeats
            and self.miss_cached
            and path not in self._absent
            and self._rng.random() < self.miss_cached
        ):
            self._absent[path] = self.absent_repeats

    def __call__(self, op: Op, path: str) -> Fault | None:
        if self._absent and (op is Op.READ or op is Op.EXISTS) and path in self._absent:
            left = self._absent.pop(path) - 1
            if left:
                self._absent[path] = left
            self.fired["disk-stale-absent"] += 1
            return Fault(FaultKind.STALE_ABSENT)
        kinds = self.faults.get(op)
        if not kinds or self.rate <= 0.0 or self._rng.random() >= self.rate:
            return None
        kind = self._rng.choice(kinds)
        self.fired[f"disk-{kind.name.lower().replace('_', '-')}"] += 1
        if kind is FaultKind.STALE_ABSENT and self.absent_repeats:
            self._absent[path] = self.absent_repeats
        return Fault(kind)
