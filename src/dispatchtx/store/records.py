"""What the store's slots hold and how a chain may grow: work ids and their
keys, `Record` (a change, its token, its owner, a nonce, a commit's result)
in checksummed canonical JSON, the chain grammar (which change may follow
which), and the typed answers of the store (`ItemState`, `ClaimResult` and
the outcome enums)."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from enum import Enum
from json.encoder import encode_basestring_ascii
from typing import Final

from dispatchtx.store.errors import (
    CorruptRecord,
    InvalidCoordinatorId,
    InvalidObjectId,
    InvalidWorkId,
    _shown,
)
from dispatchtx.store.objects import validate_object_id

__all__ = [
    "AbandonOutcome",
    "Change",
    "ClaimOutcome",
    "ClaimResult",
    "CommitOutcome",
    "CompleteOutcome",
    "DEFAULT_MAX_WORK_ID_BYTES",
    "MAX_INCARNATION",
    "MAX_WORK_ID_BYTES_LIMIT",
    "DEFAULT_QUARANTINE_AFTER",
    "INLINE_RESULT_BYTES",
    "ItemState",
    "ItemStatus",
    "Owner",
    "Record",
    "RollForward",
    "SetAside",
    "Survey",
    "item_key",
    "validate_coordinator_id",
]


#: Work ids longer than this (UTF-8 bytes) are refused, not hashed.
DEFAULT_MAX_WORK_ID_BYTES: Final = 64 * 1024
#: A committed result up to this many bytes is written into its commit
#: record (one file, one fsync) instead of an object of its own.
INLINE_RESULT_BYTES: Final = 64 * 1024
#: Lost claims (abandoned or taken over) after which an item is quarantined.
DEFAULT_QUARANTINE_AFTER: Final = 3

_COORDINATOR_ID: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NONCE: Final = re.compile(r"[0-9a-f]{32}")
_KEY: Final = re.compile(r"[0-9a-f]{64}")
_SLOT_PREFIX: Final = "s."
_HEARTBEAT_PREFIX: Final = "hb."
# What follows `<key>.` in a slot's name.
_SLOT_NAME: Final = re.compile(r"s\.[0-9]{10}")
_RECORD_MAGIC: Final = b"dtx-record-1"
_RECORD_VERSION: Final = 1
# A record holds at most one work id; JSON escaping can grow it sixfold.
_MAX_RECORD_BYTES: Final = 8 * 1024 * 1024
#: The largest `max_work_id_bytes` a store accepts: a work id of that many
#: bytes, each escaped to six (`\u0001`), still fits a record with the rest of
#: its fields, so every id a store accepts stays readable.
MAX_WORK_ID_BYTES_LIMIT: Final = (_MAX_RECORD_BYTES - 4096) // 6
#: Incarnations of one coordinator id: dispatch ids are `n << 40` onwards and
#: must stay within 63 bits.
MAX_INCARNATION: Final = 2**23 - 1
# How many times one call re-decides after another publisher changed the item
# under it; each round sees a longer chain, so this only bounds a pathological
# stream of changes by others.
_MAX_DECISION_ROUNDS: Final = 16


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
    # COMMIT: the result itself, when it is small enough to ride in the
    # record (`INLINE_RESULT_BYTES`); else it is the object `object_id`.
    result: bytes | None = None

    def encode(self) -> bytes:
        """The record's file line: the same bytes as `fields()` through the
        sorted-keys JSON encoder, built by formatting (the record is written
        once per publication: no dict, no encoder walk)."""
        owner = self.owner
        if (
            type(self.slot) is not int
            or type(self.token) is not int
            or type(owner.incarnation) is not int
        ):
            return _encode_fields(self.fields())  # an odd value: the encoder decides
        change = self.change
        head = (
            f'{{"change":"{change.value}","incarnation":{owner.incarnation},'
            f'"item":{_quoted(self.item)},"nonce":{_quoted(self.nonce)},'
        )
        tail = f'"slot":{self.slot},"token":{self.token},'
        owned = f'"owner":{_quoted(owner.coordinator)},'
        if change is Change.COMMIT:
            if type(self.object_id) is not str or type(self.size) is not int:
                return _encode_fields(self.fields())
            result = (
                ""
                if self.result is None
                else f'"result":"{base64.b64encode(self.result).decode("ascii")}",'
            )
            body = (
                f'{head}"object":{_quoted(self.object_id)},{owned}{result}'
                f'"size":{self.size},{tail}"v":{_RECORD_VERSION}}}'
            )
        elif change is Change.ITEM:
            if type(self.work_id) is not str:
                return _encode_fields(self.fields())
            body = f'{head}{owned}{tail}"v":{_RECORD_VERSION},"work_id":{_quoted(self.work_id)}}}'
        elif change is Change.ABANDON and self.unsent:
            body = f'{head}{owned}{tail}"unsent":true,"v":{_RECORD_VERSION}}}'
        else:
            body = f'{head}{owned}{tail}"v":{_RECORD_VERSION}}}'
        return _framed(body.encode("ascii"))

    def fields(self) -> dict[str, object]:
        """The record's fields as its file's JSON body holds them."""
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
            if self.result is not None:
                fields["result"] = base64.b64encode(self.result).decode("ascii")
        if self.change is Change.ITEM:
            fields["work_id"] = self.work_id
        if self.change is Change.ABANDON and self.unsent:
            fields["unsent"] = True
        return fields

    @staticmethod
    def decode(data: bytes, path: str, key: str, slot: int) -> Record:
        """Parse and check a slot read from `path`, which must be slot `slot`
        of item `key`: anything else is corrupt or foreign. A file that a
        group linked into several slots holds one record per line: the one
        of this item and slot is read."""
        if data.count(b"\n") > 1:
            data = _line_of(data, path, key, slot)
        fields = _decode_fields(data, path)
        reader = _FieldReader(fields, path)
        change_name = reader.text("change")
        try:
            change = Change(change_name)
        except ValueError:
            raise CorruptRecord(path, f"unknown change {change_name!r}") from None
        extra = {"object", "size"} if change is Change.COMMIT else set()
        inline = change is Change.COMMIT and "result" in fields
        if inline:
            extra = {"object", "size", "result"}
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
            result=reader.inline_result() if inline else None,
        )
        if record.result is not None and len(record.result) != record.size:
            raise CorruptRecord(path, "its inline result does not have the size it states")
        if (slot == 0) != (change is Change.ITEM):
            raise CorruptRecord(path, f"a {change.value} record cannot be slot {slot}")
        if change is Change.ITEM and record.token != 0:
            raise CorruptRecord(path, "the first record carries no token")
        return record


def _line_of(data: bytes, path: str, key: str, slot: int) -> bytes:
    """The line of a group's file that holds slot `slot` of item `key`.
    The body's keys are sorted and JSON escapes every quote inside a string,
    so `"item":"<key>"` and `"slot":<n>,` can only be those fields."""
    if len(data) > _MAX_RECORD_BYTES:
        raise CorruptRecord(path, f"{len(data)} bytes, larger than any group of records")
    item = f'"item":"{key}"'.encode("ascii")
    numbered = f'"slot":{slot},'.encode("ascii")
    for line in data.split(b"\n"):
        if item in line and numbered in line:
            return line + b"\n"
    raise CorruptRecord(path, f"foreign record: its file holds no slot {slot} of this item")


# Made once: `json.dumps` with options builds an encoder per call.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


# JSON's own quoting (C): a string quoted as the encoder above quotes it.
_quoted: Final = encode_basestring_ascii


def _encode_fields(fields: dict[str, object]) -> bytes:
    return _framed(_ENCODER.encode(fields).encode("ascii"))


def _framed(body: bytes) -> bytes:
    checksum = hashlib.sha256(body).hexdigest().encode("ascii")
    return b"%s %s %s\n" % (_RECORD_MAGIC, checksum, body)


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
    except RecursionError:  # a checksum is no MAC: anyone may plant a deep one
        raise CorruptRecord(path, "unparsable body (nested too deep)") from None
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

    def inline_result(self) -> bytes:
        value = self.text("result")
        try:
            return base64.b64decode(value, validate=True)
        except (ValueError, UnicodeEncodeError):  # binascii.Error is a ValueError
            raise self._bad("result", "base64") from None

    def object_id(self, name: str) -> str:
        value = self.text(name)
        try:
            return validate_object_id(value)
        except InvalidObjectId:
            raise self._bad(name, "an object id") from None


class _Nonces:
    """A publication's nonce: 16 random hex digits drawn once per process
    (again in a forked child, which must never repeat its parent's) and a
    16-digit counter. Unique without a draw from the OS per record."""

    def __init__(self) -> None:
        self._redraw()
        if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
            os.register_at_fork(after_in_child=self._redraw)

    def _redraw(self) -> None:
        self.prefix = secrets.token_hex(8)
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):016x}"


_new_nonce: Final = _Nonces()


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
    key: str  # sha256 of the work id: the start of its slots' names
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
class SetAside:
    """An item a roll-forward look could not read (a corrupt record, a
    rotted or missing result object): reported and left alone, so that it
    cannot hold up the other items. `work_id` is None when its first record
    is what cannot be read."""

    key: str
    work_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Survey:
    """Every item of the store: the states that could be read, and the keys
    (with the reason) of those that could not.

    `look_again` holds the keys that may be an item not readable yet: a
    directory whose first record was not seen (not landed yet, or a cached
    negative look-up of it on a network filesystem), or one whose read failed
    with an I/O error (also in `unreadable`). A directory whose creator died
    before its first record landed stays there for good."""

    states: list[ItemState]
    unreadable: dict[str, str]
    look_again: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Published:
    ours: bool  # this store published the record now in the slot
    record: Record  # what the slot holds
