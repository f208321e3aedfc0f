"""`TimedFS`: an FS whose every call is counted and timed by kind (and
`CallTimer` for other objects' methods), so the
bench can say how much of a committed item's cost is the disk calls the
store and the journal make (the floor no Python around them can go under)
and how much is the Python itself."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from dispatchtx.fs import FS, AppendHandle

T = TypeVar("T")


class CallTimer:
    """`calls[kind]` and `seconds[kind]` grow with each call timed, failed
    ones too (a look-up that finds nothing is a system call all the same)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}

    def timed(self, kind: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - started
            self.calls[kind] += 1

    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def wrap_methods(self, target: object, names: tuple[str, ...], prefix: str) -> None:
        """Time every call of `target.<name>` from now on, as `prefix + name`."""
        for name in names:
            method: Callable[..., Any] = getattr(target, name)

            def timed_method(
                *args: Any, _method: Callable[..., Any] = method, _kind: str = prefix + name
            ) -> Any:
                return self.timed(_kind, lambda: _method(*args))

            setattr(target, name, timed_method)


class TimedFS(CallTimer):
    """Delegates to `inner`, timing each call by its kind."""

    def __init__(self, inner: FS) -> None:
        super().__init__()
        self._inner = inner

    def read(self, path: str) -> bytes:
        return self.timed("read", lambda: self._inner.read(path))

    def write_temp(self, directory: str, data: bytes) -> str:
        return self.timed("write_temp", lambda: self._inner.write_temp(directory, data))

    def link(self, src: str, dst: str) -> None:
        self.timed("link", lambda: self._inner.link(src, dst))

    def rename(self, src: str, dst: str) -> None:
        self.timed("rename", lambda: self._inner.rename(src, dst))

    def unlink(self, path: str) -> None:
        self.timed("unlink", lambda: self._inner.unlink(path))

    def mkdir(self, path: str) -> None:
        self.timed("mkdir", lambda: self._inner.mkdir(path))

    def fsync_dir(self, path: str) -> None:
        self.timed("fsync_dir", lambda: self._inner.fsync_dir(path))

    def listdir(self, path: str) -> list[str]:
        return self.timed("listdir", lambda: self._inner.listdir(path))

    def exists(self, path: str) -> bool:
        return self.timed("exists", lambda: self._inner.exists(path))

    def open_append(self, path: str) -> AppendHandle:
        return TimedAppendHandle(
            self.timed("open_append", lambda: self._inner.open_append(path)), self
        )

    def pwrite(
        self, path: str, offset: int, data: bytes, *, sync: bool = True, create: bool = True
    ) -> None:
        self.timed(
            "pwrite", lambda: self._inner.pwrite(path, offset, data, sync=sync, create=create)
        )


class TimedAppendHandle:
    """An append handle whose calls count in its `TimedFS`."""

    def __init__(self, inner: AppendHandle, fs: TimedFS) -> None:
        self._inner = inner
        self._fs = fs

    @property
    def path(self) -> str:
        return self._inner.path

    def append(self, data: bytes) -> int:
        return self._fs.timed("append", lambda: self._inner.append(data))

    def fsync(self) -> None:
        self._fs.timed("fsync", self._inner.fsync)

    def truncate(self, size: int) -> None:
        self._fs.timed("truncate", lambda: self._inner.truncate(size))

    def size(self) -> int:
        return self._inner.size()

    def close(self) -> None:
        self._inner.close()
