"""The shared exact-work store: one `link()`-published slot chain per item.

Several coordinators (processes, possibly on several hosts over a shared
filesystem) claim exact work items from one directory (DESIGN.md §4). Every
change of an item's state is a compare-and-swap: the publisher writes the
record to a fsynced temp file and `link()`s it to the NEXT slot name of the
item's chain; whoever's link succeeds made the change, everyone else gets
EEXIST, reads the slot and learns what happened. Nothing is ever decided from
a read that says "absent" (a network filesystem may cache negative look-ups).

Layout under the store directory `root`::

    items/<sha256(work id)>/s.0000000000   the work id (checked when an item is loaded)
    items/<key>/s.0000000001, ...          immutable slot records, one per change
    items/<key>/hb.<token>                 the holder's heartbeat counter (advisory;
                                           written before the claim is linked)
    committing/<key>                       "maybe committing": a second link to slot 0,
                                           made before a commit slot is linked and
                                           removed once the item is final; roll-forward
                                           lists these, not items/
    incarnations/<coordinator>.<n>         one file per coordinator start
    objects/<aa>/<sha256>                  committed results (`dispatchtx.objects`)
    tmp/.tmp.<random>                      temp files before they are linked

A slot record carries the change, the token (the slot number of the claim it
is about: the fencing token), the owner (coordinator id + incarnation), a
random nonce, and for a commit the result's object id and size. Records are
canonical JSON behind a sha256 checksum; a torn, corrupt or foreign record
(one written for another item or slot) raises `CorruptRecord`.

Expiry is judged by the CLAIMER's monotonic clock watching the holder's
heartbeat counter stand still for `ttl + margin`, never by comparing wall
clocks: a `WorkStore` keeps, per claim it has looked at, the last counter it
saw and when. A committing item is never claimable: its stored result is
rolled forward (`roll_forward_candidates`) and any coordinator may `complete`
it.

A `WorkStore` is one incarnation of one coordinator (see `register`). It is
not thread-safe: one coordinator thread owns it. It reaches the disk only
through `FS` and time only through `Clock` (or the `now` it is passed); the
only other use of time is the pause between retries of an ambiguous
publication (`retry_pause`, `time.sleep` unless given).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Final, TypeVar

from dispatchtx.fs import FS, Clock
from dispatchtx.objects import (
    CorruptObject,
    InvalidId,
    InvalidObjectId,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    StoreIOError,
    validate_object_id,
)

__all__ = [
    "DEFAULT_MAX_WORK_ID_BYTES",
    "DEFAULT_QUARANTINE_AFTER",
    "AbandonOutcome",
    "Change",
    "ClaimOutcome",
    "ClaimResult",
    "CommitOutcome",
    "CompleteOutcome",
    "CorruptObject",
    "CorruptRecord",
    "InvalidCoordinatorId",
    "InvalidId",
    "InvalidObjectId",
    "InvalidToken",
    "InvalidWorkId",
    "ItemState",
    "ItemStatus",
    "NotOwner",
    "NotRegistered",
    "ObjectNotFound",
    "OutcomeUnknown",
    "Owner",
    "Record",
    "RollForward",
    "StoreError",
    "StoreIOError",
    "WorkStore",
    "item_key",
    "validate_coordinator_id",
]

#: Work ids longer than this (UTF-8 bytes) are refused, not hashed.
DEFAULT_MAX_WORK_ID_BYTES: Final = 64 * 1024
#: Lost claims (abandoned or taken over) after which an item is quarantined.
DEFAULT_QUARANTINE_AFTER: Final = 3

_COORDINATOR_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NONCE: Final = re.compile(r"[0-9a-f]{32}")
_KEY: Final = re.compile(r"[0-9a-f]{64}")
_SLOT_PREFIX: Final = "s."
_HEARTBEAT_PREFIX: Final = "hb."
_RECORD_MAGIC: Final = b"dtx-record-1"
_RECORD_VERSION: Final = 1
# A record holds at most one work id; JSON escaping can grow it sixfold.
_MAX_RECORD_BYTES: Final = 8 * 1024 * 1024
# How many times one call re-decides after another publisher changed the item
# under it; each round sees a longer chain, so this only bounds a pathological
# stream of changes by others.
_MAX_DECISION_ROUNDS: Final = 16


# ---------------------------------------------------------------------------
# Errors (the family's root, StoreError, lives in dispatchtx.objects)
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Ids
# ---------------------------------------------------------------------------


def validate_coordinator_id(coordinator_id: object) -> str:
    """Return `coordinator_id` if it is 1 to 64 of [A-Za-z0-9_-], else raise
    `InvalidCoordinatorId`."""
    if not isinstance(coordinator_id, str) or _COORDINATOR_ID.fullmatch(coordinator_id) is None:
        raise InvalidCoordinatorId(coordinator_id)
    return coordinator_id


def item_key(work_id: object, max_bytes: int = DEFAULT_MAX_WORK_ID_BYTES) -> str:
    """The directory name of a work item: sha256 of its UTF-8 bytes, in hex.

    A work id never becomes a path itself; a non-str, empty, unencodable or
    longer-than-`max_bytes` one raises `InvalidWorkId`.
    """
    if not isinstance(work_id, str):
        raise InvalidWorkId(work_id, f"must be a str, not {type(work_id).__name__}")
    if not work_id:
        raise InvalidWorkId(work_id, "must not be empty")
    if len(work_id) > max_bytes:  # cheap bound before encoding a huge string
        raise InvalidWorkId(work_id, f"longer than {max_bytes} bytes")
    try:
        encoded = work_id.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidWorkId(work_id, f"not encodable as UTF-8 ({error.reason})") from error
    if len(encoded) > max_bytes:
        raise InvalidWorkId(work_id, f"{len(encoded)} UTF-8 bytes, more than {max_bytes}")
    return hashlib.sha256(encoded).hexdigest()


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------


class Change(Enum):
    """What a slot record does to its item."""

    ITEM = "item"  # slot 0: names the work id
    CLAIM = "claim"
    ABANDON = "abandon"
    COMMIT = "commit"
    DONE = "done"
    QUARANTINE = "quarantine"


@dataclass(frozen=True, slots=True, order=True)
class Owner:
    """One start of one coordinator."""

    coordinator: str
    incarnation: int

    def __str__(self) -> str:
        return f"{self.coordinator}#{self.incarnation}"

    def is_predecessor_of(self, other: Owner) -> bool:
        """An earlier start of the same coordinator (its claims may be taken at once)."""
        return self.coordinator == other.coordinator and self.incarnation < other.incarnation


@dataclass(frozen=True, slots=True)
class Record:
    """One immutable slot of an item's chain."""

    item: str
    slot: int
    change: Change
    token: int  # the claim's slot number; 0 for ITEM and QUARANTINE
    owner: Owner
    nonce: str
    object_id: str | None = None  # COMMIT: the result
    size: int | None = None  # COMMIT: the result's length
    work_id: str | None = None  # ITEM: the work id
    # ABANDON: the claim's dispatch was never sent (a before-send undo); such
    # an abandon is no lost result and does not count towards quarantine.
    unsent: bool = False

    def encode(self) -> bytes:
        fields: dict[str, object] = {
            "v": _RECORD_VERSION,
            "item": self.item,
            "slot": self.slot,
            "change": self.change.value,
            "token": self.token,
            "owner": self.owner.coordinator,
            "incarnation": self.owner.incarnation,
            "nonce": self.nonce,
        }
        if self.change is Change.COMMIT:
            fields["object"] = self.object_id
            fields["size"] = self.size
        if self.change is Change.ITEM:
            fields["work_id"] = self.work_id
        if self.change is Change.ABANDON and self.unsent:
            fields["unsent"] = True
        return _encode_fields(fields)

    @staticmethod
    def decode(data: bytes, path: str, key: str, slot: int) -> Record:
        """Parse and check a slot read from `path`, which must be slot `slot`
        of item `key`: anything else is corrupt or foreign."""
        fields = _decode_fields(data, path)
        reader = _FieldReader(fields, path)
        change_name = reader.text("change")
        try:
            change = Change(change_name)
        except ValueError:
            raise CorruptRecord(path, f"unknown change {change_name!r}") from None
        extra = {"object", "size"} if change is Change.COMMIT else set()
        if change is Change.ITEM:
            extra = {"work_id"}
        unsent = change is Change.ABANDON and "unsent" in fields
        if unsent:
            if fields["unsent"] is not True:
                raise CorruptRecord(path, f"'unsent' must be true, not {fields['unsent']!r}")
            extra = {"unsent"}
        reader.expect_keys(
            {"v", "item", "slot", "change", "token", "owner", "incarnation", "nonce"} | extra
        )
        reader.version()
        item = reader.text("item")
        if item != key:
            raise CorruptRecord(path, f"foreign record: it belongs to item {_shown(item)}")
        found_slot = reader.integer("slot", 0)
        if found_slot != slot:
            raise CorruptRecord(path, f"foreign record: it was written as slot {found_slot}")
        record = Record(
            item=item,
            slot=slot,
            change=change,
            token=reader.integer("token", 0),
            owner=reader.owner(),
            nonce=reader.nonce(),
            object_id=reader.object_id("object") if change is Change.COMMIT else None,
            size=reader.integer("size", 0) if change is Change.COMMIT else None,
            work_id=reader.text("work_id") if change is Change.ITEM else None,
            unsent=unsent,
        )
        if (slot == 0) != (change is Change.ITEM):
            raise CorruptRecord(path, f"a {change.value} record cannot be slot {slot}")
        if change is Change.ITEM and record.token != 0:
            raise CorruptRecord(path, "the first record carries no token")
        return record


