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

from dispatchtx.journal.compaction import DEFAULT_COMPACT_EVERY, CompactionSchedule
from dispatchtx.journal.log import Journal
from dispatchtx.journal.records import (
    DroppedTail,
    Event,
    FsyncPolicy,
    JournalCorrupt,
    JournalModel,
    JSONValue,
    ReplayReport,
    json_model,
    replay,
)

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
