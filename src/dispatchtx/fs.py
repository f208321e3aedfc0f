"""The filesystem and the clock, behind one small interface (DESIGN.md §4).

The store and the journal reach the disk only through `FS` and time only
through `Clock`. `RealFS` is thin over `os`; `SimulatedFS` keeps a durable
and a volatile image and can fail or kill at every call, so that the same
store and journal code runs in tests, in the simulator and in the campaign.

Paths are plain strings. Callers build them from hashed or validated names
only; the FS does not interpret them beyond what `os` does.

Errors are the `OSError` subclasses `os` raises (`FileNotFoundError`,
`FileExistsError`, `OSError(errno.EIO)`, `OSError(errno.ENOSPC)`, ...), so
that store and journal code handles a real and a simulated failure alike.

What is here:

- `RealFS`, `RealClock`: the real disk and this host's clocks.
- `SimulatedFS`: an in-memory disk with a volatile and a durable image,
  `crash("process" | "power")`, and a fault at any call.
- `SimulatedClock` on a shared `SimulatedTime`: per-host virtual clocks.
- `FaultyFS`: any `FS` (the real disk in the campaign) with faults at
  chosen calls and an injectable kill.
- One fault vocabulary for all of them: `Op` names a call, `Fault` (a
  `FaultKind` plus `keep`) says what goes wrong, a `FaultHook` (such as a
  scripted `FaultPlan` of `FaultRule`s) picks the fault for each call, and
  a kill raises `SimulatedCrash`, a BaseException.

Durability rules the store and the journal must follow (and SimulatedFS
enforces on power loss): a file's content is durable after its fsync
(`write_temp` fsyncs, `pwrite` unless told not to); a new, linked, renamed or unlinked name
is durable only after `fsync_dir` of its directory (a new journal file
included); `mkdir` is durable when it returns.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import (
    Any,
    Final,
    Literal,
    NamedTuple,
    NoReturn,
    Protocol,
    TypeAlias,
    TypeGuard,
    cast,
    runtime_checkable,
)

__all__ = [
    "DEFAULT_WALL_START",
    "DISK_FAULTS",
    "FS",
    "TEMP_PREFIX",
    "AppendHandle",
    "Call",
    "Clock",
    "CrashKind",
    "Fault",
    "FaultHook",
    "FaultKind",
    "FaultNotApplicable",
    "FaultPlan",
    "FaultRule",
    "FaultyAppendHandle",
    "FaultyFS",
    "FiredFault",
    "KillAction",
    "Op",
    "RandomDiskFaults",
    "RealAppendHandle",
    "RealClock",
    "RealFS",
    "SimulatedAppendHandle",
    "SimulatedClock",
    "SimulatedCrash",
    "SimulatedFS",
    "SimulatedTime",
    "UnsyncedTail",
    "is_temp_name",
    "sigkill_self",
]

#: Every temp file that `write_temp` creates is named TEMP_PREFIX + random hex,
#: so that a garbage collector can tell leftovers of a kill from real files.
TEMP_PREFIX: Final = ".tmp."


def is_temp_name(name: str) -> bool:
    """Whether a directory entry is a temp file left by `write_temp`."""
    return name.startswith(TEMP_PREFIX)


@runtime_checkable
class AppendHandle(Protocol):
    """An open append-only file (a journal)."""

    @property
    def path(self) -> str: ...

    def append(self, data: bytes) -> int:
        """Append `data` with ONE write call (never buffered); return the
        number of bytes written (a short write may leave a partial record)."""
        ...

    def fsync(self) -> None: ...

    def truncate(self, size: int) -> None:
        """Cut the file back to `size` bytes (after a failed append)."""
        ...

    def size(self) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class FS(Protocol):
    """What the store and the journal may do to a disk."""

    def read(self, path: str) -> bytes:
        """The whole file; FileNotFoundError if absent (a look-up that says
        "absent" may be stale: never decide a race from it)."""
        ...

    def write_temp(self, directory: str, data: bytes) -> str:
        """Create a new uniquely named temp file in `directory`, write
        `data`, fsync it; return its path."""
        ...

    def link(self, src: str, dst: str) -> None:
        """Hard-link `src` to `dst`; FileExistsError if `dst` exists. This is
        the one compare-and-swap the store relies on."""
        ...

    def rename(self, src: str, dst: str) -> None: ...

    def unlink(self, path: str) -> None: ...

    def mkdir(self, path: str) -> None:
        """Create a directory (and its parents); no error if it exists. The
        directories it creates are durable when it returns (the parent of
        each one is fsynced)."""
        ...

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (links, renames, unlinks, new files)
        durable. Until then a power loss may undo them, even for a file
        whose content was fsynced."""
        ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def open_append(self, path: str) -> AppendHandle:
        """Open (creating if needed) a file for appending."""
        ...

    def pwrite(self, path: str, offset: int, data: bytes, *, sync: bool = True) -> None:
        """Write `data` at `offset` in place, creating the file if needed,
        and fsync it unless `sync` is False (the heartbeat counter)."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Time as one host sees it."""

    def monotonic(self) -> float:
        """Seconds on this host's monotonic clock; never goes backwards."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch; may step."""
        ...


