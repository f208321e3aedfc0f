"""What the simulator checks between a coordinator's journal and its memory
(docs/design.md, "Local work journal": append durably, then change memory).

The journal's promise is that a replay of its file gives what memory holds,
so that a restarted coordinator acts on what this one acted on. The check
replays the file, read with no disk faults, into a fresh dispatch log and
compares its snapshot with the live one's. It runs whenever an incarnation
ends (before a kill or a power loss touches the disk) and every so many
steps, and finds:

- memory changed before its record was appended (a failed append then
  leaves memory ahead of the file);
- a failed append whose torn bytes stay in the file (the next record then
  follows garbage, and replay stops there or refuses the file);
- a handle still appending to the inode a compaction renamed away (the
  records after it are in no file).

The journal knows when memory is ahead on purpose (a release applied with
its record failed, or a poisoned file): the next write rewrites the file
from memory, so the check skips it until then.
"""

from __future__ import annotations

from dispatchtx import DispatchTables
from dispatchtx.coordinator import Coordinator
from dispatchtx.fs import SimulatedFS
from dispatchtx.journal import JournalCorrupt
from dispatchtx.resources import DispatchLog
from dispatchtx.resources.journaling import replay_adapters

__all__ = ["journal_differs"]


def journal_differs(coordinator: Coordinator, disk: SimulatedFS) -> str | None:
    """How a replay of `coordinator`'s journal file differs from its live
    dispatch log, or None (also when the journal says it is out of step)."""
    journal, live = coordinator.journal, coordinator.dispatch_log
    if journal is None or live is None or journal.needs_rewrite:
        return None
    replayed = DispatchLog(DispatchTables(1), name=live.name)
    fault, disk.fault = disk.fault, None  # read what is there, with no new faults
    try:
        replay_adapters(disk, journal.path, [replayed], policy=journal.policy)
    except (JournalCorrupt, OSError) as error:
        return f"its journal does not replay: {error}"
    finally:
        disk.fault = fault
    want, got = live.snapshot(), replayed.snapshot()
    if want == got:
        return None
    keys = sorted(key for key in set(want) | set(got) if want.get(key) != got.get(key))
    detail = "; ".join(f"{key}: memory {want.get(key)!r}, file {got.get(key)!r}" for key in keys)
    return f"its journal replays to another state than memory ({detail[:300]})"
