"""The coordinator's recovery (docs/design.md, roll-forward): finishing the
items that a stalled owner, or an earlier incarnation of this coordinator,
left COMMITTING; closing the journal entries an earlier incarnation left
open; adopting the items only a peer killed for good knew. A part of
`Coordinator`, kept apart so that each module stays one part."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dispatchtx.coordinator.config import CoordinatorConfig
from dispatchtx.coordinator.stats import CoordinatorStats, Stat
from dispatchtx.coordinator.workload import Workload
from dispatchtx.resources.dispatch_log import DispatchLog
from dispatchtx.store import ItemStatus, StoreError, WorkStore
from dispatchtx.transport import Transport

__all__ = ["Committed", "Recovery"]

log = logging.getLogger("dispatchtx.coordinator")

# How many looks (over at least the store's ttl + margin) `adopt_orphans`
# waits for what a survey cannot read yet, and the most it makes (a clock
# that does not move).
ORPHAN_LOOKS = 8
MAX_ORPHAN_LOOKS = 1000
_THE_LISTING = ""  # stands for the store's item listing (never an item key)


@dataclass(frozen=True, slots=True)
class Committed:
    """A result past the fence, kept until its triage and `done`."""

    work_id: str
    token: int
    result: bytes


class Recovery:
    """Recovery of `Coordinator` (which provides what is declared here)."""

    config: CoordinatorConfig
    transport: Transport
    store: WorkStore
    workload: Workload
    stats: CoordinatorStats
    dispatch_log: DispatchLog | None
    _full_look_due: bool
    _orphan_wait: tuple[float, int] | None  # (first look, looks) of the wait going on
    _orphans_given_up: set[str]  # keys no longer waited for

    if TYPE_CHECKING:

        def _triage(self, committed: Committed, *, owner: bool) -> None: ...

    def _close_stale_entries(self) -> None:
        """Dispatches an earlier incarnation journaled and never ended: the
        store has settled (or will settle) their items; close them."""
        log_ = self.dispatch_log
        if log_ is None:
            return
        for entry in log_.stale():
            try:
                status = self.store.read(entry.work_id).status
                if status is ItemStatus.COMMITTING:
                    continue  # to be rolled forward first; closed at a later round
                log_.close_stale(entry.dispatch_id, committed=status is ItemStatus.DONE)
            except Exception as error:  # the store or the journal: retried next round
                self.stats.counts[Stat.STALE_ENTRIES_LEFT] += 1
                log.info("closing stale dispatch %d failed: %s", entry.dispatch_id, error)
                continue
            self.stats.counts[Stat.STALE_ENTRIES_CLOSED] += 1

    def roll_forward(self) -> int:
        """Finish every item a stalled owner (or an earlier incarnation of
        this coordinator) left COMMITTING: rerun triage from the stored
        result, then complete. Returns how many were rolled forward. Until
        one look at every item in the store succeeded, it looks at every item;
        then only at those marked "maybe committing"."""
        rolled = 0
        try:
            if self._full_look_due:
                for key in self.store.mark_committing_items():
                    self.stats.counts[Stat.UNREADABLE_ITEMS] += 1
                    log.warning("item %s has corrupt records; it is left alone", key)
                self._full_look_due = False
            known = len(self.store.set_aside)
            candidates = self.store.roll_forward_candidates(self.transport.now())
        except StoreError as error:
            self.stats.counts[Stat.ROLL_FORWARD_FAILURES] += 1
            log.info("looking for items to roll forward failed: %s", error)
            return 0
        deferred = self.store.deferred_in_last_look
        if deferred:
            self.stats.counts[Stat.ROLL_FORWARD_DEFERRED] += len(deferred)
            log.info("roll-forward skipped %d item(s) for now: %s", len(deferred), deferred)
        for aside in self.store.set_aside[known:]:
            # One unreadable item must not hold up the others: reported once.
            self.stats.counts[Stat.ITEMS_SET_ASIDE] += 1
            log.warning(
                "item %s (%r) cannot be rolled forward, set aside: %s",
                aside.key,
                aside.work_id,
                aside.reason,
            )
            if aside.work_id is not None:  # not waited for: the run can end
                self.workload.drop(aside.work_id, "set aside: its commit cannot be read")
        for candidate in candidates:
            owner = candidate.state.owner
            mine = owner is not None and owner.coordinator == self.config.coordinator_id
            committed = Committed(candidate.work_id, candidate.token, candidate.result)
            try:
                self._triage(committed, owner=mine)
            except Exception as error:
                self.stats.counts[Stat.ROLL_FORWARD_FAILURES] += 1
                log.info("rolling %r forward failed, will retry: %s", candidate.work_id, error)
                continue
            self.workload.done(candidate.work_id)
            rolled += 1
            self.stats.counts[Stat.ROLLED_FORWARD if mine else Stat.ROLLED_FORWARD_FOR_PEER] += 1
        return rolled

    def adopt_orphans(self) -> bool:
        """Offer the workload every item the store holds unsettled (neither
        done nor quarantined): items only a peer killed for good knew are
        finished by whoever adopts them. True while the caller should call
        `step()` and then ask again: the workload will finish some such item,
        or the store could not be read in full yet.

        What the survey could not read for now (an item whose first record
        is not seen, which a cached negative look-up can cause, one that hit
        an I/O error, or the listing itself) is waited for: True for at
        least `ORPHAN_LOOKS` looks and the store's `ttl + margin` from the
        first such look (at most `MAX_ORPHAN_LOOKS` looks, for a clock that
        does not move); then each key still unread is given up (counted and
        logged once) and not waited for again. A key given up is still
        adopted if a later survey reads it. The wait starts over once a
        survey finds nothing new to wait for.

        A workload that keeps `Workload.adopt` (adopt nothing) is not
        offered anything: the survey reads every item in the store."""
        if getattr(type(self.workload), "adopt", None) is Workload.adopt:
            return False
        finished = (ItemStatus.DONE, ItemStatus.QUARANTINED)
        try:
            survey = self.store.survey()
            unsettled = [s.work_id for s in survey.states if s.status not in finished]
            adopted = [self.workload.adopt(work_id) for work_id in unsettled]
        except (StoreError, OSError):
            return self._still_waiting([_THE_LISTING])
        return any(adopted) | self._still_waiting(survey.look_again)

    def _still_waiting(self, unread: list[str]) -> bool:
        """One look at what a survey could not read; True while the wait for
        it goes on (one wait for all of them, so that errors that hit a
        different item each time cannot keep it going)."""
        waiting_for = [key for key in unread if key not in self._orphans_given_up]
        if not waiting_for:
            self._orphan_wait = None
            return False
        now = self.transport.now()
        if self._orphan_wait is None:
            self._orphan_wait = (now, 0)
        since, looks = self._orphan_wait
        looks += 1
        self._orphan_wait = (since, looks)
        settle = self.store.ttl + self.store.margin
        if looks < MAX_ORPHAN_LOOKS and (looks < ORPHAN_LOOKS or now - since < settle):
            return True
        for key in waiting_for:
            self._orphans_given_up.add(key)
            self.stats.counts[Stat.ORPHAN_LOOKS_GIVEN_UP] += 1
            log.warning(
                "%s could not be read in %d looks over %.1f s; not waited for any more",
                "the item listing" if key == _THE_LISTING else f"item {key}",
                looks,
                now - since,
            )
        return False