# ---------------------------------------------------------------------------
# The real disk
# ---------------------------------------------------------------------------

_FILE_MODE: Final = 0o644


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, looping over short writes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # a regular file never does this; do not spin if it does
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


class RealAppendHandle:
    """An append-only file descriptor: one `os.write` per `append`, no
    Python buffering, so a SIGKILL never loses a record that was written."""

    __slots__ = ("_fd", "_path")

    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd

    @property
    def path(self) -> str:
        return self._path

    def _open_fd(self) -> int:
        if self._fd < 0:
            raise OSError(errno.EBADF, "append handle is closed", self._path)
        return self._fd

    def append(self, data: bytes) -> int:
        # ONE write call: a short count is reported, never completed behind
        # the caller's back (the journal truncates back to its last record).
        return os.write(self._open_fd(), data)

    def fsync(self) -> None:
        os.fsync(self._open_fd())

    def truncate(self, size: int) -> None:
        os.ftruncate(self._open_fd(), size)

    def size(self) -> int:
        return os.fstat(self._open_fd()).st_size

    def close(self) -> None:
        """Close the descriptor; closing twice is a no-op."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __repr__(self) -> str:
        return f"RealAppendHandle({self._path!r}, fd={self._fd})"


class RealFS:
    """The `FS` interface, thin over `os`. Stateless, so one instance may be
    shared; every method raises the `OSError` that `os` raised."""

    __slots__ = ()

    def read(self, path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    def write_temp(self, directory: str, data: bytes) -> str:
        while True:
            path = os.path.join(directory, TEMP_PREFIX + secrets.token_hex(16))
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, _FILE_MODE)
            except FileExistsError:  # 128 random bits collided: draw again
                continue
            break
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)  # may raise too (EIO on NFS): then the temp is not good
        except BaseException:
            # Best effort: a kill here leaves the temp, which GC removes.
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return path

    def link(self, src: str, dst: str) -> None:
        os.link(src, dst)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        missing: list[str] = []
        current = path
        while not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current) or "."
            if parent == current:
                break
            current = parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise
                # A peer created it; fsync the parent anyway: it may not have yet.
            self.fsync_dir(os.path.dirname(directory) or ".")

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        # Only "not there" is False: EIO or ESTALE propagate instead of
        # being mistaken for an absent file.
        try:
            os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def open_append(self, path: str) -> RealAppendHandle:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        return RealAppendHandle(path, fd)

    def pwrite(self, path: str, offset: int, data: bytes, *, sync: bool = True) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, _FILE_MODE)
        try:
            view = memoryview(data)
            position = offset
            while view:
                written = os.pwrite(fd, view, position)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                view = view[written:]
                position += written
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def __repr__(self) -> str:
        return "RealFS()"


class RealClock:
    """This host's clocks: `time.monotonic` and `time.time`."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "RealClock()"


# ---------------------------------------------------------------------------
# Fault descriptions: one vocabulary for SimulatedFS, FaultyFS, tests and the
# campaign (DESIGN.md §6, fault point 6)
# ---------------------------------------------------------------------------


class Op(StrEnum):
    """The name of every call at which a fault can be injected. The handle
    operations (`APPEND` ... `CLOSE`) are the methods of an `AppendHandle`."""

    READ = "read"
    WRITE_TEMP = "write_temp"
    LINK = "link"
    RENAME = "rename"
    UNLINK = "unlink"
    MKDIR = "mkdir"
    FSYNC_DIR = "fsync_dir"
    LISTDIR = "listdir"
    EXISTS = "exists"
    OPEN_APPEND = "open_append"
    PWRITE = "pwrite"
    APPEND = "append"
    FSYNC = "fsync"
    TRUNCATE = "truncate"
    SIZE = "size"
    CLOSE = "close"


class FaultKind(Enum):
    """What goes wrong at one call.

    - `EIO`: the call raises `OSError(EIO)` without effect, except that in
      `SimulatedFS` an fsync that fails (`AppendHandle.fsync`, and the
      fsync inside `pwrite`) first drops the file's dirty pages: its content
      reverts to the durable one, as Linux does after a writeback error.
      A failed `fsync_dir` makes nothing durable.
    - `ENOSPC`: `OSError(ENOSPC)`. On `write_temp`, `append` and `pwrite`
      a prefix of the data lands first (`Fault.keep` bytes; by default half):
      `write_temp` leaves an orphan temp file holding that prefix, unsynced.
      Other calls that allocate fail without effect.
    - `SHORT_WRITE`: `append` writes only a prefix and returns its length,
      without an error (what a single `os.write` may do).
    - `ESTALE`: `OSError(ESTALE)` without effect (a peer's file deleted
      under an NFS handle).
    - `LOST_LINK_REPLY`: `link` succeeds, then raises `FileExistsError`
      (an NFS retransmission answered by the first attempt's effect).
    - `STALE_ABSENT`: `read` raises `FileNotFoundError` and `exists`
      returns False, although the file may be there (a cached negative
      look-up).
    - `KILL_BEFORE` / `KILL_AFTER`: the process dies before the call takes
      effect, or after it took effect but before its caller learns the
      outcome. `SimulatedFS` raises `SimulatedCrash`; `FaultyFS` runs its
      kill action (SIGKILL by default).
    """

    EIO = "eio"
    ENOSPC = "enospc"
    SHORT_WRITE = "short_write"
    ESTALE = "estale"
    LOST_LINK_REPLY = "lost_link_reply"
    STALE_ABSENT = "stale_absent"
    KILL_BEFORE = "kill_before"
    KILL_AFTER = "kill_after"


