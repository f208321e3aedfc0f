"""The journal's file format and its replay: records as checksummed JSON
lines, the fsync policies, the model that folds events into a state, and
what a replay found (the rules are in the package's docstring)."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Generic, TypeAlias, TypeVar, cast, final

from dispatchtx.errors import DispatchError
from dispatchtx.fs import FS

JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None

S = TypeVar("S")
J = TypeVar("J", bound=JSONValue)

_HEX_DIGITS: Final = frozenset(b"0123456789abcdef")
_CHECKSUM_WIDTH: Final = 8


class FsyncPolicy(Enum):
    """When an appended record becomes durable (survives a power loss).

    A process kill loses nothing under any policy: each record is one write.
    """

    #: `append` fsyncs before it returns: nothing is lost on power loss.
    EVERY = "every"
    #: Records appended inside a `Journal.group()` block are fsynced once, when
    #: the block ends; the caller acts on none of them before that (the last
    #: unsynced group can be lost on power loss, but nothing acted on). A
    #: record appended outside a block is a group of one, fsynced at once.
    GROUP = "group"
    #: No fsync but compaction's and explicit `Journal.sync()` calls: an
    #: unsynced suffix can be lost on power loss.
    NONE = "none"


@final
@dataclass(frozen=True, slots=True)
class Event:
    """One journal record: what happened (`kind`) and its JSON data."""

    kind: str
    payload: JSONValue = None


@final
@dataclass(frozen=True, slots=True)
class JournalModel(Generic[S]):
    """How a journal folds its events into a state of type `S`.

    `reduce` must be pure (return a new state, never mutate the old one): the
    journal computes the next state before it writes, and keeps the old one if
    the write fails. `snapshot` and `restore` convert the state to and from
    JSON for compaction; `restore(snapshot(s))` must equal `s`.
    """

    initial: S
    reduce: Callable[[S, Event], S]
    snapshot: Callable[[S], JSONValue]
    restore: Callable[[JSONValue], S]


def _same(value: J) -> J:
    return value


def json_model(initial: J, reduce: Callable[[J, Event], J]) -> JournalModel[J]:
    """A model whose state is itself JSON (dicts, lists, numbers, strings)."""
    # restore trusts the snapshot to have the state's shape: compaction wrote it.
    return JournalModel(initial, reduce, _same, cast("Callable[[JSONValue], J]", _same))


@final
@dataclass(frozen=True, slots=True)
class DroppedTail:
    """The end of a journal file that replay did not apply, and why."""

    line: int  # 1-based line number where the dropped part starts
    offset: int  # byte offset of that line: the file is cut back to here
    size: int  # bytes dropped
    reason: str


@final
@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What replaying a journal file found."""

    path: str
    records_applied: int  # events folded in, not counting a snapshot
    from_snapshot: bool  # whether line 1 was a compaction snapshot
    last_seq: int  # sequence number of the last good line (0: empty file)
    dropped: DroppedTail | None  # None: the file ended on a good record

    def __str__(self) -> str:
        start = "a snapshot and " if self.from_snapshot else ""
        text = f"{self.path}: replayed {start}{self.records_applied} record(s)"
        if self.dropped is not None:
            text += (
                f"; dropped {self.dropped.size} byte(s) from line {self.dropped.line}: "
                f"{self.dropped.reason}"
            )
        return text


