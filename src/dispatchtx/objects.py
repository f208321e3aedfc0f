"""Content-addressed objects: immutable blobs named by the sha256 of their bytes.

The shared store keeps each committed result here before it publishes the
commit slot that names it (DESIGN.md §4), so a commit record never points at
content that is not durable.

Layout under the store directory `root`::

    objects/<aa>/<id>      one immutable file per object; <aa> = id[:2]
    tmp/.tmp.<random>      temp files, linked into place, then unlinked

Object ids that come from outside (a commit record, a worker, a user) are
checked to be exactly 64 lowercase hex digits before they touch a path.

This module also holds the root of the store's error family, `StoreError`,
and the errors that the object store and the work store share.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from typing import Final

from dispatchtx.errors import DispatchError
from dispatchtx.fs import FS

__all__ = [
    "CorruptObject",
    "InvalidId",
    "InvalidObjectId",
    "ObjectNotFound",
    "ObjectStore",
    "StoreError",
    "StoreIOError",
    "object_id_of",
    "validate_object_id",
]

_OBJECT_ID: Final = re.compile(r"[0-9a-f]{64}")

#: How often `put` retries a `link` or `fsync_dir` that raised an I/O error
#: before giving up (a link is idempotent here: same name, same content).
_PUT_ATTEMPTS: Final = 8


class StoreError(DispatchError):
    """Root of every error of the object store and the shared work store."""


class InvalidId(StoreError, ValueError):
    """An id from outside (work id, object id, coordinator id) that must not
    become a path: wrong type, wrong shape or absurd size. Nothing was done."""


class InvalidObjectId(InvalidId):
    """Not exactly 64 lowercase hex digits."""

    def __init__(self, value: object) -> None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(
            f"invalid object id {shown}: expected a str of exactly 64 lowercase hex digits"
        )
        self.value = value


class ObjectNotFound(StoreError):
    """No object with this id in the store."""

    def __init__(self, object_id: str, path: str) -> None:
        super().__init__(f"object {object_id} not found at {path}")
        self.object_id = object_id
        self.path = path


class CorruptObject(StoreError):
    """An object whose content does not hash to its id (disk corruption or a
    file put there by something else than `put`)."""

    def __init__(self, object_id: str, path: str, reason: str) -> None:
        super().__init__(f"object {object_id} at {path} is corrupt: {reason}")
        self.object_id = object_id
        self.path = path
        self.reason = reason


class StoreIOError(StoreError):
    """A filesystem call failed. Unless the raising method says otherwise,
    nothing was changed; `__cause__` is the `OSError`."""

    def __init__(self, action: str, path: str, error: OSError) -> None:
        super().__init__(f"{action} failed at {path}: {error}")
        self.action = action
        self.path = path
        self.errno = error.errno


def object_id_of(content: bytes) -> str:
    """The id `put` gives `content`: its sha256 in lowercase hex."""
    return hashlib.sha256(content).hexdigest()


def validate_object_id(object_id: object) -> str:
    """Return `object_id` if it is a str of exactly 64 lowercase hex digits,
    else raise `InvalidObjectId`."""
    if not isinstance(object_id, str) or _OBJECT_ID.fullmatch(object_id) is None:
        raise InvalidObjectId(object_id)
    return object_id


class ObjectStore:
    """Immutable, content-addressed objects in `<root>/objects` over an `FS`.

    `put` is idempotent and safe against concurrent writers of the same
    content (a name collision means the same bytes). Not thread-safe: one
    instance per thread, any number per directory.
    """

    __slots__ = ("_created", "_fs", "_objects", "_root", "_tmp")

    def __init__(self, fs: FS, root: str) -> None:
        self._fs = fs
        self._root = root
        self._objects = os.path.join(root, "objects")
        self._tmp = os.path.join(root, "tmp")
        # Directories made durable by this instance (mkdir + fsync of the parent).
        self._created: set[str] = set()

    @property
    def root(self) -> str:
        return self._root

    def path_of(self, object_id: str) -> str:
        """Where the object lives (the id is validated first)."""
        object_id = validate_object_id(object_id)
        return os.path.join(self._objects, object_id[:2], object_id)

    def put(self, content: bytes) -> str:
        """Store `content` durably and return its id.

        On return the object file and its directory entry are fsynced, whether
        this call or an earlier writer created it. Raises `StoreIOError` if the
        disk failed; an object may then exist or not (a later `put` of the same
        content is always safe).
        """
        if not isinstance(content, bytes):
            raise TypeError(f"object content must be bytes, not {type(content).__name__}")
        object_id = object_id_of(content)
        path = self.path_of(object_id)
        directory = os.path.dirname(path)
        self._ensure_dir(directory)
        try:
            temp = self._fs.write_temp(self._tmp, content)
        except OSError as error:
            raise StoreIOError("writing a temp object", self._tmp, error) from error
        try:
            last_error: OSError | None = None
            for _ in range(_PUT_ATTEMPTS):
                try:
                    # EEXIST: same name = same content; someone (maybe us) put it.
                    with contextlib.suppress(FileExistsError):
                        self._fs.link(temp, path)
                    # Also after EEXIST: its writer may have died before this fsync.
                    self._fs.fsync_dir(directory)
                    return object_id
                except OSError as error:
                    # EIO on link is ambiguous; linking again is idempotent here.
                    last_error = error
            assert last_error is not None
            raise StoreIOError("linking an object into place", path, last_error) from last_error
        finally:
            self._discard_temp(temp)

    def get(self, object_id: str) -> bytes:
        """The content of an object, verified against its id."""
        path = self.path_of(object_id)
        try:
            content = self._fs.read(path)
        except FileNotFoundError as error:
            raise ObjectNotFound(object_id, path) from error
        except OSError as error:
            raise StoreIOError("reading an object", path, error) from error
        actual = object_id_of(content)
        if actual != object_id:
            raise CorruptObject(object_id, path, f"its content hashes to {actual}")
        return content

    def has(self, object_id: str) -> bool:
        """Whether the object is there. A False may be a stale negative look-up
        on a network filesystem: use it as a hint, never to decide a race."""
        path = self.path_of(object_id)
        try:
            return self._fs.exists(path)
        except OSError as error:
            raise StoreIOError("looking up an object", path, error) from error

    def _ensure_dir(self, directory: str) -> None:
        """Create `directory` (and `tmp`) once per instance, each made durable
        by an fsync of its parent, so a linked object survives power loss."""
        for needed in (self._root, self._tmp, self._objects, directory):
            if needed in self._created:
                continue
            try:
                self._fs.mkdir(needed)
                self._fs.fsync_dir(os.path.dirname(needed) or ".")
            except OSError as error:
                raise StoreIOError("creating a directory", needed, error) from error
            self._created.add(needed)

    def _discard_temp(self, temp: str) -> None:
        # A leftover temp is garbage, never data: GC removes `.tmp.*` files.
        with contextlib.suppress(OSError):
            self._fs.unlink(temp)