_ALL_OPS: Final = frozenset(Op)
# The calls whose data can land in part before ENOSPC (or a short write).
_PARTIAL_WRITE_OPS: Final = frozenset({Op.WRITE_TEMP, Op.APPEND, Op.PWRITE})
_APPLICABLE_OPS: Final[Mapping[FaultKind, frozenset[Op]]] = {
    FaultKind.EIO: _ALL_OPS,
    FaultKind.ESTALE: _ALL_OPS,
    FaultKind.KILL_BEFORE: _ALL_OPS,
    FaultKind.KILL_AFTER: _ALL_OPS,
    FaultKind.ENOSPC: _PARTIAL_WRITE_OPS | {Op.LINK, Op.RENAME, Op.MKDIR, Op.OPEN_APPEND},
    FaultKind.SHORT_WRITE: frozenset({Op.APPEND}),
    FaultKind.LOST_LINK_REPLY: frozenset({Op.LINK}),
    FaultKind.STALE_ABSENT: frozenset({Op.READ, Op.EXISTS}),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault to inject at one call. `keep` is how many bytes of the data
    land for `ENOSPC` and `SHORT_WRITE` (None: half of them)."""

    kind: FaultKind
    keep: int | None = None

    def __post_init__(self) -> None:
        if self.keep is not None:
            if self.kind not in (FaultKind.ENOSPC, FaultKind.SHORT_WRITE):
                raise ValueError(f"keep= only applies to ENOSPC and SHORT_WRITE, not {self.kind}")
            if self.keep < 0:
                raise ValueError(f"keep must be >= 0, got {self.keep}")

    def applies_to(self, op: Op) -> bool:
        """Whether this fault can happen at a call of `op`."""
        return op in _APPLICABLE_OPS[self.kind]

    def kept(self, size: int) -> int:
        """How many bytes of a `size`-byte write land before the fault."""
        return size // 2 if self.keep is None else min(self.keep, size)


class FaultNotApplicable(ValueError):
    """A fault hook returned a fault that cannot happen at that call (a
    bug in the test or plan, e.g. a lost link reply for a read)."""


#: Decides, for each call, whether a fault happens: called with the
#: operation and its path (for `link` and `rename`: the destination; for
#: `write_temp`: the directory; for handle operations: the handle's path).
FaultHook = Callable[[Op, str], Fault | None]


class Call(NamedTuple):
    """One call, as `fs.log` records it."""

    op: Op
    path: str


class FiredFault(NamedTuple):
    """A fault a `FaultPlan` handed out."""

    op: Op
    path: str
    fault: Fault


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Inject `fault` at the calls this rule matches: calls of `op` (None:
    any operation) whose path contains `path_contains`, and at which the
    fault can happen. With `nth` set, only at the nth such call (0-based,
    counted by the plan); else at every one."""

    fault: Fault
    op: Op | None = None
    nth: int | None = None
    path_contains: str = ""

    def __post_init__(self) -> None:
        if self.op is not None and not self.fault.applies_to(self.op):
            raise FaultNotApplicable(f"{self.fault.kind} cannot happen at {self.op}")
        if self.nth is not None and self.nth < 0:
            raise ValueError(f"nth must be >= 0, got {self.nth}")

    def matches(self, op: Op, path: str) -> bool:
        """Whether a call counts toward this rule. Counting the matches of
        a fault-free run (`sum(rule.matches(*call) for call in fs.log)`)
        gives the range of `nth` to enumerate."""
        return (
            (self.op is None or op == self.op)
            and self.path_contains in path
            and self.fault.applies_to(op)
        )


class FaultPlan:
    """A scripted `FaultHook`: "fail the nth call of X", "fail every call
    matching X". Each rule counts its own matches; at each call the first
    rule that fires decides the fault. `fired` lists what was injected."""

    def __init__(self, *rules: FaultRule) -> None:
        self.rules: tuple[FaultRule, ...] = rules
        self.seen: list[int] = [0] * len(rules)
        self.fired: list[FiredFault] = []

    def __call__(self, op: Op, path: str) -> Fault | None:
        chosen: Fault | None = None
        for index, rule in enumerate(self.rules):
            if not rule.matches(op, path):
                continue
            position = self.seen[index]
            self.seen[index] = position + 1
            if chosen is None and (rule.nth is None or rule.nth == position):
                chosen = rule.fault
        if chosen is not None:
            self.fired.append(FiredFault(op, path, chosen))
        return chosen

    def __repr__(self) -> str:
        return f"FaultPlan{self.rules!r}"


KillWhen = Literal["before", "after", "dead"]


class SimulatedCrash(BaseException):
    """The process was killed at an FS call (a `KILL_BEFORE`/`KILL_AFTER`
    fault). A BaseException, so that `except Exception` in store or journal
    code does not swallow it. Until the test calls `crash()` (SimulatedFS)
    or `revive()` (FaultyFS), every further call raises it again
    (`when == "dead"`): a killed process touches nothing more."""

    def __init__(self, op: Op, path: str, when: KillWhen) -> None:
        super().__init__(f"simulated kill {when} {op} {path!r}")
        self.op = op
        self.path = path
        self.when: KillWhen = when


def _error(code: int, path: str, other_path: str | None = None) -> OSError:
    """The OSError subclass `os` raises for `code` (FileNotFoundError, ...)."""
    if other_path is None:
        return OSError(code, os.strerror(code), path)
    return OSError(code, os.strerror(code), path, None, other_path)


class _KillAfter:
    """Context manager that kills on exit, whether the call raised or not.
    `__exit__` returns None so that type checkers know it swallows nothing."""

    __slots__ = ("_op", "_path", "_points")

    def __init__(self, points: _FaultPoints | None, op: Op, path: str) -> None:
        self._points = points
        self._op = op
        self._path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        if self._points is not None:
            self._points._kill(self._op, self._path, "after")


_NO_KILL: Final = _KillAfter(None, Op.READ, "")


class _FaultPoints:
    """Call counting, fault look-up and the killed state, shared by
    `SimulatedFS` and `FaultyFS` so that both read a fault the same way."""

    def __init__(self, fault: FaultHook | None) -> None:
        self.fault: FaultHook | None = fault
        #: Calls made per operation (calls refused after a kill not counted).
        self.calls: Counter[Op] = Counter()
        #: Set to a list to record every call in order (off by default, so
        #: that long simulations do not grow it without bound).
        self.log: list[Call] | None = None
        self._killed = False
        # Handles opened before a crash or revive belong to a dead process.
        self._generation = 0

    @property
    def killed(self) -> bool:
        """Whether a kill fault fired and the process was not yet restarted."""
        return self._killed

    @property
    def total_calls(self) -> int:
        return self.calls.total()

    def reset_calls(self) -> None:
        """Forget the call counts (and the log, if one is kept)."""
        self.calls.clear()
        if self.log is not None:
            self.log.clear()

    def _on_kill(self, op: Op, path: str) -> None:
        """What a kill does besides raising `SimulatedCrash`."""

    def _kill(self, op: Op, path: str, when: KillWhen) -> NoReturn:
        self._killed = True
        self._on_kill(op, path)
        raise SimulatedCrash(op, path, when)

    def _begin(self, op: Op, path: str, *, eio_drops_dirty: bool = False) -> Fault | None:
        """Count the call and look its fault up. Raises the faults that act
        before the call takes effect; returns the others for the caller."""
        if self._killed:
            raise SimulatedCrash(op, path, "dead")
        self.calls[op] += 1
        if self.log is not None:
            self.log.append(Call(op, path))
        hook = self.fault
        fault = None if hook is None else hook(op, path)
        if fault is None:
            return None
        if not fault.applies_to(op):
            raise FaultNotApplicable(f"{fault.kind} cannot happen at {op} {path!r}")
        kind = fault.kind
        if kind is FaultKind.KILL_BEFORE:
            self._kill(op, path, "before")
        if kind is FaultKind.ESTALE:
            raise _error(errno.ESTALE, path)
        if kind is FaultKind.EIO and not eio_drops_dirty:
            raise _error(errno.EIO, path)
        if kind is FaultKind.ENOSPC and op not in _PARTIAL_WRITE_OPS:
            raise _error(errno.ENOSPC, path)
        return fault

    def _after(self, fault: Fault | None, op: Op, path: str) -> _KillAfter:
        """Wrap the call's effect: a `KILL_AFTER` fault fires on the way out."""
        if fault is not None and fault.kind is FaultKind.KILL_AFTER:
            return _KillAfter(self, op, path)
        return _NO_KILL

    def _begin_handle(
        self, op: Op, path: str, generation: int, closed: bool, *, eio_drops_dirty: bool = False
    ) -> Fault | None:
        if self._killed:
            raise SimulatedCrash(op, path, "dead")
        if closed or generation != self._generation:
            raise _error(errno.EBADF, path)
        return self._begin(op, path, eio_drops_dirty=eio_drops_dirty)


def _is(fault: Fault | None, kind: FaultKind) -> TypeGuard[Fault]:
    return fault is not None and fault.kind is kind


# ---------------------------------------------------------------------------
# The simulated disk
# ---------------------------------------------------------------------------


class CrashKind(StrEnum):
    """`process`: a kill; the OS keeps its page cache, so nothing written is
    lost. `power`: the machine goes down; only what was fsynced survives."""

    PROCESS = "process"
    POWER = "power"


class UnsyncedTail(Enum):
    """What a power loss leaves of data appended after a file's last fsync.
    `DROP`: nothing. `TORN`: a random prefix of it. `ZEROED`: the file keeps
    its length but those bytes read as zeros (ext4 without data journaling
    can do this)."""

    DROP = "drop"
    TORN = "torn"
    ZEROED = "zeroed"


class _File:
    """A file's volatile content and its durable one.

    The durable content is `data[:synced]` while `base` is None (the common
    append-only case, so fsync of a growing journal costs O(1)); a change
    inside that prefix first copies it into `base`.
    """

    __slots__ = ("base", "data", "synced")

    def __init__(self, data: bytes, *, synced: bool) -> None:
        self.data = bytearray(data)
        self.synced = len(data) if synced else 0
        self.base: bytes | None = None

    def durable(self) -> bytes:
        return self.base if self.base is not None else bytes(self.data[: self.synced])

    @property
    def dirty(self) -> bool:
        return self.base is not None or len(self.data) != self.synced

    def _keep_durable_before_change_at(self, offset: int) -> None:
        if self.base is None and offset < self.synced:
            self.base = bytes(self.data[: self.synced])

    def append(self, data: bytes) -> None:
        self.data += data

    def write_at(self, offset: int, data: bytes) -> None:
        if not data:
            return  # writing nothing past the end does not extend a file
        self._keep_durable_before_change_at(offset)
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset : offset + len(data)] = data

    def truncate(self, size: int) -> None:
        self._keep_durable_before_change_at(size)
        if size < len(self.data):
            del self.data[size:]
        else:
            self.data.extend(bytes(size - len(self.data)))

    def sync(self) -> None:
        self.base = None
        self.synced = len(self.data)

    def _reset_to(self, content: bytes) -> None:
        self.data = bytearray(content)
        self.base = None
        self.synced = len(content)

    def drop_dirty(self) -> None:
        self._reset_to(self.durable())

    def lose_unsynced(self, tail: UnsyncedTail, rng: random.Random) -> None:
        durable = self.durable()
        survivors = b""
        appended_only = self.base is None and len(self.data) > self.synced
        if appended_only and tail is UnsyncedTail.TORN:
            end = self.synced + rng.randint(0, len(self.data) - self.synced)
            survivors = bytes(self.data[self.synced : end])
        elif appended_only and tail is UnsyncedTail.ZEROED:
            survivors = bytes(len(self.data) - self.synced)
        self._reset_to(durable + survivors)


