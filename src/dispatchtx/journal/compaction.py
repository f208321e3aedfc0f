"""When a journal compacts on its own, and what its last automatic
compaction did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, final

#: Records appended between two automatic compactions, by default.
DEFAULT_COMPACT_EVERY: Final = 10_000


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