# Made once: `json.dumps` with options builds an encoder per call.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def _encode_fields(fields: dict[str, object]) -> bytes:
    body = _ENCODER.encode(fields).encode("ascii")
    checksum = hashlib.sha256(body).hexdigest().encode("ascii")
    return b" ".join((_RECORD_MAGIC, checksum, body)) + b"\n"


def _decode_fields(data: bytes, path: str) -> dict[str, object]:
    if len(data) > _MAX_RECORD_BYTES:
        raise CorruptRecord(path, f"{len(data)} bytes, larger than any record")
    if not data.endswith(b"\n"):
        raise CorruptRecord(path, "torn or truncated (no final newline)")
    parts = data[:-1].split(b" ", 2)
    if len(parts) != 3 or parts[0] != _RECORD_MAGIC:
        raise CorruptRecord(path, "not a dispatchtx record")
    magic, checksum, body = parts
    del magic
    if hashlib.sha256(body).hexdigest().encode("ascii") != checksum:
        raise CorruptRecord(path, "checksum mismatch")
    try:
        fields = json.loads(body)
    except ValueError as error:  # includes UnicodeDecodeError
        raise CorruptRecord(path, f"unparsable body ({error})") from None
    if not isinstance(fields, dict):
        raise CorruptRecord(path, "body is not an object")
    return fields


class _FieldReader:
    """Typed, strict access to a decoded record's fields."""

    __slots__ = ("_fields", "_path")

    def __init__(self, fields: dict[str, object], path: str) -> None:
        self._fields = fields
        self._path = path

    def _bad(self, name: str, expected: str) -> CorruptRecord:
        return CorruptRecord(
            self._path, f"field {name!r} is {_shown(self._fields.get(name))}, expected {expected}"
        )

    def expect_keys(self, keys: set[str]) -> None:
        if set(self._fields) != keys:
            raise CorruptRecord(
                self._path, f"fields {sorted(self._fields)}, expected {sorted(keys)}"
            )

    def version(self) -> None:
        if self.integer("v", 0) != _RECORD_VERSION:
            raise CorruptRecord(self._path, f"record version {self._fields['v']!r} unknown")

    def text(self, name: str) -> str:
        value = self._fields.get(name)
        if not isinstance(value, str):
            raise self._bad(name, "a string")
        return value

    def integer(self, name: str, minimum: int) -> int:
        value = self._fields.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self._bad(name, f"an integer >= {minimum}")
        return value

    def number(self, name: str) -> float:
        value = self._fields.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._bad(name, "a number")
        return float(value)

    def owner(self) -> Owner:
        coordinator = self.text("owner")
        if _COORDINATOR_ID.fullmatch(coordinator) is None:
            raise self._bad("owner", "a coordinator id")
        return Owner(coordinator, self.integer("incarnation", 1))

    def nonce(self) -> str:
        nonce = self.text("nonce")
        if _NONCE.fullmatch(nonce) is None:
            raise self._bad("nonce", "32 lowercase hex digits")
        return nonce

    def object_id(self, name: str) -> str:
        value = self.text(name)
        try:
            return validate_object_id(value)
        except InvalidObjectId:
            raise self._bad(name, "an object id") from None


def _new_nonce() -> str:
    return secrets.token_hex(16)


def _check_transition(chain: list[Record], record: Record, path: str) -> None:
    """The chain's grammar: reject a slot that no correct publisher writes."""
    head = chain[-1] if chain else None
    head_change = None if head is None else head.change
    change = record.change
    ok: bool
    if change is Change.CLAIM:
        ok = head_change in (None, Change.ABANDON, Change.CLAIM) and record.token == record.slot
    elif change is Change.QUARANTINE:
        ok = head_change in (None, Change.ABANDON, Change.CLAIM) and record.token == 0
    elif change in (Change.ABANDON, Change.COMMIT):
        ok = head is not None and head_change is Change.CLAIM and record.token == head.token
    elif change is Change.DONE:
        ok = head is not None and head_change is Change.COMMIT and record.token == head.token
    else:
        ok = False
    if not ok:
        after = "an empty chain" if head is None else f"{head_change} of token {head.token}"
        raise CorruptRecord(path, f"{change.value} of token {record.token} cannot follow {after}")


