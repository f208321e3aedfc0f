"""The coordinator's results (docs/design.md, the fence): a result matched
to its dispatch, fenced in the shared store (one at a time, or a group of
them with one file and one fsync), then triaged inside the committing
boundary and completed. A part of `Coordinator`, kept apart so that each
module stays one part."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from dispatchtx import CompensationError, DispatchTables, Transaction, UnknownDispatch, WrongWorker
from dispatchtx.coordinator.faults import FaultPlan, FaultPoint, InjectedFault
from dispatchtx.coordinator.recovery import Committed, Recovery
from dispatchtx.coordinator.stats import Stat
from dispatchtx.coordinator.workers import Strikes
from dispatchtx.coordinator.workload import DispatchTag
from dispatchtx.store import (
    CommitOutcome,
    CompleteOutcome,
    CorruptRecord,
    InvalidToken,
    OutcomeUnknown,
    StoreIOError,
)
from dispatchtx.transport import Result

__all__ = ["Fencing"]

log = logging.getLogger("dispatchtx.coordinator")

RECENTLY_COMMITTED = 4096
# Ambiguous fence retries back off from 1 ms to 50 ms; a fence attempt that
# stored nothing pauses new claims from 2 ms up to 1 s.
FENCE_RETRY_FIRST_PAUSE = 0.001
FENCE_RETRY_MAX_PAUSE = 0.05
STORE_FAILURE_MAX_BACKOFF = 1.0


# A dispatch triaged inside its committing boundary, its `done` not yet published.
_AwaitingDone = tuple[int, Committed, AbstractContextManager[Transaction[DispatchTag]]]
# A result checked against its dispatch, with the worker it came from.
_Checked = tuple[int, tuple[Transaction[DispatchTag], Result]]


class Fencing(Recovery):
    """Results of `Coordinator` (which provides what is declared here)."""

    faults: FaultPlan
    tables: DispatchTables[DispatchTag]
    wasted_cpu_seconds: float
    _recently_committed: set[int]
    _committed_order: deque[int]
    _strikes: Strikes
    _committed: dict[int, Committed]
    _parked: list[int]
    _held_back: deque[tuple[float, int, Result | bytes]]
    _next_heartbeat: float
    _heartbeat_every: float
    _store_failures_in_row: int
    _dispatch_paused_until: float
    _lock: threading.Lock
    _awaiting_done: list[_AwaitingDone]

    if TYPE_CHECKING:

        def _free_slot(self, worker: int) -> None: ...

        def _heartbeat(self) -> None: ...

    # -- results ---------------------------------------------------------------

    def _deliveries(self, worker: int, message: Result | bytes) -> list[Result | bytes]:
        """What the coordinator gets of one message, after the fault points
        that act on results."""
        faults = self.faults
        if isinstance(message, Result) and faults.fires(FaultPoint.STALE_RESULT):
            # The worker answers late: after the deadline has discarded the
            # dispatch (and abandoned its lease), so the result must be dropped.
            release = self.transport.now() + 2 * self.config.deadline
            self._held_back.append((release, worker, message))
            return []
        if isinstance(message, Result) and faults.fires(FaultPoint.DUPLICATE_RESULT):
            return [message, message]  # the worker answered twice
        return [message]

    def _fence_batch(self, deliveries: list[tuple[int, Result | bytes]]) -> None:
        """Group commit of results (one, or up to `commit_batch`): every
        fence first, in one store batch; only once their commit slots are
        durable, the triage of each."""
        passed: list[tuple[int, int, Result]] = []
        try:
            with self.store.batch():
                if len(deliveries) > 1:
                    self._fence_group(deliveries, passed)
                else:
                    for worker, delivered in deliveries:
                        fenced = self._fence(worker, delivered)
                        if fenced is not None:
                            passed.append(fenced)
        except (OutcomeUnknown, StoreIOError) as error:
            # The batch's fsync failed: settle each commit on its own before
            # acting on it (calling begin_commit again does).
            self.stats.counts[Stat.COMMIT_BATCHES_RETRIED] += 1
            log.info("a group commit's fsync failed, settling one by one: %s", error)
            self._settle_commits(passed)
        except Exception:
            # One message's fence failed: those that passed before it are in
            # the store; they are settled and carried on before the error goes up.
            self._settle_commits(passed)
            self._carry_on(passed)
            raise
        if len(passed) > 1:
            self.stats.counts[Stat.COMMIT_BATCHES] += 1
            self.stats.counts[Stat.RESULTS_IN_BATCHES] += len(passed)
        self._carry_on(passed)

    def _fence_group(
        self, deliveries: list[tuple[int, Result | bytes]], passed: list[tuple[int, int, Result]]
    ) -> None:
        """The fences of several results: each checked, then every commit
        record in one file (`begin_commit_many`); a result whose group commit
        did not get a plain answer goes through `begin_commit` on its own,
        which settles it. What passes is appended to `passed` as it does."""
        grouped, alone, first_error = self._checked_for_group(deliveries)
        outcomes = self.store.begin_commit_many(self._commits_of(grouped))
        first_error = self._fence_answers(grouped, alone, outcomes, passed) or first_error
        if first_error is not None:
            raise first_error

    def _checked_for_group(
        self, deliveries: list[tuple[int, Result | bytes]]
    ) -> tuple[list[_Checked], list[_Checked], Exception | None]:
        """The first half of a group's fences: each result checked; those for
        the group's file, those left to `begin_commit` alone, and the first
        error met (raised by the caller once the others are done: a commit
        already in the store must not be left unheeded behind it)."""
        first_error: Exception | None = None
        checked: list[_Checked] = []
        dispatch_ids: set[int] = set()
        for worker, delivered in deliveries:
            if isinstance(delivered, Result) and delivered.dispatch_id in dispatch_ids:
                self._drop_duplicate(worker, delivered)
                continue
            try:
                one = self._check_result(worker, delivered)
            except Exception as error:
                first_error = first_error or error
                continue
            if one is not None:
                checked.append((worker, one))
                dispatch_ids.add(one[1].dispatch_id)
        grouped: list[_Checked] = []
        alone: list[_Checked] = []
        for entry in checked:
            try:
                self.faults.check(FaultPoint.BEGIN_COMMIT_EIO)
            except InjectedFault:
                alone.append(entry)  # `begin_commit` on its own meets the fault again
                continue
            grouped.append(entry)
        return grouped, alone, first_error

    @staticmethod
    def _commits_of(grouped: list[_Checked]) -> list[tuple[str, int, bytes]]:
        return [(message.item, message.token, message.result) for _, (_, message) in grouped]

    def _fence_answers(
        self,
        grouped: list[_Checked],
        alone: list[_Checked],
        outcomes: Sequence[CommitOutcome | Exception],
        passed: list[tuple[int, int, Result]],
    ) -> Exception | None:
        """The second half: what follows from each group commit's answer
        (and `begin_commit` alone for the rest); returns the first error."""
        first_error: Exception | None = None
        answers: list[CommitOutcome | Exception | None] = [*outcomes, *(None for _ in alone)]
        for (worker, one), outcome in zip([*grouped, *alone], answers, strict=True):
            try:
                if isinstance(outcome, CommitOutcome):
                    fenced = self._commit_checked(one, worker, outcome)
                else:
                    # No plain answer (an I/O error, an unknown outcome, a
                    # corrupt chain): `begin_commit` alone settles it, or raises
                    # as it does. An unknown outcome may have linked the slot:
                    # only the store's answer settles it then.
                    fenced = self._commit_checked(
                        one, worker, maybe_published=isinstance(outcome, OutcomeUnknown)
                    )
            except Exception as error:
                first_error = first_error or error
                continue
            if fenced is not None:
                passed.append(fenced)
        return first_error

    def _settle_commits(self, passed: list[tuple[int, int, Result]]) -> None:
        for _, _, result in passed:
            # Their slots were linked in the batch: only the store's answer settles them.
            self._begin_commit(result.item, result.token, result.result, maybe_published=True)

    def _carry_on(self, passed: list[tuple[int, int, Result]]) -> None:
        # The releases (the workload's `done` among them) act on the `done`
        # slot, so it must be durable before they run: a group is triaged,
        # then its `done` records go in one file, then each is released.
        if len(passed) <= 1:
            for dispatch_id, worker, result in passed:
                self._past_fence(dispatch_id, worker, result)
            return
        for dispatch_id, worker, result in passed:
            self._past_fence(dispatch_id, worker, result, commit=False)
        self._commit_group([dispatch_id for dispatch_id, _, _ in passed])

    def _drop_duplicate(self, worker: int, result: Result) -> None:
        self.stats.counts[Stat.STALE_RESULTS] += 1
        log.info(
            "dropped a duplicate result of dispatch %d from worker %d", result.dispatch_id, worker
        )

    def _fence(self, worker: int, message: Result | bytes) -> tuple[int, int, Result] | None:
        """Everything up to and including `begin_commit`; returns what passed
        the fence, for `_past_fence`."""
        checked = self._check_result(worker, message)
        if checked is None:
            return None
        return self._commit_checked(checked, worker)

    def _check_result(
        self, worker: int, message: Result | bytes
    ) -> tuple[Transaction[DispatchTag], Result] | None:
        """Everything before `begin_commit`: the result's dispatch, worker,
        item, token and success; None (counted, discarded) if it fails one."""
        self._strikes.heard(worker, self.transport.now())
        if isinstance(message, bytes):
            self.stats.counts[Stat.MALFORMED_RESULTS] += 1
            log.warning("worker %d sent an undecodable message (%d bytes)", worker, len(message))
            return None
        try:
            txn = self.tables.match(worker, message.dispatch_id)
        except (UnknownDispatch, WrongWorker) as error:
            self.stats.counts[Stat.STALE_RESULTS] += 1
            log.info("dropped a result from worker %d: %s", worker, error)
            if message.dispatch_id not in self._recently_committed:
                self.wasted_cpu_seconds += message.cpu_seconds  # a stale run: redone
            return None
        if txn.tag != DispatchTag(message.item, message.token):
            self.stats.counts[Stat.MISMATCHED_RESULTS] += 1
            self.wasted_cpu_seconds += message.cpu_seconds
            self._fenced_out(txn.id)
            return None
        if not message.ok:
            self.stats.counts[Stat.TASK_ERRORS] += 1
            self.wasted_cpu_seconds += message.cpu_seconds
            self._fenced_out(txn.id)
            return None
        return txn, message

    def _commit_checked(
        self,
        checked: tuple[Transaction[DispatchTag], Result],
        worker: int,
        outcome_in_group: CommitOutcome | None = None,
        *,
        maybe_published: bool = False,
    ) -> tuple[int, int, Result] | None:
        """`begin_commit` of a checked result (unless a group commit already
        got its answer, `outcome_in_group`) and what follows from its outcome."""
        txn, message = checked
        try:
            if outcome_in_group is not None:
                self._store_failures_in_row = 0
                outcome: CommitOutcome | None = outcome_in_group
                if outcome is CommitOutcome.DUPLICATE:
                    outcome = CommitOutcome.COMMITTED  # as `_begin_commit` takes it
            else:
                outcome = self._begin_commit(
                    message.item, message.token, message.result, maybe_published=maybe_published
                )
        except (CorruptRecord, InvalidToken) as error:
            # The item's chain cannot be read (or names no such claim): count
            # it, give the dispatch back, and drop the item rather than
            # redispatching it forever.
            self.stats.counts[Stat.CORRUPT_ITEMS_DROPPED] += 1
            log.warning("dropped the result of %r: its chain is corrupt: %s", message.item, error)
            self.wasted_cpu_seconds += message.cpu_seconds
            self._fenced_out(txn.id)
            self.workload.drop(message.item, "corrupt")
            return None
        if outcome is None:
            # Nothing stored: given back by the after-send rules, redone later.
            self.wasted_cpu_seconds += message.cpu_seconds
            self._fenced_out(txn.id)
            return None
        if outcome is CommitOutcome.FENCED_OUT:
            self.stats.counts[Stat.FENCED_OUT] += 1
            self.wasted_cpu_seconds += message.cpu_seconds
            self._fenced_out(txn.id)
            return None
        return txn.id, worker, message

    def _past_fence(
        self, dispatch_id: int, worker: int, message: Result, *, commit: bool = True
    ) -> None:
        self._remember_committed(dispatch_id)
        self.faults.kill_point(FaultPoint.KILL_AFTER_STORE_COMMIT)
        self._committed[dispatch_id] = Committed(message.item, message.token, message.result)
        self._free_slot(worker)  # the result is in hand: the worker is free (D1)
        if commit:
            self._commit(dispatch_id)  # committing() moves it past the fence

    def _remember_committed(self, dispatch_id: int) -> None:
        """A bounded memory of committed dispatches, so that a duplicate of
        their result is not counted as CPU spent on a run that was redone."""
        self._recently_committed.add(dispatch_id)
        self._committed_order.append(dispatch_id)
        if len(self._committed_order) > RECENTLY_COMMITTED:
            self._recently_committed.discard(self._committed_order.popleft())

    def _begin_commit(
        self, work_id: str, token: int, result: bytes, *, maybe_published: bool = False
    ) -> CommitOutcome | None:
        """The fence. An ambiguous outcome (the commit slot may be there) is
        resolved before anything else: the dispatch stays ACTIVE (never
        swept) until it is known, retried with a bounded back-off during
        which the heartbeats go on. An attempt known to have published
        nothing (the store's `StoreIOError`: ENOSPC writing the result, a
        failed read) returns None: a failed fence attempt, which the caller
        discards. `maybe_published`: an earlier attempt may have linked the
        slot, so nothing short of the store's answer settles it."""
        pause = 0.0
        while True:
            try:
                self.faults.check(FaultPoint.BEGIN_COMMIT_EIO)
                outcome = self.store.begin_commit(work_id, token, result)
            except StoreIOError as error:
                if not maybe_published:
                    self._store_failed(work_id, error)
                    return None
                self._retry_pause(pause, work_id, error)
            except (OutcomeUnknown, OSError, InjectedFault) as error:
                # Calling again settles it: the store kept our nonce.
                maybe_published = True
                self._retry_pause(pause, work_id, error)
            else:
                self._store_failures_in_row = 0
                if outcome is CommitOutcome.DUPLICATE:
                    # This token's commit is already there (an earlier attempt's):
                    # the store holds that result; triage it.
                    return CommitOutcome.COMMITTED
                return outcome
            pause = min(max(pause * 2, FENCE_RETRY_FIRST_PAUSE), FENCE_RETRY_MAX_PAUSE)

    def _retry_pause(self, pause: float, work_id: str, error: Exception) -> None:
        self.stats.counts[Stat.BEGIN_COMMIT_RETRIED] += 1
        log.info("begin_commit of %r unresolved, retrying: %s", work_id, error)
        if pause <= 0:
            return
        # Not a busy retry inside the lock: the heartbeat thread gets in, and
        # without one the heartbeats fall due here too.
        self._lock.release()
        try:
            time.sleep(pause)
        finally:
            self._lock.acquire()
        if not self.config.background_heartbeat and self.transport.now() >= self._next_heartbeat:
            self._next_heartbeat = self.transport.now() + self._heartbeat_every
            self._heartbeat()

    def _store_failed(self, work_id: str, error: StoreIOError) -> None:
        self.stats.counts[Stat.FENCE_ATTEMPTS_FAILED] += 1
        self._store_failures_in_row += 1
        back_off = min(
            FENCE_RETRY_FIRST_PAUSE * 2 ** min(self._store_failures_in_row, 30),
            STORE_FAILURE_MAX_BACKOFF,
        )
        self._dispatch_paused_until = self.transport.now() + back_off
        log.warning(
            "the store took no commit of %r (%s): dispatch discarded, new claims paused %.3f s",
            work_id,
            error,
            back_off,
        )

    def _fenced_out(self, dispatch_id: int) -> None:
        failures = self.tables.fenced_out(dispatch_id)
        self.stats.counts[Stat.COMPENSATION_FAILURES] += len(failures)
        for failure in failures:
            log.info("discard: %s", failure)

    def _commit(self, dispatch_id: int) -> None:
        committed = self._committed[dispatch_id]
        try:
            with self.tables.committing(dispatch_id):
                self._triage(committed, owner=True)
        except CompensationError as error:
            # COMMITTED; a release failed and was recorded.
            self.stats.counts[Stat.COMPENSATION_FAILURES] += len(error.failures)
        except Exception as error:
            self._park(dispatch_id, error)
            return
        del self._committed[dispatch_id]
        self.stats.counts[Stat.COMMITTED] += 1

    def _park(self, dispatch_id: int, error: Exception) -> None:
        self.stats.counts[Stat.TRIAGE_FAILURES] += 1
        log.info("triage of dispatch %d failed, parked for a retry: %s", dispatch_id, error)
        if dispatch_id not in self._parked:
            self._parked.append(dispatch_id)

    def _commit_group(self, dispatch_ids: list[int]) -> None:
        """`_commit` of several dispatches past the fence, in two halves: each
        is triaged now, inside its committing boundary, and waits there for
        its `done`, which goes with the next group of claims (one file for
        both, `_publish_awaiting_done`) or on its own if none comes. One that
        fails is parked, as `_commit` parks it; the others go on."""
        for dispatch_id in dispatch_ids:
            committed = self._committed[dispatch_id]
            boundary = self.tables.committing(dispatch_id)
            entered = False
            try:
                boundary.__enter__()
                entered = True
                self._triage_only(committed, owner=True)
            except Exception as error:
                if entered:
                    boundary.__exit__(type(error), error, error.__traceback__)
                self._park(dispatch_id, error)
                continue
            self._awaiting_done.append((dispatch_id, committed, boundary))

    def _take_awaiting_done(self) -> list[_AwaitingDone]:
        awaiting, self._awaiting_done = self._awaiting_done, []
        return awaiting

    def _flush_awaiting_done(self) -> None:
        """The `done`s still waiting, as one group of their own."""
        awaiting = self._take_awaiting_done()
        if awaiting:
            outcomes = self.store.complete_many([(c.work_id, c.token) for _, c, _ in awaiting])
            self._finish_awaiting_done(awaiting, outcomes)

    def _finish_awaiting_done(
        self,
        awaiting: list[_AwaitingDone],
        outcomes: Sequence[CompleteOutcome | Exception],
    ) -> None:
        """After the group that held their `done`s is durable: leave each
        boundary (its releases run), or park the dispatch whose `done` did not
        get a plain answer (its retry triages again and completes)."""
        for (dispatch_id, committed, boundary), outcome in zip(awaiting, outcomes, strict=True):
            try:
                if isinstance(outcome, Exception):
                    raise outcome
                self._check_completed(committed, outcome)
            except Exception as error:
                boundary.__exit__(type(error), error, error.__traceback__)
                self._park(dispatch_id, error)
                continue
            try:
                boundary.__exit__(None, None, None)
            except CompensationError as error:
                # COMMITTED; a release failed and was recorded.
                self.stats.counts[Stat.COMPENSATION_FAILURES] += len(error.failures)
            del self._committed[dispatch_id]
            self.stats.counts[Stat.COMMITTED] += 1

    def _triage(self, committed: Committed, *, owner: bool) -> None:
        self._triage_only(committed, owner=owner)
        self._check_completed(committed, self.store.complete(committed.work_id, committed.token))

    def _triage_only(self, committed: Committed, *, owner: bool) -> None:
        """Triage, up to (not including) the `done` it calls for."""
        faults = self.faults
        faults.check(FaultPoint.TRIAGE_EIO)
        faults.kill_point(FaultPoint.KILL_MID_TRIAGE)
        # User code, which may run long: let the heartbeat thread in meanwhile.
        self._lock.release()
        try:
            self.workload.triage(committed.work_id, committed.token, committed.result, owner=owner)
        finally:
            self._lock.acquire()
        faults.kill_point(FaultPoint.KILL_AFTER_TRIAGE)
        faults.check(FaultPoint.COMPLETE_EIO)

    def _check_completed(self, committed: Committed, outcome: CompleteOutcome) -> None:
        if outcome is CompleteOutcome.FENCED_OUT:
            raise RuntimeError(f"complete({committed.work_id!r}) fenced out after its commit")
        self.faults.kill_point(FaultPoint.KILL_AFTER_COMPLETE)

    def _retry_parked(self) -> None:
        parked, self._parked = self._parked, []
        for dispatch_id in parked:
            self.stats.counts[Stat.TRIAGE_RETRIES] += 1
            self._commit(dispatch_id)
