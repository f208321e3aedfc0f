"""The filesystem's interface: what the store and the journal may call (`FS`,
`AppendHandle`) and the clock they read (`Clock`).

Paths are plain strings. Callers build them from hashed or validated names
only; the FS does not interpret them beyond what `os` does. Errors are the
`OSError` subclasses `os` raises (`FileNotFoundError`, `FileExistsError`,
`OSError(errno.EIO)`, `OSError(errno.ENOSPC)`, ...).

Durability rules the store and the journal must follow (and `SimulatedFS`
enforces on power loss): a file's content is durable after its fsync
(`write_temp` fsyncs, `pwrite` unless told not to); a new, linked, renamed
or unlinked name is durable only after `fsync_dir` of its directory (a new
journal file included); `mkdir` is durable when it returns.
"""

from __future__ import annotations

from typing import (
    Final,
    Protocol,
    runtime_checkable,
)

__all__ = ["AppendHandle", "Clock", "FS", "TEMP_PREFIX", "is_temp_name"]


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

    def pwrite(
        self, path: str, offset: int, data: bytes, *, sync: bool = True, create: bool = True
    ) -> None:
        """Write `data` at `offset` in place, creating the file if needed
        (`create=False`: FileNotFoundError instead), and fsync it unless
        `sync` is False (the heartbeat counter)."""
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
