"""The store's error family: `StoreError` is the root of every error the
work store and the object store raise on purpose; `InvalidId` and its kinds
name an id refused before it touches a path; `OutcomeUnknown` is a
publication whose outcome a retry must settle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatchtx.errors import DispatchError

if TYPE_CHECKING:
    from dispatchtx.store.records import Owner

__all__ = [
    "CorruptObject",
    "CorruptRecord",
    "InvalidCoordinatorId",
    "InvalidId",
    "InvalidObjectId",
    "InvalidToken",
    "InvalidWorkId",
    "NotOwner",
    "NotRegistered",
    "ObjectNotFound",
    "OutcomeUnknown",
    "StoreError",
    "StoreIOError",
]


# ---------------------------------------------------------------------------
# The work store's errors
# ---------------------------------------------------------------------------


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


class InvalidWorkId(InvalidId):
    """A work id that is not a str, is empty, is not UTF-8 encodable or is
    absurdly long. Nothing was done."""

    def __init__(self, work_id: object, reason: str) -> None:
        super().__init__(f"invalid work id {_shown(work_id)}: {reason}")
        self.work_id = work_id
        self.reason = reason


class InvalidCoordinatorId(InvalidId):
    """A coordinator id that is not 1 to 64 of [A-Za-z0-9_-]."""

    def __init__(self, coordinator_id: object) -> None:
        super().__init__(
            f"invalid coordinator id {_shown(coordinator_id)}: "
            "expected a str of 1 to 64 characters from [A-Za-z0-9_-]"
        )
        self.coordinator_id = coordinator_id


class InvalidToken(StoreError, ValueError):
    """A token that names no claim of the item (never issued, or not an int)."""

    def __init__(self, work_id: str, token: object, reason: str) -> None:
        super().__init__(f"invalid token {token!r} for work id {_shown(work_id)}: {reason}")
        self.work_id = work_id
        self.token = token


class NotOwner(StoreError):
    """`abandon` of a claim that another coordinator holds (a caller's bug:
    a coordinator only ever abandons its own claims or its predecessors')."""

    def __init__(self, work_id: str, token: int, holder: Owner, caller: Owner) -> None:
        super().__init__(
            f"claim {token} of work id {_shown(work_id)} belongs to {holder}, not to {caller}"
        )
        self.work_id = work_id
        self.token = token
        self.holder = holder
        self.caller = caller


class NotRegistered(StoreError):
    """A change attempted before `register` gave this store an owner."""

    def __init__(self, action: str) -> None:
        super().__init__(f"{action}: this WorkStore has no owner yet; call register() first")


class CorruptRecord(StoreError):
    """A slot or incarnation record that is torn, fails its checksum, cannot
    be parsed, belongs to another item or slot (foreign), or breaks the chain's
    rules. The store never guesses past one."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt record {path}: {reason}")
        self.path = path
        self.reason = reason


class OutcomeUnknown(StoreError):
    """A publication whose outcome could not be learned after every retry
    (the link or the directory fsync kept failing).

    The store remembers the attempt: a later call on the same item (the same
    method again, or `read`) finds the record if it was published and treats
    it as this store's own. Until then, act as if it may have happened.
    """

    def __init__(self, action: str, path: str, error: OSError | None) -> None:
        super().__init__(f"{action}: outcome of publishing {path} unknown after retries ({error})")
        self.action = action
        self.path = path
        self.errno = None if error is None else error.errno


def _shown(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} chars)"
