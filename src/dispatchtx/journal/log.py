"""`Journal`: an open journal file, its replayed state, appends under an
fsync policy, groups and compaction (the rules are in the package's
docstring)."""

from __future__ import annotations

import errno
import os.path
from collections.abc import Iterable
from contextlib import suppress
from types import TracebackType
from typing import Final, Generic, TypeVar, final

from dispatchtx.fs import FS, AppendHandle
from dispatchtx.journal.compaction import DEFAULT_COMPACT_EVERY, CompactionSchedule
from dispatchtx.journal.records import (
    Event,
    FsyncPolicy,
    JournalModel,
    ReplayReport,
    encode_event,
    encode_snapshot,
    replay_bytes,
)

S = TypeVar("S")

#: Suffix of the journal's private directory for compaction temp files: every
#: file in it is a leftover of an interrupted compaction of this journal, so
#: opening the journal may remove them all.
_TEMP_DIRECTORY_SUFFIX: Final = ".tmp"


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
        replayed = replay_bytes(data, path, model, policy)
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
        line, decoded = encode_event(seq, event)
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
        line, snapshot = encode_snapshot(seq, self._model.snapshot(self._state))
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
