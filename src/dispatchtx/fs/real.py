"""The real disk and this host's clocks: `RealFS` and `RealClock`, thin over `os`."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from typing import (
    Final,
)

from dispatchtx.fs.interface import TEMP_PREFIX

__all__ = ["RealAppendHandle", "RealClock", "RealFS"]


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

    def pwrite(
        self, path: str, offset: int, data: bytes, *, sync: bool = True, create: bool = True
    ) -> None:
        flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, _FILE_MODE)
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
