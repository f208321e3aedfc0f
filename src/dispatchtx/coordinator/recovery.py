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

# How many looks (over at least the store's ttl + margin) an item the survey
# cannot read yet gets before `adopt_orphans` gives it up.
ORPHAN_LOOKS = 8


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
    _orphan_looks: dict[str, tuple[float, int]]  # key -> (first look, looks; -1: given up)

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
        finished by whoever adopts them. True while the workload will finish
        some such item, so the caller keeps stepping; a store error (a disk
        fault) is True too: look again.

        An item the survey could not read for now (its first record not seen,
        which a cached negative look-up can cause, or an I/O error) is looked
        at again: True until it has been so for `ORPHAN_LOOKS` looks and for
        the store's `ttl + margin`; then it is given up (counted and logged
        once), so that a directory whose first record never landed, or an
        item no one can read, does not keep the run going forever.

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
            return True
        return any(adopted) | self._looking_again(survey.look_again)

    def _looking_again(self, keys: list[str]) -> bool:
        """Follow the keys a survey could not read yet; True while any of
        them is still worth another look."""
        now = self.transport.now()
        watched = self._orphan_looks
        for key in [key for key in watched if key not in keys]:
            del watched[key]  # read since (or gone)
        waiting = False
        settle = self.store.ttl + self.store.margin
        for key in keys:
            since, looks = watched.get(key, (now, 0))
            if looks < 0:
                continue  # given up already
            looks += 1
            if looks < ORPHAN_LOOKS or now - since < settle:
                watched[key] = (since, looks)
                waiting = True
                continue
            watched[key] = (since, -1)
            self.stats.counts[Stat.ORPHAN_LOOKS_GIVEN_UP] += 1
            log.warning(
                "item %s could not be read in %d looks over %.1f s; not adopted",
                key,
                looks,
                now - since,
            )
        return waiting
