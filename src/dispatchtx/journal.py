"""The local work journal (docs/design.md, "Local work journal").

A journal holds what only this coordinator knows (bandit state, algorithm
cursor, RNG and sequence number, proposal states, seed pairings, its own
dispatch history) as an append-only file of events, folded by a pure reducer
into an in-memory state. The shared store stays the authority on items.

The file is one record per line::

    <crc32 of the JSON, 8 hex digits> <JSON object>\\n

A JSON object is either an event, ``{"seq": n, "kind": k, "payload": p}``, or
a snapshot of the whole state, ``{"seq": n, "snapshot": s}``, which only
compaction writes and only as line 1. Sequence numbers go up by one from
line to line, also across compactions (a snapshot takes the next number).
They count lines of this file: they are no source of dispatch ids, which
come from the store's incarnation, since an unsynced suffix may be lost.

The rules, in the order the code follows them:

- One ``AppendHandle.append`` (one ``os.write``) per record: a process kill
  never loses a record that was written, whatever the fsync policy.
- Append durably, then change memory, then compact when due. A failed append
  leaves memory as it was and cuts the file back to its last good record.
  A failed fsync (or a cut-back that failed, or a kill mid-I/O) poisons the
  journal: the dirty pages may be gone, so the next write first rewrites the
  file from memory, as compaction does.
- `FsyncPolicy` says when records become durable (see there).
- Replay stops at the first bad record. A torn or zeroed tail is reported in
  the `ReplayReport` and cut off; a bad record followed by valid ones under
  `FsyncPolicy.EVERY` raises `JournalCorrupt` (file, line, reason).
- Compaction writes a snapshot with `FS.write_temp` (fsynced), renames it over
  the journal, fsyncs the directory and reopens the append handle: appends to
  the old inode would be lost.

Memory is exactly what a replay of the file gives (once a poisoned journal
has rewritten itself): every event is encoded first and the reducer is
applied to the decoded copy, and after a compaction the state is restored
from the decoded snapshot. A payload that
does not survive the JSON round trip unchanged (a tuple, say) is therefore
seen by the reducer the way replay will see it (a list).

Not thread-safe: one coordinator thread owns its journal.
"""

from __future__ import annotations

import errno
import json
import os.path
import re
import zlib
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Final, Generic, TypeAlias, TypeVar, cast, final

from dispatchtx.errors import DispatchError
from dispatchtx.fs import FS, AppendHandle

__all__ = [
    "DEFAULT_COMPACT_EVERY",
    "CompactionSchedule",
    "DroppedTail",
    "Event",
    "FsyncPolicy",
    "JSONValue",
    "Journal",
    "JournalCorrupt",
    "JournalModel",
    "ReplayReport",
    "json_model",
    "replay",
]

JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None

S = TypeVar("S")
J = TypeVar("J", bound=JSONValue)

#: Records appended between two automatic compactions, by default.
DEFAULT_COMPACT_EVERY: Final = 10_000

#: Suffix of the journal's private directory for compaction temp files: every
#: file in it is a leftover of an interrupted compaction of this journal, so
#: opening the journal may remove them all.
_TEMP_DIRECTORY_SUFFIX: Final = ".tmp"

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


def _encode_line(record: dict[str, JSONValue]) -> bytes:
    # allow_nan=False: NaN is not JSON, and NaN != NaN would break replay checks.
    body = json.dumps(record, separators=(",", ":"), allow_nan=False).encode("ascii")
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


def _encode_event(seq: int, event: Event) -> tuple[bytes, Event]:
    """The line for `event`, and the event as replay will decode it."""
    line = _encode_line({"seq": seq, "kind": event.kind, "payload": event.payload})
    decoded = _decode_line(line[:-1])
    assert isinstance(decoded, _Record) and decoded.event is not None
    return line, decoded.event


def _encode_snapshot(seq: int, snapshot: JSONValue) -> tuple[bytes, JSONValue]:
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
class _Replayed(Generic[S]):
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


def _replay_bytes(
    data: bytes, path: str, model: JournalModel[S], policy: FsyncPolicy
) -> _Replayed[S]:
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
    return _Replayed(state, report, offset)


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
    replayed = _replay_bytes(data, path, model, policy)
    return replayed.state, replayed.report


# ---------------------------------------------------------------------------
# The journal
# ---------------------------------------------------------------------------