class _Dir:
    """A directory's volatile entries and the ones its last fsync made durable."""

    __slots__ = ("_changed", "durable_entries", "entries")

    def __init__(self) -> None:
        self.entries: dict[str, _File | _Dir] = {}
        self.durable_entries: dict[str, _File | _Dir] = {}
        # Names changed since the last sync: a sync costs O(changes), not
        # O(entries) (a store's items/ directory grows with every item).
        self._changed: set[str] = set()

    def put(self, name: str, node: _File | _Dir) -> None:
        self.entries[name] = node
        self._changed.add(name)

    def remove(self, name: str) -> None:
        del self.entries[name]
        self._changed.add(name)

    def sync(self) -> None:
        entries, durable = self.entries, self.durable_entries
        for name in self._changed:
            node = entries.get(name)
            if node is None:
                durable.pop(name, None)
            else:
                durable[name] = node
        self._changed.clear()

    def restore_durable(self) -> None:
        self.entries = dict(self.durable_entries)
        self._changed.clear()


_Node: TypeAlias = _File | _Dir


def _parts(path: str) -> list[str]:
    """The components of `path`; relative paths start at the root."""
    if path[:1] == "/":
        # The store's own paths are already normal: skip normpath for them.
        parts = path[1:].split("/")
        if "" not in parts and "." not in parts and ".." not in parts:
            return parts
    return [part for part in posixpath.normpath("/" + path).split("/") if part]


