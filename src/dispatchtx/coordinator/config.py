"""`CoordinatorConfig`: what a coordinator is told when it starts (its id,
dispatches per worker, deadlines and strikes, heartbeats, journal, group
commit). Every field is documented in docs/guide.md's choosing section."""

from __future__ import annotations

from dataclasses import dataclass

from dispatchtx.journal import FsyncPolicy

__all__ = ["DEFAULT_COMMIT_BATCH", "CoordinatorConfig"]


#: Up to this many claims, or results, form one group commit by default.
DEFAULT_COMMIT_BATCH = 64


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    coordinator_id: str
    max_in_flight: int = 1
    # A dispatch unanswered this long is discarded (its result may have been
    # lost); a worker that misses `strikes` deadlines in a row, answering
    # nothing since those dispatches were sent, is lost (a hung rank, a crashed
    # worker).
    deadline: float = 5.0
    strikes: int = 3
    poll_timeout: float = 0.001
    # How often leases are heartbeated and stalled peers looked for; None:
    # a third of the store's TTL.
    heartbeat_every: float | None = None
    # The local work journal (dispatch history, local triage marks); None:
    # no journal (tests of the runtime alone).
    journal_path: str | None = None
    journal_policy: FsyncPolicy = FsyncPolicy.EVERY
    # Heartbeat the leases from a thread too, so that a triage that runs
    # longer than the TTL cannot starve them (real clocks only: under the
    # simulator's virtual time, steps heartbeat).
    background_heartbeat: bool = False
    # Group commit: up to this many claims of one pass over the free workers,
    # and up to this many results of one poll (their commits, then their
    # dones), are each written as one file, fsynced once, linked into every
    # item's slot, with one fsync of slots/. 1: one at a time.
    commit_batch: int = DEFAULT_COMMIT_BATCH

    def __post_init__(self) -> None:
        if type(self.commit_batch) is not int or self.commit_batch < 1:
            raise ValueError(f"commit_batch must be an int >= 1, got {self.commit_batch!r}")