@final
class CompactionSchedule:
    """When a journal compacts on its own, and what its last automatic
    compaction did: due once `every` records (None: never on its own) were
    counted since the last compaction.

    An automatic compaction that fails (an `OSError` from the disk, or any
    other `Exception`, such as a snapshot that does not encode) is reported,
    not raised: the record that made it due is already durable and applied,
    so the append that triggered it succeeded, and a caller that retried it
    would apply the event twice. It is retried after another `every`
    records: a full disk should not cost a snapshot per append. Every
    journal that compacts (`Journal`, `AdapterJournal`) keeps one.
    """

    __slots__ = ("_every", "_last_error", "_since")

    def __init__(self, every: int | None) -> None:
        if every is not None and every < 1:
            raise ValueError(f"compact_every must be at least 1 or None, not {every}")
        self._every = every
        self._since = 0
        self._last_error: Exception | None = None

    @property
    def every(self) -> int | None:
        return self._every

    @property
    def since(self) -> int:
        """Records counted since the last compaction."""
        return self._since

    @property
    def due(self) -> bool:
        return self._every is not None and self._since >= self._every

    @property
    def last_error(self) -> Exception | None:
        """Why the last automatic compaction failed, if it did."""
        return self._last_error

    def start(self, records: int) -> None:
        """Count `records` already in the file (those replayed on opening)."""
        self._since = records

    def count(self) -> None:
        """One more record appended."""
        self._since += 1

    def compacted(self) -> None:
        """The file was just rewritten as one snapshot."""
        self._since = 0

    def run_if_due(self, compact: Callable[[], None]) -> None:
        """Call `compact` if due; an `Exception` from it is kept in
        `last_error` and the count starts again (a BaseException, such as
        KeyboardInterrupt, goes up)."""
        if not self.due:
            return
        try:
            compact()
        except Exception as error:
            # A failure past the rename poisoned the journal, which rewrites
            # itself before the next append anyway; one before any I/O (the
            # snapshot) left the file as it was.
            self._last_error = error
            self._since = 0
        else:
            self._last_error = None