class JournalCorrupt(DispatchError):
    """A journal file that cannot be replayed: a bad record with valid ones
    after it under `FsyncPolicy.EVERY`, or a record the model rejects."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"journal {path}, line {line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


# ---------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------


# Made once (json.dumps with options builds one per call). allow_nan=False:
# NaN is not JSON, and NaN != NaN would break replay checks.
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encode_line(record: dict[str, JSONValue]) -> bytes:
    body = _ENCODER.encode(record).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(body), body)


@final
@dataclass(frozen=True, slots=True)
class _Record:
    seq: int
    event: Event | None  # None: a snapshot
    snapshot: JSONValue


def _decode_line(line: bytes) -> _Record | str:
    """The record on one line (without its newline), or why it is bad."""
    if not line.strip(b"\0"):
        return "zeroed bytes" if line else "empty line"
    checksum = line[:_CHECKSUM_WIDTH]
    if (
        len(line) <= _CHECKSUM_WIDTH + 1
        or line[_CHECKSUM_WIDTH : _CHECKSUM_WIDTH + 1] != b" "
        or not _HEX_DIGITS.issuperset(checksum)
    ):
        return "malformed record: no checksum field"
    body = line[_CHECKSUM_WIDTH + 1 :]
    if zlib.crc32(body) != int(checksum, 16):
        return "checksum mismatch"
    try:
        data: object = json.loads(body)
    except ValueError:
        return "malformed record: not JSON"
    except RecursionError:  # a checksum is no MAC: a planted line may nest deep
        return "malformed record: nested too deep"
    if not isinstance(data, dict):
        return "malformed record: not a JSON object"
    seq = data.get("seq")
    if type(seq) is not int or seq < 1:
        return "malformed record: no valid sequence number"
    keys = data.keys()
    if keys == {"seq", "kind", "payload"} and isinstance(data["kind"], str):
        return _Record(seq, Event(data["kind"], data["payload"]), None)
    if keys == {"seq", "snapshot"}:
        return _Record(seq, None, data["snapshot"])
    return "malformed record: neither an event nor a snapshot"


def encode_event(seq: int, event: Event) -> tuple[bytes, Event]:
    """The line for `event`, and the event as replay will decode it."""
    line = _encode_line({"seq": seq, "kind": event.kind, "payload": event.payload})
    # What replay's json.loads makes of the payload (tuples become lists,
    # say); the line's own checks are for lines read back, not just made.
    payload: JSONValue = json.loads(line[_CHECKSUM_WIDTH + 1 : -1])["payload"]
    return line, Event(event.kind, payload)


def encode_snapshot(seq: int, snapshot: JSONValue) -> tuple[bytes, JSONValue]:
    """The line for a snapshot, and the snapshot as replay will decode it."""
    line = _encode_line({"seq": seq, "snapshot": snapshot})
    decoded = _decode_line(line[:-1])
    assert isinstance(decoded, _Record) and decoded.event is None
    return line, decoded.snapshot


# ---------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Replayed(Generic[S]):
    state: S
    report: ReplayReport
    good_size: int  # bytes up to the end of the last good record


def _out_of_place(record: _Record, line_number: int, last_seq: int) -> str | None:
    """Why a well-formed record cannot stand on this line, if it cannot."""
    if record.event is None:
        return None if line_number == 1 else "snapshot record after line 1"
    expected = last_seq + 1
    if record.seq != expected:
        return f"sequence number {record.seq}, expected {expected}"
    return None


def _fold(record: _Record, state: S, model: JournalModel[S], path: str, line_number: int) -> S:
    try:
        if record.event is None:
            return model.restore(record.snapshot)
        return model.reduce(state, record.event)
    except Exception as error:
        what = "snapshot" if record.event is None else f"event {record.event.kind!r}"
        raise JournalCorrupt(
            path, line_number, f"the model rejects the {what}: {error!r}"
        ) from error


# How a snapshot line begins (an event's second key is "kind"): enough of it
# survives one flipped bit elsewhere in the line to tell what the line was.
_SNAPSHOT_START = re.compile(rb'[0-9a-f]{8} \{"seq":[0-9]+,"snapshot":')


def replay_bytes(
    data: bytes, path: str, model: JournalModel[S], policy: FsyncPolicy
) -> Replayed[S]:
    state = model.initial
    last_seq = 0
    applied = 0
    from_snapshot = False
    offset = 0
    *lines, partial = data.split(b"\n")
    for index, line in enumerate(lines):
        line_number = index + 1
        record = _decode_line(line)
        reason = record if isinstance(record, str) else _out_of_place(record, line_number, last_seq)
        if reason is None:
            assert isinstance(record, _Record)
            state = _fold(record, state, model, path, line_number)
            last_seq = record.seq
            if record.event is None:
                from_snapshot = True
            else:
                applied += 1
            offset += len(line) + 1
            continue
        # Replay stops at the first bad record.
        valid_after = sum(
            1 for later in lines[index + 1 :] if isinstance(_decode_line(later), _Record)
        )
        if valid_after and policy is FsyncPolicy.EVERY:
            # Each record was durable before the next was written: no crash
            # leaves a hole, so this is damage, not a lost tail.
            raise JournalCorrupt(
                path, line_number, f"{reason}, followed by {valid_after} valid record(s)"
            )
        if valid_after and line_number == 1 and _SNAPSHOT_START.match(line):
            # A compaction's snapshot is fsynced before its rename makes it
            # line 1, under every policy: damaged while records follow, it is
            # corruption to report, never an unsynced tail to cut (that would
            # drop every synced record with it).
            raise JournalCorrupt(
                path,
                line_number,
                f"{reason}: a damaged snapshot, followed by {valid_after} valid record(s)",
            )
        if valid_after:
            # Without an fsync per record, a power loss may keep a later page
            # and lose an earlier one: everything from the hole on was unsynced.
            reason += f" (an unsynced suffix: {valid_after} valid record(s) after it dropped too)"
        dropped = DroppedTail(line_number, offset, len(data) - offset, reason)
        break
    else:
        dropped = None
        if partial:
            reason = "zeroed tail" if not partial.strip(b"\0") else "torn record: no end of line"
            dropped = DroppedTail(len(lines) + 1, offset, len(partial), reason)
    report = ReplayReport(path, applied, from_snapshot, last_seq, dropped)
    return Replayed(state, report, offset)


def replay(
    fs: FS, path: str, model: JournalModel[S], *, policy: FsyncPolicy = FsyncPolicy.EVERY
) -> tuple[S, ReplayReport]:
    """Fold the journal at `path` into a state without changing the file (an
    absent file is an empty journal); `Journal` cuts a dropped tail off too.

    `policy` is the one the file was written under: it tells a lost unsynced
    suffix from damage. Raises `JournalCorrupt`.
    """
    try:
        data = fs.read(path)
    except FileNotFoundError:
        data = b""
    replayed = replay_bytes(data, path, model, policy)
    return replayed.state, replayed.report


# ---------------------------------------------------------------------------
# The journal
# ---------------------------------------------------------------------------
