"""Content-addressed objects: immutable blobs named by the sha256 of their bytes.

The shared store keeps each committed result here before it publishes the
commit slot that names it (docs/design.md), so a commit record never points at
content that is not durable.

Layout under the store directory `root`::

    objects/<aa>/<id>      one immutable file per object; <aa> = id[:2]
    tmp/.tmp.<random>      temp files, linked into place, then unlinked

Object ids that come from outside (a commit record, a worker, a user) are
checked to be exactly 64 lowercase hex digits before they touch a path.

Its errors (`InvalidObjectId`, `ObjectNotFound`, `CorruptObject`,
`StoreIOError`) are in `dispatchtx.store.errors`, with the rest of the
store's error family.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from typing import Final

from dispatchtx.fs import FS
from dispatchtx.store.errors import CorruptObject, InvalidObjectId, ObjectNotFound, StoreIOError

__all__ = ["ObjectStore", "object_id_of", "validate_object_id"]

_OBJECT_ID: Final = re.compile(r"[0-9a-f]{64}")

#: How often `put` retries a `link` or `fsync_dir` that raised an I/O error
#: before giving up (a link is idempotent here: same name, same content).
_PUT_ATTEMPTS: Final = 8


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
        this call or an earlier writer created it; a file already at its name
        that does not hold this content (rotted, or cut short) is replaced
        atomically by one that does. Raises `StoreIOError` if the
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
            for attempt in range(_PUT_ATTEMPTS):
                try:
                    # After an ambiguous failure (a rename whose reply was
                    # lost), the right bytes may be in place already.
                    if not (attempt and self._holds(path, object_id)):
                        try:
                            self._fs.link(temp, path)
                        except FileExistsError:
                            # A name is not proof of its content: a rotted or
                            # partial file must not stand for this result.
                            if not self._holds(path, object_id):
                                self._fs.rename(temp, path)  # atomic replacement
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

    def _holds(self, path: str, object_id: str) -> bool:
        """Whether the file at `path` reads back as the object (False when
        it cannot be read at all)."""
        try:
            return object_id_of(self._fs.read(path)) == object_id
        except OSError:
            return False

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