def _lost_claims(chain: list[Record]) -> int:
    """Claims that ended without a commit (abandoned after a send, taken
    over or quarantined): counted from the chain, so every coordinator
    agrees. A claim abandoned because its dispatch was never sent lost no
    result: it does not count."""
    return sum(
        1
        for record, after in itertools.pairwise(chain)
        if record.change is Change.CLAIM
        and after.change is not Change.COMMIT
        and not (after.change is Change.ABANDON and after.unsent)
    )


# ---------------------------------------------------------------------------
# Public results
# ---------------------------------------------------------------------------


class ItemStatus(Enum):
    """An item's state, from its head slot."""

    FREE = "free"  # no slot yet
    CLAIMED = "claimed"
    ABANDONED = "abandoned"
    COMMITTING = "committing"
    DONE = "done"
    QUARANTINED = "quarantined"


_STATUS_OF: Final = {
    Change.CLAIM: ItemStatus.CLAIMED,
    Change.ABANDON: ItemStatus.ABANDONED,
    Change.COMMIT: ItemStatus.COMMITTING,
    Change.DONE: ItemStatus.DONE,
    Change.QUARANTINE: ItemStatus.QUARANTINED,
}


@dataclass(frozen=True, slots=True)
class ItemState:
    """What the chain says about one item."""

    work_id: str
    key: str  # sha256 of the work id: the item's directory name
    status: ItemStatus
    head_slot: int  # 0 when FREE
    token: int | None  # the claim the head is about (CLAIMED, ABANDONED, COMMITTING, DONE)
    owner: Owner | None  # that claim's owner
    object_id: str | None  # the committed result (COMMITTING, DONE)
    result_size: int | None
    lost_claims: int  # claims abandoned or taken over so far


class ClaimOutcome(Enum):
    CLAIMED = "claimed"  # this call published the claim (or resolved an earlier ambiguous one)
    ALREADY_HELD = "already held"  # this incarnation already holds the head claim
    BUSY = "busy"  # a live claim by another (its heartbeat not yet seen stalled)
    LOST_RACE = "lost race"  # another publisher's link won the slot this call tried
    COMMITTING = "committing"  # never claimable: to be rolled forward
    DONE = "done"
    QUARANTINED = "quarantined"  # never claimable again (see `quarantined_now`)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    outcome: ClaimOutcome
    token: int | None  # set for CLAIMED and ALREADY_HELD
    lost_claims: int
    quarantined_now: bool = False  # this call published the quarantine: report it


class AbandonOutcome(Enum):
    ABANDONED = "abandoned"  # the claim ended (by this call or an earlier one)
    TAKEN_OVER = "taken over"  # another claim (or a quarantine) replaced it: no effect
    ALREADY_COMMITTING = "already committing"  # the token committed: roll forward, never discard
    ALREADY_DONE = "already done"  # the token committed and completed


class CommitOutcome(Enum):
    COMMITTED = "committed"  # the commit slot holds our record: the result WILL be committed
    FENCED_OUT = "fenced out"  # the token is not the head claim's (or not ours)
    DUPLICATE = "duplicate"  # this token already committed a result: this one is dropped


class CompleteOutcome(Enum):
    COMPLETED = "completed"  # this call published `done`
    ALREADY_DONE = "already done"  # `done` for this token was there: success too
    FENCED_OUT = "fenced out"  # the token has no commit to complete


@dataclass(frozen=True, slots=True)
class RollForward:
    """A committing item whose owner stalled (or is an earlier incarnation of
    this coordinator): rerun triage on `result`, then `complete(work_id, token)`."""

    state: ItemState
    result: bytes

    @property
    def work_id(self) -> str:
        return self.state.work_id

    @property
    def token(self) -> int:
        assert self.state.token is not None
        return self.state.token


@dataclass(frozen=True, slots=True)
class _Published:
    ours: bool  # this store published the record now in the slot
    record: Record  # what the slot holds


_Held = TypeVar("_Held")


# ---------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------


