"""The simulated disk and clocks: `SimulatedFS` keeps a volatile and a durable
image of an in-memory tree, can fail or kill at every call, and loses what
was not durable on `crash("power")`; `SimulatedClock`s of several hosts
share one `SimulatedTime`.
"""

from __future__ import annotations

import errno
import posixpath
import random
from collections import Counter
from collections.abc import Callable
from enum import Enum, StrEnum
from typing import (
    Any,
    Final,
    TypeAlias,
    cast,
)

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
from dispatchtx.fs.interface import TEMP_PREFIX

__all__ = [
    "CrashKind",
    "DEFAULT_WALL_START",
    "SimulatedAppendHandle",
    "SimulatedClock",
    "SimulatedFS",
    "SimulatedTime",
    "UnsyncedTail",
]


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
    """An in-memory disk with a volatile and a durable image (docs/design.md).

    Writes, appends and `pwrite` change a file's volatile content; an fsync
    (the handle's, or the one inside `write_temp` and `pwrite`) makes that
    file's content durable. Directory entries that `link`, `rename`,
    `unlink`, `write_temp` and file creation add or remove are volatile until
    `fsync_dir` of that directory; `mkdir` is durable at once (as `RealFS`
    fsyncs the parents). `crash("process")` keeps the volatile image;
    `crash("power")` replaces it by the durable one.

    Faults: set `fault` to a `FaultHook` (e.g. a `DiskFaultPlan`). `on_miss`,
    if set, is told each path a `read` or `exists` really found absent (a
    client's negative look-up cache learns from those). Deterministic for a
    given `seed` (temp names, torn tails). Not thread-safe.
    """

    def __init__(self, *, seed: int = 0, fault: FaultHook | None = None) -> None:
        super().__init__(fault)
        self._rng = random.Random(seed)
        self._root = _Dir()
        self.crashes: Counter[CrashKind] = Counter()
        self.on_miss: Callable[[str], None] | None = None

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
            try:
                return bytes(self._file(path).data)
            except FileNotFoundError:
                if self.on_miss is not None:
                    self.on_miss(path)
                raise

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
            except FileNotFoundError:
                if self.on_miss is not None:
                    self.on_miss(path)
                return False
            except NotADirectoryError:
                return False
            return True

    def open_append(self, path: str) -> SimulatedAppendHandle:
        fault = self._begin(Op.OPEN_APPEND, path)
        with self._after(fault, Op.OPEN_APPEND, path):
            file = self._file_or_create(path)
            return SimulatedAppendHandle(self, path, file, self._generation)

    def pwrite(
        self, path: str, offset: int, data: bytes, *, sync: bool = True, create: bool = True
    ) -> None:
        # Without the fsync, an EIO is a plain failed write (raised before it).
        fault = self._begin(Op.PWRITE, path, eio_drops_dirty=sync)
        with self._after(fault, Op.PWRITE, path):
            if offset < 0:
                raise _error(errno.EINVAL, path)
            file = self._file_or_create(path) if create else self._file(path)
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