class SimulatedAppendHandle:
    """An append handle on a `SimulatedFS` file. It holds the file itself,
    not its name: after a rename over the name, appends go to the old file
    (and are lost with it), as with a real descriptor."""

    __slots__ = ("_closed", "_file", "_fs", "_generation", "_path")

    def __init__(self, fs: SimulatedFS, path: str, file: _File, generation: int) -> None:
        self._fs = fs
        self._path = path
        self._file = file
        self._generation = generation
        self._closed = False

    @property
    def path(self) -> str:
        return self._path

    def _begin(self, op: Op, *, eio_drops_dirty: bool = False) -> Fault | None:
        return self._fs._begin_handle(
            op, self._path, self._generation, self._closed, eio_drops_dirty=eio_drops_dirty
        )

    def append(self, data: bytes) -> int:
        fault = self._begin(Op.APPEND)
        with self._fs._after(fault, Op.APPEND, self._path):
            if _is(fault, FaultKind.ENOSPC):
                self._file.append(data[: fault.kept(len(data))])
                raise _error(errno.ENOSPC, self._path)
            if _is(fault, FaultKind.SHORT_WRITE):
                written = fault.kept(len(data))
                self._file.append(data[:written])
                return written
            self._file.append(data)
            return len(data)

    def fsync(self) -> None:
        fault = self._begin(Op.FSYNC, eio_drops_dirty=True)
        with self._fs._after(fault, Op.FSYNC, self._path):
            if _is(fault, FaultKind.EIO):
                self._file.drop_dirty()
                raise _error(errno.EIO, self._path)
            self._file.sync()

    def truncate(self, size: int) -> None:
        fault = self._begin(Op.TRUNCATE)
        with self._fs._after(fault, Op.TRUNCATE, self._path):
            if size < 0:
                raise _error(errno.EINVAL, self._path)
            self._file.truncate(size)

    def size(self) -> int:
        fault = self._begin(Op.SIZE)
        with self._fs._after(fault, Op.SIZE, self._path):
            return len(self._file.data)

    def close(self) -> None:
        """Close the handle; closing twice, or after a crash, is a no-op."""
        if self._fs.killed:
            raise SimulatedCrash(Op.CLOSE, self._path, "dead")
        if self._closed or self._generation != self._fs._generation:
            self._closed = True
            return
        self._closed = True  # close gives the descriptor back even when it fails
        fault = self._fs._begin(Op.CLOSE, self._path)
        with self._fs._after(fault, Op.CLOSE, self._path):
            pass

    def __repr__(self) -> str:
        return f"SimulatedAppendHandle({self._path!r}, closed={self._closed})"