class Journal(Generic[S]):
    """An open journal: its replayed state, and appends that keep memory no
    further ahead than the fsync policy allows.

    Opening replays the file, removes leftover compaction temp files, cuts off
    a torn or zeroed tail and makes what was replayed durable (a killed
    predecessor may have left records only in the page cache; nobody may act
    on them before they are on disk). Raises `JournalCorrupt` or `OSError`.

    The journal owns `path` and the directory `path + ".tmp"` (compaction's
    temp files); the directory holding `path` must exist. Open it with the
    policy the file was written under: replay tells a lost unsynced suffix
    from damage by it. `compact_every` (None: never on its own) is how many
    records are appended between automatic compactions.
    """

    def __init__(
        self,
        fs: FS,
        path: str,
        model: JournalModel[S],
        *,
        policy: FsyncPolicy = FsyncPolicy.EVERY,
        compact_every: int | None = DEFAULT_COMPACT_EVERY,
    ) -> None:
        self._compaction = CompactionSchedule(compact_every)
        self._fs = fs
        self._path = path
        self._directory = os.path.dirname(path) or "."
        self._temp_directory = path + _TEMP_DIRECTORY_SUFFIX
        self._model = model
        self._policy = policy
        self._handle: AppendHandle | None = None
        self._closed = False
        self._group_depth = 0
        self._unsynced = 0  # records written since the last fsync
        # Poisoned: the file may not end where memory says, or its dirty
        # pages may be gone. Set before every risky I/O and cleared after it,
        # so that an error or a kill in between leaves it set.
        self._poisoned = False

        fs.mkdir(self._temp_directory)
        for name in fs.listdir(self._temp_directory):
            with suppress(FileNotFoundError):
                fs.unlink(os.path.join(self._temp_directory, name))
        try:
            data = fs.read(path)
        except FileNotFoundError:
            data = b""
        replayed = _replay_bytes(data, path, model, policy)
        self._state = replayed.state
        self._last_seq = replayed.report.last_seq
        self._size = replayed.good_size
        self._compaction.start(replayed.report.records_applied)
        self._replay_report = replayed.report

        handle = fs.open_append(path)
        try:
            if replayed.report.dropped is not None:
                handle.truncate(replayed.good_size)
            handle.fsync()
            # The file's own name may not be durable yet (just created, or
            # created by a predecessor killed before it fsynced the directory).
            fs.fsync_dir(self._directory)
        except Exception:
            with suppress(OSError):
                handle.close()
            raise
        self._handle = handle

    # -- looking ------------------------------------------------------------

    @property
    def state(self) -> S:
        """The current state: every record appended so far, folded in."""
        return self._state

    @property
    def path(self) -> str:
        return self._path

    @property
    def policy(self) -> FsyncPolicy:
        return self._policy

    @property
    def replay_report(self) -> ReplayReport:
        """What opening the journal replayed and dropped."""
        return self._replay_report

    @property
    def poisoned(self) -> bool:
        """Whether the next append (or `sync`) must first rewrite the file
        from memory: an fsync failed, or a failed append could not be cut back."""
        return self._poisoned

    @property
    def unsynced(self) -> int:
        """Records written but not yet fsynced (lost on a power loss)."""
        return self._unsynced

    @property
    def in_group(self) -> bool:
        return self._group_depth > 0

    @property
    def last_compaction_error(self) -> Exception | None:
        """Why the last automatic compaction failed, if it did. It does not
        fail the append that triggered it: that record is already applied."""
        return self._compaction.last_error

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"Journal({self._path!r}, policy={self._policy.value}, "
            f"unsynced={self._unsynced}, poisoned={self._poisoned})"
        )

    # -- appending ----------------------------------------------------------

    def append(self, event: Event) -> S:
        """Write `event` as one record, then fold it into the state; return
        the new state.

        When it returns, the record is durable under `EVERY` (and under
        `GROUP` outside a group block). If it raises (an `OSError` from the
        disk, or whatever encoding or the reducer raised), memory is as it
        was and the file is cut back to its last good record, or the journal
        is poisoned and rewrites itself before the next append.
        """
        self._require_open()
        if self._poisoned:
            self._rewrite()
        seq = self._last_seq + 1
        line, decoded = _encode_event(seq, event)
        # The reducer runs before any I/O: an event it rejects writes nothing.
        new_state = self._model.reduce(self._state, decoded)
        handle = self._live_handle()
        good_size = self._size
        self._write(handle, line, good_size)
        if self._fsyncs_each_record():
            self._fsync(handle, cut_back_to=good_size)
        else:
            self._unsynced += 1
        self._state = new_state
        self._last_seq = seq
        self._size = good_size + len(line)
        self._compaction.count()
        if self._group_depth == 0:
            self._compact_if_due()
        return self._state

    def group(self) -> _Group[S]:
        """A block whose records are fsynced together when it ends::

            with journal.group():
                journal.append(...)   # for several dispatches
                journal.append(...)
            # only now: send them

        Under `GROUP` the block's exit fsyncs once; under `EVERY` each append
        already did; under `NONE` nothing does. The exit fsyncs also when the
        block raised an `Exception` (the records appended describe what the
        caller did; its compensations append their own undo records), then
        re-raises. If that fsync fails, it raises `OSError` and the journal is
        poisoned: the records stay in memory and become durable at the next
        `sync()` or append (which rewrite the file from memory); act on none
        of them before. A `BaseException` that is not an `Exception` (a kill,
        KeyboardInterrupt) leaves the block with no I/O. Blocks nest: the
        outermost one fsyncs.
        """
        self._require_open()
        return _Group(self)

    def append_group(self, events: Iterable[Event]) -> S:
        """Append `events` in order as one group (see `group`); return the
        new state. If one fails, those before it stay appended."""
        with self.group():
            for event in events:
                self.append(event)
        return self._state

    def sync(self) -> None:
        """Make every record appended so far durable, whatever the policy;
        a poisoned journal is rewritten from memory. Raises `OSError`."""
        self._require_open()
        if self._poisoned:
            self._rewrite()
            return
        if self._unsynced:
            self._fsync(self._live_handle(), cut_back_to=None)
            self._unsynced = 0

    def compact(self) -> None:
        """Rewrite the journal now as one snapshot of the state (durable when
        this returns). Raises `OSError`; a failure at or after the rename
        poisons the journal, which then rewrites itself before the next append."""
        self._require_open()
        self._rewrite()

    def close(self) -> None:
        """Close the append handle. No fsync: records appended under `NONE`
        (or in an unfinished group) stay as durable as they were. Closing
        twice is a no-op."""
        if self._closed:
            return
        if self._group_depth:
            raise ValueError(f"journal {self._path}: close inside a group block")
        self._closed = True
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def __enter__(self) -> Journal[S]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # A kill or KeyboardInterrupt leaves with no more I/O, as a dead
        # process would; the handle goes with the process.
        if exc is None or isinstance(exc, Exception):
            self.close()

    # -- inside ---------------------------------------------------------------

    def _require_open(self) -> None:
        if self._closed:
            raise ValueError(f"journal {self._path} is closed")

    def _live_handle(self) -> AppendHandle:
        # Only a rewrite interrupted after the rename leaves no handle, and
        # that poisons the journal, so every caller rewrites first.
        assert self._handle is not None, "a poisoned journal must be rewritten first"
        return self._handle

    def _fsyncs_each_record(self) -> bool:
        if self._policy is FsyncPolicy.EVERY:
            return True
        return self._policy is FsyncPolicy.GROUP and self._group_depth == 0

    def _write(self, handle: AppendHandle, line: bytes, good_size: int) -> None:
        """One write of one record; on failure cut the file back to `good_size`."""
        self._poisoned = True
        try:
            written = handle.append(line)
        except OSError:
            self._cut_back(handle, good_size)
            raise
        if written != len(line):
            # A short write is how a regular file reports a full disk before
            # the next call raises ENOSPC; a second write would split the record.
            self._cut_back(handle, good_size)
            raise OSError(
                errno.ENOSPC,
                f"short write: {written} of {len(line)} bytes of a record",
                self._path,
            )
        self._poisoned = False

    def _cut_back(self, handle: AppendHandle, good_size: int) -> None:
        try:
            handle.truncate(good_size)
        except OSError:
            return  # still poisoned: the next append rewrites the file
        self._poisoned = False

    def _fsync(self, handle: AppendHandle, *, cut_back_to: int | None) -> None:
        """fsync, or poison the journal: a failed fsync may have dropped the
        dirty pages while leaving them readable, so only a rewrite is safe."""
        self._poisoned = True
        try:
            handle.fsync()
        except OSError:
            if cut_back_to is not None:
                # The record is not in memory: keep it out of the file as well,
                # in case we are killed before the rewrite.
                with suppress(OSError):
                    handle.truncate(cut_back_to)
            raise
        self._poisoned = False

    def _end_group(self, exc: BaseException | None) -> None:
        self._group_depth -= 1
        if self._group_depth or not (exc is None or isinstance(exc, Exception)):
            return
        if self._policy is FsyncPolicy.GROUP:
            self.sync()
        self._compact_if_due()

    def _compact_if_due(self) -> None:
        # The record that made it due is already durable and applied: a
        # failure is reported, not raised (see `CompactionSchedule`).
        self._compaction.run_if_due(self._rewrite)

    def _rewrite(self) -> None:
        """Replace the file by one snapshot of memory (compaction, and the
        cure of a poisoned journal)."""
        seq = self._last_seq + 1
        line, snapshot = _encode_snapshot(seq, self._model.snapshot(self._state))
        restored = self._model.restore(snapshot)  # memory = what replay of the new file gives
        try:
            temp = self._fs.write_temp(self._temp_directory, line)
        except OSError as error:
            # A full disk may leave an orphan holding a prefix: it names it.
            orphan = error.filename
            if isinstance(orphan, str) and orphan.startswith(self._temp_directory + "/"):
                with suppress(OSError):
                    self._fs.unlink(orphan)
            raise
        # From the rename on, the path may name the new file while the handle
        # still appends to the old inode (a failed rename may also have
        # happened): poisoned until the handle is reopened.
        self._poisoned = True
        try:
            self._fs.rename(temp, self._path)
        except OSError:
            with suppress(OSError):
                self._fs.unlink(temp)
            raise
        old_handle, self._handle = self._handle, None
        if old_handle is not None:
            with suppress(OSError):  # it names a dead inode: its errors do not matter
                old_handle.close()
        self._fs.fsync_dir(self._directory)
        self._handle = self._fs.open_append(self._path)
        self._state = restored
        self._last_seq = seq
        self._size = len(line)
        self._unsynced = 0
        self._compaction.compacted()
        self._poisoned = False


@final
class _Group(Generic[S]):
    """The context manager `Journal.group()` returns."""

    __slots__ = ("_journal",)

    def __init__(self, journal: Journal[S]) -> None:
        self._journal = journal

    def __enter__(self) -> Journal[S]:
        self._journal._require_open()
        self._journal._group_depth += 1
        return self._journal

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._journal._end_group(exc)