class WorkStore:
    """One coordinator incarnation's handle on the shared exact-work store.

    `ttl` is how long a claim lives without a heartbeat; `margin` (default
    `ttl / 4`) is added before another coordinator may take it, to cover
    heartbeat latency and clock-rate differences. `quarantine_after` lost
    claims quarantine an item. An ambiguous publication (EIO on `link`, a
    failing directory fsync) is retried `publish_attempts` times with
    `retry_pause(seconds)` between attempts before `OutcomeUnknown` is raised.
    """

    def __init__(
        self,
        fs: FS,
        root: str,
        clock: Clock,
        *,
        ttl: float,
        margin: float | None = None,
        quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
        max_work_id_bytes: int = DEFAULT_MAX_WORK_ID_BYTES,
        publish_attempts: int = 20,
        retry_pause: Callable[[float], None] = time.sleep,
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, not {ttl!r}")
        margin = ttl / 4 if margin is None else margin
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, not {margin!r}")
        if quarantine_after < 1:
            raise ValueError(f"quarantine_after must be >= 1, not {quarantine_after!r}")
        if max_work_id_bytes < 1:
            raise ValueError(f"max_work_id_bytes must be >= 1, not {max_work_id_bytes!r}")
        if publish_attempts < 1:
            raise ValueError(f"publish_attempts must be >= 1, not {publish_attempts!r}")
        self._fs = fs
        self._root = root
        self._clock = clock
        self._ttl = float(ttl)
        self._margin = float(margin)
        self._quarantine_after = quarantine_after
        self._max_work_id_bytes = max_work_id_bytes
        self._attempts = publish_attempts
        self._pause = retry_pause
        self._items = os.path.join(root, "items")
        self._incarnations = os.path.join(root, "incarnations")
        self._tmp = os.path.join(root, "tmp")
        self._committing = os.path.join(root, "committing")
        self.objects: Final = ObjectStore(fs, root)
        self._owner: Owner | None = None
        self._session = secrets.token_hex(8)  # tells this store's heartbeats from a restart's
        # Slots are immutable once linked: cache each item's chain (index i = slot i + 1).
        self._chains: dict[str, list[Record]] = {}
        self._work_ids: dict[str, str] = {}  # key -> work id verified against slot 0
        self._created: set[str] = set()
        # Nonces of publications whose outcome this store has not learned yet.
        self._pending: set[str] = set()
        # Inside `batch()`: directory -> nonces linked there, not yet durable.
        self._deferred: dict[str, list[str]] | None = None
        # Those of `_pending` that are linked, ours, and waiting only for the
        # batch's fsyncs (a subset of `_pending`).
        self._in_batch: set[str] = set()
        # directory -> nonces linked there whose batch fsync failed: the next
        # successful fsync of that directory settles them all.
        self._unsynced: dict[str, set[str]] = {}
        # Claimer's watch, one per item: key -> (token, heartbeat seen, monotonic
        # time it was first seen). Watching another token replaces it.
        self._watch: dict[str, tuple[int, object, float]] = {}
        self._beats: dict[tuple[str, int], int] = {}

    # -- configuration -------------------------------------------------------

    @property
    def root(self) -> str:
        return self._root

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def margin(self) -> float:
        return self._margin

    @property
    def quarantine_after(self) -> int:
        return self._quarantine_after

    @property
    def owner(self) -> Owner | None:
        """This store's coordinator and incarnation, once registered."""
        return self._owner

    # -- incarnations --------------------------------------------------------

    def register(self, coordinator_id: str) -> int:
        """Register one start of `coordinator_id`: publish the next free
        `incarnations/<coordinator>.<n>` by `link()` and return `n` (1, 2, ...).

        The store then acts as that owner. `n` is unique among every start of
        the coordinator ever registered in this directory, so it can seed
        dispatch ids; a later incarnation may take its predecessors' claims at
        once.
        """
        if self._owner is not None:
            raise StoreError(f"this WorkStore is already registered as {self._owner}")
        coordinator_id = validate_coordinator_id(coordinator_id)
        self._ensure_dir(self._incarnations)
        try:
            names = self._fs.listdir(self._incarnations)
        except OSError as error:
            raise StoreIOError("listing incarnations", self._incarnations, error) from error
        # The listing is only a hint for where to start: a stale one costs an EEXIST.
        incarnation = 1 + max(
            (
                int(suffix)
                for prefix, _, suffix in (name.rpartition(".") for name in names)
                if prefix == coordinator_id and suffix.isdigit() and suffix.isascii()
            ),
            default=0,
        )
        while True:
            path = os.path.join(self._incarnations, f"{coordinator_id}.{incarnation}")
            nonce = _new_nonce()
            owner = Owner(coordinator_id, incarnation)
            data = _encode_fields(
                {
                    "v": _RECORD_VERSION,
                    "change": "incarnation",
                    "owner": coordinator_id,
                    "incarnation": incarnation,
                    "nonce": nonce,
                    "wall": self._clock.wall(),  # for people reading the directory only
                }
            )
            ours, _ = self._link_publish(
                f"register {owner}",
                path,
                self._incarnations,
                data,
                nonce,
                functools.partial(self._read_incarnation, path, owner),
            )
            if ours:
                self._owner = owner
                return incarnation
            incarnation += 1

    def incarnations(self, coordinator_id: str) -> list[int]:
        """The incarnations of `coordinator_id` registered so far (a listing:
        a hint, possibly stale on a network filesystem)."""
        coordinator_id = validate_coordinator_id(coordinator_id)
        try:
            names = self._fs.listdir(self._incarnations)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreIOError("listing incarnations", self._incarnations, error) from error
        found = []
        for name in names:
            prefix, _, suffix = name.rpartition(".")
            if prefix == coordinator_id and suffix.isdigit() and suffix.isascii():
                found.append(int(suffix))
        return sorted(found)

    def _read_incarnation(self, path: str, owner: Owner) -> str:
        fields = _decode_fields(self._fs.read(path), path)
        reader = _FieldReader(fields, path)
        reader.expect_keys({"v", "change", "owner", "incarnation", "nonce", "wall"})
        reader.version()
        reader.number("wall")
        if reader.text("change") != "incarnation" or reader.owner() != owner:
            raise CorruptRecord(path, f"foreign record: not the registration of {owner}")
        return reader.nonce()

    # -- group commit -----------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: inside the block, a publication's directory fsync is
        put off to the block's end, where each directory touched is fsynced
        once (on ext4 the first fsync commits the journal for all of them).

        Until the block ends, what was published inside is decided (the
        links were made) but NOT durable: act on none of it (send no claimed
        work, triage no commit) before the block has ended without error. If
        a fsync keeps failing, the block raises `OutcomeUnknown` and those
        publications stay pending: calling the operation again settles each
        one. A block ended by a BaseException (a kill) fsyncs nothing.
        Blocks do not nest."""
        if self._deferred is not None:
            raise RuntimeError("store batches do not nest")
        deferred: dict[str, list[str]] = {}
        self._deferred = deferred
        try:
            yield
        except Exception:
            self._deferred = None
            with contextlib.suppress(StoreError):  # the block's own error wins
                self._sync_deferred(deferred)
            raise
        except BaseException:
            self._deferred = None
            self._in_batch.clear()  # not fsynced: their outcomes are unknown
            raise
        self._deferred = None
        self._sync_deferred(deferred)

    def _sync_deferred(self, deferred: dict[str, list[str]]) -> None:
        # Whatever is not fsynced now stays pending: an outcome unknown.
        self._in_batch.clear()
        failed: tuple[str, OSError] | None = None
        for directory, nonces in deferred.items():
            error = self._fsync_dir_retried(directory)
            if error is None:
                self._pending.difference_update(nonces)
                continue
            self._unsynced.setdefault(directory, set()).update(nonces)
            if failed is None:
                failed = (directory, error)
        if failed is not None:
            raise OutcomeUnknown("batch", failed[0], failed[1])

    def _synced(self, directory: str) -> None:
        """`directory` was fsynced: what a failed batch linked there is durable."""
        if self._unsynced:
            self._pending.difference_update(self._unsynced.pop(directory, ()))

    def _fsync_dir_retried(self, directory: str) -> OSError | None:
        """fsync `directory`, retried; None once it succeeded, else the last error."""
        last_error: OSError | None = None
        for attempt in range(self._attempts):
            if attempt:
                self._pause(min(0.001 * 2 ** (attempt - 1), 0.05))
            try:
                self._fs.fsync_dir(directory)
            except OSError as error:
                last_error = error
                continue
            self._synced(directory)
            return None
        return last_error

    # -- claims ----------------------------------------------------------------

    def claim(self, work_id: str, now: float | None = None) -> int | None:
        """Claim `work_id`; return the fencing token, or None if it is not
        claimable now (see `try_claim` for why)."""
        result = self.try_claim(work_id, now)
        return result.token if result.outcome is ClaimOutcome.CLAIMED else None

    def try_claim(self, work_id: str, now: float | None = None) -> ClaimResult:
        """Claim `work_id` if its head slot is free, abandoned, a claim whose
        heartbeat THIS store has seen stand still for `ttl + margin` on its own
        monotonic clock (`now`, default `clock.monotonic()`), or a claim of an
        earlier incarnation of this coordinator.

        The first look at a claim starts the watch, so taking it over needs two
        calls at least `ttl + margin` apart. Committing and done items are
        never claimable. An item whose lost claims reach `quarantine_after` is
        quarantined instead of claimed (`quarantined_now`), for good.
        """
        owner = self._require_owner("claim")
        key = self._key(work_id)
        now = self._now(now)
        chain = self._load(key, work_id, create=True)
        lost_race = False
        for _ in range(_MAX_DECISION_ROUNDS):
            lost = _lost_claims(chain)
            head = chain[-1] if chain else None
            if head is not None:
                if head.change is Change.COMMIT:
                    # Mark it again: a power loss can take a mark, and a stale
                    # "absent" can hide the commit from the full look.
                    with contextlib.suppress(StoreError):
                        self._mark_committing(key)
                    return ClaimResult(ClaimOutcome.COMMITTING, None, lost)
                if head.change is Change.DONE:
                    self._watch.pop(key, None)  # final: nothing left to watch
                    return ClaimResult(ClaimOutcome.DONE, None, lost)
                if head.change is Change.QUARANTINE:
                    self._watch.pop(key, None)
                    return ClaimResult(ClaimOutcome.QUARANTINED, None, lost)
                if head.change is Change.CLAIM:
                    if head.nonce in self._pending:
                        # Our earlier claim whose outcome was unknown: it won.
                        self._settle(key, head, "claim")
                        return ClaimResult(ClaimOutcome.CLAIMED, head.token, lost)
                    if head.owner == owner:
                        return ClaimResult(ClaimOutcome.ALREADY_HELD, head.token, lost)
                    if not head.owner.is_predecessor_of(owner) and not self._stalled(
                        key, head.token, now
                    ):
                        busy = ClaimOutcome.LOST_RACE if lost_race else ClaimOutcome.BUSY
                        return ClaimResult(busy, None, lost)
                    lost += 1  # taking it over ends that claim
            slot = len(chain) + 1
            if lost >= self._quarantine_after:
                record = self._record(key, slot, Change.QUARANTINE, 0, owner)
                published = self._publish(key, record, "quarantine")
                if published.ours and published.record.change is Change.QUARANTINE:
                    if head is not None and head.change is Change.CLAIM:
                        self._drop_heartbeat(key, head.token)  # the claim it ended
                    return ClaimResult(ClaimOutcome.QUARANTINED, None, lost, quarantined_now=True)
            else:
                # The counter file exists BEFORE the claim can be seen, so no
                # watcher ever caches a negative look-up of a live holder's
                # heartbeat (NFS). A loser's write only looks like one heartbeat.
                self._write_heartbeat(key, slot)
                record = self._record(key, slot, Change.CLAIM, slot, owner)
                published = self._publish(key, record, "claim")
                if published.ours and published.record.change is Change.CLAIM:
                    self._watch.pop(key, None)
                    if head is not None and head.change is Change.CLAIM:
                        self._drop_heartbeat(key, head.token)  # the claim taken over
                    return ClaimResult(ClaimOutcome.CLAIMED, slot, lost)
                self._beats.pop((key, slot), None)
            lost_race = True  # decide again from what won the slot, and what followed
            chain = self._chain(key)
        return ClaimResult(ClaimOutcome.LOST_RACE, None, _lost_claims(self._chain(key)))

    def heartbeat(self, work_id: str, token: int) -> bool:
        """Rewrite the heartbeat counter of our claim `token` (off the chain,
        advisory: it can never undo a claim). Also for COMMITTING items, until
        they are done, so that nobody rolls them forward meanwhile.

        Returns False, writing nothing, if `token` no longer holds the item
        (taken over, abandoned, done or quarantined) or is not this
        incarnation's.
        """
        owner = self._require_owner("heartbeat")
        key = self._key(work_id)
        chain = self._load(key, work_id, create=False)
        claim = self._claim_at(work_id, chain, token)
        if claim.owner != owner:
            return False
        committing = len(chain) == token + 1 and chain[token].change is Change.COMMIT
        if len(chain) != token and not committing:
            return False
        self._write_heartbeat(key, token)
        return True

    def _write_heartbeat(self, key: str, token: int) -> None:
        count = self._beats.get((key, token), -1) + 1
        self._beats[(key, token)] = count
        body = f"{token:010d} {count:016d} {self._session}".encode("ascii")
        data = body + b" " + hashlib.sha256(body).hexdigest()[:16].encode("ascii") + b"\n"
        path = self._heartbeat_path(key, token)
        try:
            # Fixed length: each write replaces the last. Not fsynced: the
            # counter is advisory, and readers see it without (the page cache
            # here; close-to-open on NFS). After a power loss its holder is
            # dead anyway, and a restarted incarnation takes its claims at once.
            self._fs.pwrite(path, 0, data, sync=False)
        except OSError as error:
            raise StoreIOError("writing a heartbeat", path, error) from error

    def _drop_heartbeat(self, key: str, token: int) -> None:
        """Remove the counter of a claim that ended (best effort: advisory)."""
        with contextlib.suppress(OSError):
            self._fs.unlink(self._heartbeat_path(key, token))

    def abandon(self, work_id: str, token: int, *, sent: bool = True) -> AbandonOutcome:
        """End our claim `token` without a result (the before-send undo with
        `sent=False`, or the discard of a lost or stale result: only those
        count towards quarantine). Safe when the claim was taken
        over meanwhile (`TAKEN_OVER`, no effect). A later incarnation of the
        same coordinator may abandon its predecessors' claims. Raises
        `NotOwner` for another coordinator's claim.
        """
        owner = self._require_owner("abandon")
        key = self._key(work_id)
        chain = self._load(key, work_id, create=False)
        claim = self._claim_at(work_id, chain, token)
        if not (claim.owner == owner or claim.owner.is_predecessor_of(owner)):
            raise NotOwner(work_id, token, claim.owner, owner)
        for _ in range(_MAX_DECISION_ROUNDS):
            if len(chain) == token:  # our claim is the head: end it
                record = self._record(key, token + 1, Change.ABANDON, token, owner)
                if not sent:
                    record = replace(record, unsent=True)
                published = self._publish(key, record, "abandon")
                if published.ours and published.record.change is Change.ABANDON:
                    self._beats.pop((key, token), None)
                    self._drop_heartbeat(key, token)
                    return AbandonOutcome.ABANDONED
                chain = self._chain(key)
                continue
            after = chain[token]
            if after.change is Change.ABANDON:
                return AbandonOutcome.ABANDONED
            if after.change is Change.COMMIT:
                if len(chain) > token + 1:
                    return AbandonOutcome.ALREADY_DONE
                return AbandonOutcome.ALREADY_COMMITTING
            return AbandonOutcome.TAKEN_OVER
        raise StoreError(f"abandon of {_shown(work_id)}: the chain kept changing")

    # -- the fence -------------------------------------------------------------

    def begin_commit(self, work_id: str, token: int, result: bytes) -> CommitOutcome:
        """The fence: commit `result` under claim `token` if that claim is still
        the item's head and this incarnation's.

        The result is stored as a content-addressed object FIRST, then the
        `commit` slot naming it is published: the commit record is the commit
        intent, and past it the item is only ever rolled forward. An ambiguous
        publication (EIO on link, a lost reply) is resolved by reading the slot
        back (our nonce there = committed), retried until known; if it never
        becomes known, `OutcomeUnknown` is raised and a later call resolves it.
        """
        owner = self._require_owner("begin_commit")
        if not isinstance(result, bytes):
            raise TypeError(f"result must be bytes, not {type(result).__name__}")
        key = self._key(work_id)
        chain = self._known_chain(key, work_id, upto=token if isinstance(token, int) else 0)
        claim = self._claim_at(work_id, chain, token)
        if claim.owner != owner:
            return CommitOutcome.FENCED_OUT
        settled = self._commit_settled(key, chain, token)
        if settled is not None:
            return settled
        object_id = self.objects.put(result)
        self._mark_committing(key)
        record = self._record(
            key, token + 1, Change.COMMIT, token, owner, object_id=object_id, size=len(result)
        )
        published = self._publish(key, record, "begin_commit")
        if published.ours and published.record.change is Change.COMMIT:
            return CommitOutcome.COMMITTED
        return self._commit_settled(key, self._chain(key), token) or CommitOutcome.FENCED_OUT

    def _commit_settled(self, key: str, chain: list[Record], token: int) -> CommitOutcome | None:
        """The fence's answer if the slot after claim `token` is taken, else None."""
        if len(chain) == token:
            return None
        after = chain[token]
        if after.change is not Change.COMMIT:
            return CommitOutcome.FENCED_OUT
        if after.nonce in self._pending:
            self._settle(key, after, "begin_commit")  # our earlier ambiguous commit
            return CommitOutcome.COMMITTED
        return CommitOutcome.DUPLICATE

    def complete(self, work_id: str, token: int) -> CompleteOutcome:
        """Publish `done` for the commit of claim `token` (after triage).
        Finding `done` for this token already there is success too, so ANY
        registered coordinator may complete a commit (roll-forward)."""
        owner = self._require_owner("complete")
        key = self._key(work_id)
        chain = self._known_chain(key, work_id, upto=token + 1 if isinstance(token, int) else 0)
        self._claim_at(work_id, chain, token)
        for _ in range(_MAX_DECISION_ROUNDS):
            if len(chain) <= token or chain[token].change is not Change.COMMIT:
                return CompleteOutcome.FENCED_OUT
            if len(chain) > token + 1:
                done = chain[token + 1]
                if done.nonce in self._pending:
                    self._settle(key, done, "complete")
                    return CompleteOutcome.COMPLETED
                return CompleteOutcome.ALREADY_DONE
            record = self._record(key, token + 2, Change.DONE, token, owner)
            published = self._publish(key, record, "complete")
            if published.ours and published.record.change is Change.DONE:
                self._beats.pop((key, token), None)
                self._watch.pop(key, None)
                self._drop_heartbeat(key, token)
                self._unmark_committing(key)
                return CompleteOutcome.COMPLETED
            chain = self._chain(key)
        raise StoreError(f"complete of {_shown(work_id)}: the chain kept changing")

    # -- reading -----------------------------------------------------------------

    def read(self, work_id: str) -> ItemState:
        """The item's state from its chain (FREE if it has no slot yet)."""
        key = self._key(work_id)
        chain = self._load(key, work_id, create=False)
        return self._state(key, work_id, chain)

    def items(self) -> list[ItemState]:
        """Every item in the store, in key order. A listing: an item created
        a moment ago may be missing on a network filesystem."""
        states = []
        for key in self._item_keys():
            work_id = self._work_id_of(key)
            if work_id is None:
                continue  # a directory whose first record never landed: nothing claimed
            states.append(self._state(key, work_id, self._load(key, work_id, create=False)))
        return states

    def items_by_status(self) -> dict[ItemStatus, list[ItemState]]:
        """`items()` grouped by status (every status is a key)."""
        grouped: dict[ItemStatus, list[ItemState]] = {status: [] for status in ItemStatus}
        for state in self.items():
            grouped[state.status].append(state)
        return grouped

    def committing_items(self) -> list[ItemState]:
        return [state for state in self.items() if state.status is ItemStatus.COMMITTING]

    def mark_committing_items(self) -> list[str]:
        """Read every item (O(items): once per coordinator start) and mark
        the COMMITTING ones "maybe committing" again, for the looks of
        `roll_forward_candidates`. An item whose records are corrupt is
        skipped, not fatal: its key is returned."""
        unreadable = []
        for key in self._item_keys():
            try:
                work_id = self._work_id_of(key)
                if work_id is None:
                    continue
                state = self._state(key, work_id, self._load(key, work_id, create=False))
            except CorruptRecord:
                unreadable.append(key)
                continue
            if state.status is ItemStatus.COMMITTING:
                self._mark_committing(key)
        return unreadable

    def _marked_committing(self) -> list[ItemState]:
        """The COMMITTING items among the marked ones; marks of final items
        (done, quarantined) are removed on the way. A mark on an item that is
        not final stays: its holder may be about to link the commit."""
        try:
            names = self._fs.listdir(self._committing)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreIOError("listing committing marks", self._committing, error) from error
        states = []
        for key in names:
            if _KEY.fullmatch(key) is None:
                continue  # not ours (a temp of an editor, say): never a path we built
            work_id = self._work_id_of(key)
            if work_id is None:
                continue
            state = self._state(key, work_id, self._load(key, work_id, create=False))
            if state.status is ItemStatus.COMMITTING:
                states.append(state)
            elif state.status in (ItemStatus.DONE, ItemStatus.QUARANTINED):
                self._unmark_committing(key)
        return states

    def _mark_committing(self, key: str) -> None:
        """Mark the item "maybe committing" before its commit slot is linked."""
        self._ensure_dir(self._committing)
        path = f"{self._committing}/{key}"
        try:
            # One call, no fsync (the full look covers a power loss): a second
            # name for the item's first record, which is immutable.
            self._fs.link(self._slot_path(key, 0), path)
        except FileExistsError:
            pass  # marked already (an earlier attempt, or an earlier claim's)
        except OSError as error:
            raise StoreIOError("marking an item committing", path, error) from error

    def _unmark_committing(self, key: str) -> None:
        with contextlib.suppress(OSError):  # a mark left behind costs a look, no more
            self._fs.unlink(f"{self._committing}/{key}")

    def quarantined(self) -> list[ItemState]:
        return [state for state in self.items() if state.status is ItemStatus.QUARANTINED]

    def stored_result(self, work_id: str) -> bytes:
        """The committed result of a COMMITTING or DONE item, verified against
        its digest and size."""
        state = self.read(work_id)
        if state.object_id is None:
            raise StoreError(
                f"work id {_shown(work_id)} has no commit (it is {state.status.value})"
            )
        return self._result_of(state)

    def roll_forward_candidates(
        self, now: float | None = None, *, full: bool = False
    ) -> list[RollForward]:
        """COMMITTING items that this coordinator should roll forward now, with
        their stored results: those of an earlier incarnation of this
        coordinator at once, and those whose owner's heartbeat this store has
        seen stand still for `ttl + margin` (the first look starts the watch).
        Rerun triage on each result, then `complete(work_id, token)`.

        It looks only at items marked "maybe committing" (O(those), not
        O(items)): a commit slot is linked only after its mark exists, and a
        mark goes only once its item is final. A power loss can drop a mark
        whose commit survived (the mark's directory is not fsynced), so a
        coordinator's first look after its start is `full`: see
        `mark_committing_items`. A claim that finds an item COMMITTING marks
        it again too (a stale "absent" may have hidden that commit from the
        full look)."""
        now = self._now(now)
        candidates = []
        if full:
            self.mark_committing_items()
        for state in self._marked_committing():
            assert state.owner is not None and state.token is not None
            if state.owner == self._owner:
                continue  # ours: this incarnation is finishing it
            predecessor = self._owner is not None and state.owner.is_predecessor_of(self._owner)
            if predecessor or self._stalled(state.key, state.token, now):
                candidates.append(RollForward(state, self._result_of(state)))
        return candidates

    def _result_of(self, state: ItemState) -> bytes:
        assert state.object_id is not None
        content = self.objects.get(state.object_id)
        if len(content) != state.result_size:
            raise CorruptObject(
                state.object_id,
                self.objects.path_of(state.object_id),
                f"{len(content)} bytes, but its commit record says {state.result_size}",
            )
        return content

    def _state(self, key: str, work_id: str, chain: list[Record]) -> ItemState:
        lost = _lost_claims(chain)
        if not chain:
            return ItemState(work_id, key, ItemStatus.FREE, 0, None, None, None, None, lost)
        head = chain[-1]
        status = _STATUS_OF[head.change]
        if head.change is Change.QUARANTINE:
            return ItemState(work_id, key, status, head.slot, None, None, None, None, lost)
        claim = chain[head.token - 1]
        commit = chain[head.token] if head.change in (Change.COMMIT, Change.DONE) else None
        return ItemState(
            work_id,
            key,
            status,
            head.slot,
            head.token,
            claim.owner,
            None if commit is None else commit.object_id,
            None if commit is None else commit.size,
            lost,
        )

    # -- the chain -----------------------------------------------------------------

    def _load(self, key: str, work_id: str, *, create: bool) -> list[Record]:
        """The item's chain, after checking slot 0 names `work_id`. With
        `create`, slot 0 is published if missing (by link: first one wins)."""
        if key not in self._work_ids:
            path = self._slot_path(key, 0)
            first = self._read_first(key)
            if first is None and create:
                owner = self._require_owner("claim")
                self._ensure_dir(self._items)
                self._ensure_dir(self._item_dir(key))
                record = self._record(key, 0, Change.ITEM, 0, owner, work_id=work_id)
                published = self._publish(key, record, "create item")
                first = published.record
                if published.ours and first.work_id == work_id:
                    # Ours a moment ago: slot 1 can only be a racing claim,
                    # and our claim's link will meet it.
                    self._work_ids[key] = work_id
                    return self._chains.setdefault(key, [])
            if first is None and self._slot_exists(key, 1):
                # Slot 0 is durable before slot 1 is linked: an "absent" here is a
                # stale negative look-up, or the record really is missing.
                for attempt in range(1, self._attempts):
                    self._pause(min(0.001 * 2 ** (attempt - 1), 0.05))
                    first = self._read_first(key)
                    if first is not None:
                        break
                else:
                    raise CorruptRecord(path, "the item has slots but no first record")
            if first is None:
                return []  # nothing published for this item yet
            if first.work_id != work_id:
                raise CorruptRecord(
                    path,
                    f"foreign item: it names work id {_shown(first.work_id)}, "
                    f"not {_shown(work_id)}",
                )
            self._work_ids[key] = work_id
        return self._chain(key)

    def _known_chain(self, key: str, work_id: str, upto: int) -> list[Record]:
        """The cached chain as it is, without reading ahead, when it holds
        slots 1..`upto` and nothing of ours is pending; else `_load`. For a
        publisher of slot `upto + 1` only: a slot published meanwhile makes
        its `link` fail with EEXIST, and it reads on from there (the link
        decides, never the read)."""
        chain = self._chains.get(key)
        if (
            chain is not None
            and len(chain) == upto
            and not self._unsettled()
            and self._work_ids.get(key) == work_id
        ):
            return chain
        return self._load(key, work_id, create=False)

    def _unsettled(self) -> bool:
        """Whether a publication's outcome is unknown (not merely waiting for
        the directory fsync at the end of a batch)."""
        return len(self._pending) > len(self._in_batch)  # O(1): once per publication

    def _read_first(self, key: str) -> Record | None:
        try:
            return self._read_slot(key, 0)
        except FileNotFoundError:
            return None
        except OSError as error:
            path = self._slot_path(key, 0)
            raise StoreIOError("reading an item's first record", path, error) from error

    def _chain(self, key: str) -> list[Record]:
        """Read the slots after the cached ones until one is absent. A stale
        "absent" only makes the chain look short: the next publication then
        meets EEXIST and reads on."""
        chain = self._chains.setdefault(key, [])
        while True:
            slot = len(chain) + 1
            try:
                record = self._read_slot(key, slot)
            except FileNotFoundError:
                return chain
            except OSError as error:
                path = self._slot_path(key, slot)
                raise StoreIOError("reading a slot", path, error) from error
            self._append(key, chain, record)

    def _append(self, key: str, chain: list[Record], record: Record) -> None:
        _check_transition(chain, record, self._slot_path(key, record.slot))
        chain.append(record)

    def _read_slot(self, key: str, slot: int) -> Record:
        path = self._slot_path(key, slot)
        return Record.decode(self._fs.read(path), path, key, slot)

    def _slot_exists(self, key: str, slot: int) -> bool:
        path = self._slot_path(key, slot)
        try:
            return self._fs.exists(path)
        except OSError as error:
            raise StoreIOError("looking up a slot", path, error) from error

    def _claim_at(self, work_id: str, chain: list[Record], token: object) -> Record:
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidToken(work_id, token, "a token is an int")
        if not 1 <= token <= len(chain) or chain[token - 1].change is not Change.CLAIM:
            raise InvalidToken(work_id, token, "the item has no claim in that slot")
        return chain[token - 1]

    def _work_id_of(self, key: str) -> str | None:
        if key in self._work_ids:
            return self._work_ids[key]
        first = self._read_first(key)
        if first is None:
            return None
        work_id = first.work_id
        assert work_id is not None
        try:
            hashed = hashlib.sha256(work_id.encode("utf-8")).hexdigest()
        except UnicodeEncodeError:
            hashed = ""
        if hashed != key:
            raise CorruptRecord(self._slot_path(key, 0), "its work id does not hash to the item")
        self._work_ids[key] = work_id
        return work_id

    def _item_keys(self) -> Iterator[str]:
        try:
            names = self._fs.listdir(self._items)
        except FileNotFoundError:
            return
        except OSError as error:
            raise StoreIOError("listing items", self._items, error) from error
        yield from (name for name in names if _KEY.fullmatch(name) is not None)

    # -- publishing ------------------------------------------------------------------

    def _record(
        self,
        key: str,
        slot: int,
        change: Change,
        token: int,
        owner: Owner,
        *,
        object_id: str | None = None,
        size: int | None = None,
        work_id: str | None = None,
    ) -> Record:
        return Record(key, slot, change, token, owner, _new_nonce(), object_id, size, work_id)

    def _publish(self, key: str, record: Record, action: str) -> _Published:
        """Publish `record` as its slot; report whether we did and what the slot
        holds. The chain cache learns the slot either way."""
        path = self._slot_path(key, record.slot)
        ours, holder = self._link_publish(
            action,
            path,
            self._item_dir(key),
            record.encode(),
            record.nonce,
            lambda: self._read_slot(key, record.slot),
        )
        held = record if holder is None else holder
        if held.slot > 0:
            chain = self._chains.setdefault(key, [])
            if len(chain) + 1 == held.slot:
                self._append(key, chain, held)
        return _Published(ours, held)

    def _link_publish(
        self,
        action: str,
        path: str,
        directory: str,
        data: bytes,
        nonce: str,
        read_holder: Callable[[], _Held],
    ) -> tuple[bool, _Held | None]:
        """The compare-and-swap: write `data` to a fsynced temp, `link` it to
        `path`, fsync `directory`, unlink the temp.

        Returns (True, None) when our link made the slot and it is durable;
        (True, holder) when EEXIST showed a record of ours (a lost reply, or an
        earlier ambiguous attempt of this store); (False, holder) when another
        publisher won. `read_holder` reads the slot and must expose its nonce
        as `.nonce` or be the nonce itself.

        An EIO on link or fsync is ambiguous: we try the link again (EEXIST
        then tells whose it is) until the attempts run out, and then raise
        `OutcomeUnknown`, keeping the nonce pending so a later call can learn
        the outcome from the slot. Never decides from an "absent".
        """
        self._ensure_dir(self._tmp)
        temps: list[str] = []
        temp: str | None = None
        linked_once = False
        last_error: OSError | None = None
        self._pending.add(nonce)
        try:
            for attempt in range(self._attempts):
                if attempt:
                    self._pause(min(0.001 * 2 ** (attempt - 1), 0.05))
                try:
                    if temp is None:
                        temp = self._fs.write_temp(self._tmp, data)
                        temps.append(temp)
                    linked_once = True
                    holder: _Held | None = None
                    try:
                        self._fs.link(temp, path)
                    except FileExistsError:
                        # Read it back (a stale "absent" here raises and we retry).
                        holder = read_holder()
                        if _nonce_of(holder) not in self._pending:
                            self._pending.discard(nonce)
                            return False, holder
                    except FileNotFoundError as error:
                        temp = None  # our temp vanished (a stale handle): write it again
                        last_error = error
                        continue
                    # Ours (now or by an earlier attempt): make the slot durable.
                    # Only then is it settled: until the fsync succeeds, the nonce
                    # stays pending so that the next EEXIST still knows it as ours.
                    if self._deferred is not None:  # in a batch: fsynced at its end
                        nonces = self._deferred.setdefault(directory, [])
                        nonces.append(nonce)
                        self._in_batch.add(nonce)
                        if holder is not None:
                            nonces.append(_nonce_of(holder))
                            self._in_batch.add(_nonce_of(holder))
                        return True, holder
                    self._fs.fsync_dir(directory)
                    self._synced(directory)
                    self._pending.discard(nonce)
                    if holder is not None:
                        self._pending.discard(_nonce_of(holder))
                        self._in_batch.discard(_nonce_of(holder))
                    return True, holder
                except OSError as error:
                    if not linked_once:  # nothing published: a plain failure
                        self._pending.discard(nonce)
                        raise StoreIOError(
                            f"{action}: writing a temp record", self._tmp, error
                        ) from error
                    last_error = error
            raise OutcomeUnknown(action, path, last_error)
        finally:
            for leftover in temps:
                with contextlib.suppress(OSError):  # a leftover temp is garbage, never data
                    self._fs.unlink(leftover)

    def _settle(self, key: str, record: Record, action: str) -> None:
        """Our earlier ambiguous publication turned up: make it durable before
        anyone acts on it, then forget that it was pending."""
        error = self._fsync_dir_retried(self._item_dir(key))
        if error is not None:
            raise OutcomeUnknown(action, self._slot_path(key, record.slot), error)
        self._pending.discard(record.nonce)
        self._in_batch.discard(record.nonce)

    # -- expiry --------------------------------------------------------------------

    def _stalled(self, key: str, token: int, now: float) -> bool:
        """Whether this store has seen claim `token`'s heartbeat stand still for
        `ttl + margin` of its own monotonic time. Every call is an observation;
        a changed counter restarts the watch."""
        seen = self._read_heartbeat(key, token)
        watched = self._watch.get(key)
        if watched is None or watched[0] != token:
            self._watch[key] = (token, seen, now)
            return False
        if seen != watched[1]:
            if seen is None:
                # "Absent" may be a stale negative look-up (NFS, or a fault):
                # it is no sign of life, and it must not restart the watch,
                # or a dead holder's claim could never be taken over.
                pass
            elif watched[1] is None:
                # The counter shows up after an absent look-up: still the
                # first value seen, no beat.
                self._watch[key] = (token, seen, watched[2])
            else:
                self._watch[key] = (token, seen, now)  # it beat: alive
                return False
        return now - watched[2] >= self._ttl + self._margin

    def _read_heartbeat(self, key: str, token: int) -> object:
        """What the counter file shows: (session, count) when intact, the raw
        bytes when torn (still a sign of life if it changes), None if absent."""
        path = self._heartbeat_path(key, token)
        try:
            data = self._fs.read(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StoreIOError("reading a heartbeat", path, error) from error
        body, _, checksum = data.rstrip(b"\n").rpartition(b" ")
        parts = body.split(b" ")
        intact = hashlib.sha256(body).hexdigest()[:16].encode("ascii") == checksum
        if intact and len(parts) == 3 and parts[0] == f"{token:010d}".encode("ascii"):
            return (parts[2], parts[1])
        return data

    # -- paths and small helpers -----------------------------------------------------

    def _key(self, work_id: object) -> str:
        return item_key(work_id, self._max_work_id_bytes)

    def _now(self, now: float | None) -> float:
        return self._clock.monotonic() if now is None else now

    def _require_owner(self, action: str) -> Owner:
        if self._owner is None:
            raise NotRegistered(action)
        return self._owner

    # Plain concatenation: `_items` never ends in "/" and a key is 64 hex digits.
    def _item_dir(self, key: str) -> str:
        return f"{self._items}/{key}"

    def _slot_path(self, key: str, slot: int) -> str:
        return f"{self._items}/{key}/{_SLOT_PREFIX}{slot:010d}"

    def _heartbeat_path(self, key: str, token: int) -> str:
        return f"{self._items}/{key}/{_HEARTBEAT_PREFIX}{token:010d}"

    def _ensure_dir(self, directory: str) -> None:
        """mkdir once per store, made durable by an fsync of the parent."""
        for needed in (self._root, directory):
            if needed in self._created:
                continue
            try:
                self._fs.mkdir(needed)
                self._fs.fsync_dir(os.path.dirname(needed) or ".")
            except OSError as error:
                raise StoreIOError("creating a directory", needed, error) from error
            self._created.add(needed)


def _nonce_of(holder: object) -> str:
    if isinstance(holder, Record):
        return holder.nonce
    if isinstance(holder, str):
        return holder
    raise TypeError(f"cannot take a nonce from {type(holder).__name__}")