class SimulatedFS(_FaultPoints):
    """An in-memory disk with a volatile and a durable image (DESIGN.md §4).

    Writes, appends and `pwrite` change a file's volatile content; an fsync
    (the handle's, or the one inside `write_temp` and `pwrite`) makes that
    file's content durable. Directory entries that `link`, `rename`,
    `unlink`, `write_temp` and file creation add or remove are volatile until
    `fsync_dir` of that directory; `mkdir` is durable at once (as `RealFS`
    fsyncs the parents). `crash("process")` keeps the volatile image;
    `crash("power")` replaces it by the durable one.

    Faults: set `fault` to a `FaultHook` (e.g. a `FaultPlan`). Deterministic
    for a given `seed` (temp names, torn tails). Not thread-safe.
    """

    def __init__(self, *, seed: int = 0, fault: FaultHook | None = None) -> None:
        super().__init__(fault)
        self._rng = random.Random(seed)
        self._root = _Dir()
        self.crashes: Counter[CrashKind] = Counter()

    # -- resolving paths (in the volatile image unless `durable`) ---------

    def _node(self, path: str, *, durable: bool = False) -> _Node:
        return self._walk(_parts(path), path, durable)

    def _walk(self, parts: list[str], path: str, durable: bool = False) -> _Node:
        node: Any = self._root
        # The hottest loop of the simulator: a `_File` has no entries, so a
        # file in the middle of a path shows up as an AttributeError.
        try:
            if durable:
                for part in parts:
                    node = node.durable_entries[part]
            else:
                for part in parts:
                    node = node.entries[part]
        except KeyError:
            raise _error(errno.ENOENT, path) from None
        except AttributeError:
            raise _error(errno.ENOTDIR, path) from None
        return cast(_Node, node)

    def _file(self, path: str, *, durable: bool = False) -> _File:
        node = self._node(path, durable=durable)
        if isinstance(node, _Dir):
            raise _error(errno.EISDIR, path)
        return node

    def _dir(self, path: str, *, durable: bool = False) -> _Dir:
        node = self._node(path, durable=durable)
        if not isinstance(node, _Dir):
            raise _error(errno.ENOTDIR, path)
        return node

    def _parent(self, path: str) -> tuple[_Dir, str]:
        parts = _parts(path)
        if not parts:
            raise _error(errno.EBUSY, path)  # the root has no entry to change
        folder = self._walk(parts[:-1], path)
        if not isinstance(folder, _Dir):
            raise _error(errno.ENOTDIR, path)
        return folder, parts[-1]

    def _file_or_create(self, path: str) -> _File:
        try:
            node = self._node(path)
        except FileNotFoundError:
            parent, name = self._parent(path)
            created = _File(b"", synced=True)
            parent.put(name, created)
            return created
        if isinstance(node, _Dir):
            raise _error(errno.EISDIR, path)
        return node

    # -- the FS interface -------------------------------------------------

    def read(self, path: str) -> bytes:
        fault = self._begin(Op.READ, path)
        with self._after(fault, Op.READ, path):
            if _is(fault, FaultKind.STALE_ABSENT):
                raise _error(errno.ENOENT, path)
            return bytes(self._file(path).data)

    def write_temp(self, directory: str, data: bytes) -> str:
        fault = self._begin(Op.WRITE_TEMP, directory)
        with self._after(fault, Op.WRITE_TEMP, directory):
            folder = self._dir(directory)
            name = TEMP_PREFIX + f"{self._rng.getrandbits(128):032x}"
            while name in folder.entries:
                name = TEMP_PREFIX + f"{self._rng.getrandbits(128):032x}"
            path = posixpath.join(directory, name)
            if _is(fault, FaultKind.ENOSPC):
                folder.put(name, _File(data[: fault.kept(len(data))], synced=False))
                raise _error(errno.ENOSPC, path)
            folder.put(name, _File(data, synced=True))
            return path

    def link(self, src: str, dst: str) -> None:
        fault = self._begin(Op.LINK, dst)
        with self._after(fault, Op.LINK, dst):
            # Errors in the order Linux checks: source, destination, then type.
            source = self._node(src)
            if not _parts(dst):
                raise _error(errno.EEXIST, src, dst)
            parent, name = self._parent(dst)
            if name in parent.entries:
                raise _error(errno.EEXIST, src, dst)
            if isinstance(source, _Dir):
                raise _error(errno.EPERM, src, dst)
            parent.put(name, source)
            if _is(fault, FaultKind.LOST_LINK_REPLY):
                raise _error(errno.EEXIST, src, dst)

    def rename(self, src: str, dst: str) -> None:
        fault = self._begin(Op.RENAME, dst)
        with self._after(fault, Op.RENAME, dst):
            # Errors in the order Linux checks: both parents, the source, the
            # subtree traps, then the types.
            src_parent, src_name = self._parent(src)
            dst_parent, dst_name = self._parent(dst)
            node = src_parent.entries.get(src_name)
            if node is None:
                raise _error(errno.ENOENT, src, dst)
            existing = dst_parent.entries.get(dst_name)
            if existing is node:
                return  # two names of one file (or one directory): nothing to do
            src_parts, dst_parts = _parts(src), _parts(dst)
            if isinstance(node, _Dir) and dst_parts[: len(src_parts)] == src_parts:
                raise _error(errno.EINVAL, src, dst)  # into its own subtree
            if existing is not None and src_parts[: len(dst_parts)] == dst_parts:
                raise _error(errno.ENOTEMPTY, src, dst)  # over its own ancestor
            if isinstance(existing, _Dir):
                if not isinstance(node, _Dir):
                    raise _error(errno.EISDIR, src, dst)
                if existing.entries:
                    raise _error(errno.ENOTEMPTY, src, dst)
            elif existing is not None and isinstance(node, _Dir):
                raise _error(errno.ENOTDIR, src, dst)
            src_parent.remove(src_name)
            dst_parent.put(dst_name, node)

    def unlink(self, path: str) -> None:
        fault = self._begin(Op.UNLINK, path)
        with self._after(fault, Op.UNLINK, path):
            if isinstance(self._node(path), _Dir):
                raise _error(errno.EISDIR, path)
            parent, name = self._parent(path)
            parent.remove(name)

    def mkdir(self, path: str) -> None:
        fault = self._begin(Op.MKDIR, path)
        with self._after(fault, Op.MKDIR, path):
            node = self._root
            for part in _parts(path):
                child = node.entries.get(part)
                if child is None:
                    child = _Dir()
                    node.put(part, child)
                    node.sync()  # RealFS fsyncs the parent of each new directory
                elif not isinstance(child, _Dir):
                    raise _error(errno.EEXIST, path)
                node = child

    def fsync_dir(self, path: str) -> None:
        fault = self._begin(Op.FSYNC_DIR, path)
        with self._after(fault, Op.FSYNC_DIR, path):
            self._dir(path).sync()

    def listdir(self, path: str) -> list[str]:
        fault = self._begin(Op.LISTDIR, path)
        with self._after(fault, Op.LISTDIR, path):
            return sorted(self._dir(path).entries)

    def exists(self, path: str) -> bool:
        fault = self._begin(Op.EXISTS, path)
        with self._after(fault, Op.EXISTS, path):
            if _is(fault, FaultKind.STALE_ABSENT):
                return False
            try:
                self._node(path)
            except (FileNotFoundError, NotADirectoryError):
                return False
            return True

    def open_append(self, path: str) -> SimulatedAppendHandle:
        fault = self._begin(Op.OPEN_APPEND, path)
        with self._after(fault, Op.OPEN_APPEND, path):
            file = self._file_or_create(path)
            return SimulatedAppendHandle(self, path, file, self._generation)

    def pwrite(self, path: str, offset: int, data: bytes, *, sync: bool = True) -> None:
        # Without the fsync, an EIO is a plain failed write (raised before it).
        fault = self._begin(Op.PWRITE, path, eio_drops_dirty=sync)
        with self._after(fault, Op.PWRITE, path):
            if offset < 0:
                raise _error(errno.EINVAL, path)
            file = self._file_or_create(path)
            if _is(fault, FaultKind.ENOSPC):
                file.write_at(offset, data[: fault.kept(len(data))])
                raise _error(errno.ENOSPC, path)
            file.write_at(offset, data)
            if _is(fault, FaultKind.EIO):  # the fsync failed: its dirty pages are gone
                file.drop_dirty()
                raise _error(errno.EIO, path)
            if sync:
                file.sync()

    # -- crashes ----------------------------------------------------------

    def crash(
        self, kind: CrashKind | str, *, unsynced_tail: UnsyncedTail = UnsyncedTail.DROP
    ) -> None:
        """The process (or the machine) went down and comes back. Open
        handles become invalid (EBADF) and calls are accepted again.
        `process` keeps the volatile image; `power` keeps only the durable
        one, and `unsynced_tail` says what is left of unsynced appends."""
        crash_kind = CrashKind(kind)
        self._killed = False
        self._generation += 1
        self.crashes[crash_kind] += 1
        if crash_kind is CrashKind.POWER:
            self._restore_durable(unsynced_tail)

    def _restore_durable(self, tail: UnsyncedTail) -> None:
        seen: set[int] = set()  # hard links: reset each file once
        pending = [self._root]
        while pending:
            folder = pending.pop()
            folder.restore_durable()
            for node in folder.entries.values():
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if isinstance(node, _Dir):
                    pending.append(node)
                else:
                    node.lose_unsynced(tail, self._rng)

    # -- looking at the durable image (not FS calls: never faulted) -------

    def durable_exists(self, path: str) -> bool:
        """Whether `path` would survive a power loss now."""
        try:
            self._node(path, durable=True)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def durable_read(self, path: str) -> bytes:
        """The content `path` would have after a power loss now."""
        return self._file(path, durable=True).durable()

    def durable_listdir(self, path: str) -> list[str]:
        """The entries of `path` that would survive a power loss now."""
        return sorted(self._dir(path, durable=True).durable_entries)

    def is_dirty(self, path: str) -> bool:
        """Whether the file's volatile content differs from its durable one."""
        return self._file(path).dirty

    def __repr__(self) -> str:
        return f"SimulatedFS(calls={self.total_calls}, killed={self._killed})"


# ---------------------------------------------------------------------------
# Simulated clocks
# ---------------------------------------------------------------------------

#: Where simulated wall clocks start: 2024-01-01T00:00:00Z.
DEFAULT_WALL_START: Final = 1_704_067_200.0


class SimulatedTime:
    """Virtual time shared by the hosts of one simulation: advancing it
    advances every clock made on it."""

    __slots__ = ("_elapsed",)

    def __init__(self) -> None:
        self._elapsed = 0.0

    @property
    def elapsed(self) -> float:
        return self._elapsed

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go backwards (advance by {seconds})")
        self._elapsed += seconds

    def clock(
        self, *, monotonic_start: float = 0.0, wall_start: float = DEFAULT_WALL_START
    ) -> SimulatedClock:
        """A new host's clocks on this time."""
        return SimulatedClock(self, monotonic_start=monotonic_start, wall_start=wall_start)


class SimulatedClock:
    """One host's clocks on a `SimulatedTime` (its own one if none is given).
    The monotonic clock only moves with time; the wall clock also steps."""

    __slots__ = ("_monotonic_origin", "_time", "_wall_origin")

    def __init__(
        self,
        time: SimulatedTime | None = None,
        *,
        monotonic_start: float = 0.0,
        wall_start: float = DEFAULT_WALL_START,
    ) -> None:
        self._time = SimulatedTime() if time is None else time
        # The readings are origin + elapsed, so a clock made late starts at its start.
        self._monotonic_origin = monotonic_start - self._time.elapsed
        self._wall_origin = wall_start - self._time.elapsed

    @property
    def time(self) -> SimulatedTime:
        return self._time

    def monotonic(self) -> float:
        return self._monotonic_origin + self._time.elapsed

    def wall(self) -> float:
        return self._wall_origin + self._time.elapsed

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass, for every clock that shares this time."""
        self._time.advance(seconds)

    def step_wall(self, seconds: float) -> None:
        """Step this host's wall clock (either way); monotonic is unaffected."""
        self._wall_origin += seconds

    def reboot(self, monotonic_start: float = 0.0) -> None:
        """The host restarted: its monotonic clock starts over (the one
        reading that may go backwards, across a reboot only)."""
        self._monotonic_origin = monotonic_start - self._time.elapsed

    def __repr__(self) -> str:
        return f"SimulatedClock(monotonic={self.monotonic()}, wall={self.wall()})"


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

    def pwrite(self, path: str, offset: int, data: bytes, *, sync: bool = True) -> None:
        fault = self._begin(Op.PWRITE, path)
        with self._after(fault, Op.PWRITE, path):
            if _is(fault, FaultKind.ENOSPC):
                self.inner.pwrite(path, offset, data[: fault.kept(len(data))], sync=sync)
                raise _error(errno.ENOSPC, path)
            self.inner.pwrite(path, offset, data, sync=sync)

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


class RandomDiskFaults:
    """A fault hook for SimulatedFS: each call fails with probability `rate`."""

    def __init__(self, rng: random.Random, rate: float) -> None:
        self._rng = rng
        self.rate = rate
        self.fired: Counter[str] = Counter()

    def __call__(self, op: Op, path: str) -> Fault | None:
        kinds = DISK_FAULTS.get(op)
        if not kinds or self.rate <= 0.0 or self._rng.random() >= self.rate:
            return None
        kind = self._rng.choice(kinds)
        self.fired[f"disk-{kind.name.lower().replace('_', '-')}"] += 1
        return Fault(kind)
