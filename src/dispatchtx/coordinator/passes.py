"""The coordinator's pass under group commit (docs/design.md, the shared
store): the results a poll brings, the `done`s of the last triage and the
claims of the next dispatches, one made ahead for each worker a result
frees, in ONE store group; only once it is durable are the `done`s
released, the results triaged and the claimed items sent. A part of
`Coordinator`, kept apart so that each module stays one part."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from dispatchtx import Transaction
from dispatchtx.coordinator.faults import FaultPoint
from dispatchtx.coordinator.fence import Fencing, _AwaitingDone, _Checked
from dispatchtx.coordinator.stats import Stat
from dispatchtx.coordinator.workload import DispatchTag
from dispatchtx.resources.lease import WorkLease
from dispatchtx.store import (
    ClaimOutcome,
    ClaimResult,
    CommitOutcome,
    CompleteOutcome,
    OutcomeUnknown,
    StoreIOError,
)
from dispatchtx.transport import Result

__all__ = ["Passes"]

log = logging.getLogger("dispatchtx.coordinator")

# A dispatch prepared and claimed, to be sent: (txn, worker, work id, lease).
_Opened = tuple[Transaction[DispatchTag], int, str, WorkLease]


def claim_made(work_id: str, result: ClaimResult | Exception) -> tuple[str, int] | None:
    """(work id, token) of a claim a group made for this coordinator, else
    None (refused, failed, or decided without a token)."""
    if (
        isinstance(result, ClaimResult)
        and result.outcome is ClaimOutcome.CLAIMED
        and result.token is not None
    ):
        return work_id, result.token
    return None


class Passes(Fencing):
    """The grouped pass of `Coordinator` (which provides what is declared here)."""

    lost_workers: set[int]
    _free_slots: deque[int]
    _last_pass_sent: bool

    if TYPE_CHECKING:

        def _take_pairs(self, wanted: int) -> list[tuple[int, str]]: ...

        def _dispatch_to_free_workers(self) -> None: ...

        def _open(self, worker: int, work_id: str, now: float) -> _Opened | None: ...

        def _send(
            self,
            txn: Transaction[DispatchTag],
            worker: int,
            work_id: str,
            lease: WorkLease,
            now: float,
            *,
            journaled: bool = False,
        ) -> None: ...

        def _compensate(self, txn: Transaction[DispatchTag]) -> None: ...

        def _dispatch_failed(self, work_id: str, worker: int, error: Exception) -> None: ...

        def _refused(self, work_id: str, result: ClaimResult | None) -> None: ...

        def _abandon_unused(self, ahead: list[tuple[str, int]], opened: list[_Opened]) -> None: ...

    def _grouped_pass(self, batch: int) -> None:
        """Group commit: the results a poll brings, the `done`s of the last
        pass's triage and the claims of the next dispatches go in ONE group
        (`_fence_and_dispatch`). Free workers wait for no result: with items
        to send, the poll only looks."""
        pairs: list[tuple[int, str]] = []
        if self._dispatch_paused_until <= self.transport.now():
            pairs = self._take_pairs(min(batch, len(self._free_slots)))
        # A pass that sent nothing (every claim refused: items busy elsewhere)
        # waits in its poll, so that time goes on towards their takeover.
        look_only = bool(pairs) and self._last_pass_sent
        try:
            messages = self.transport.poll(0.0 if look_only else self.config.poll_timeout)
        except BaseException:
            self._give_back_pairs(pairs)
            raise
        self._fence_and_dispatch(
            [
                (worker, delivered)
                for worker, message in messages[:batch]
                for delivered in self._deliveries(worker, message)
            ],
            pairs,
        )
        self._fence_in_groups(messages[batch:])  # more than one group's worth
        if len(pairs) == batch:  # more free workers than one group: the rest now
            self._dispatch_to_free_workers()

    def _fence_in_groups(self, messages: list[tuple[int, Result | bytes]]) -> None:
        """`_fence_batch` of `messages`, `commit_batch` at a time."""
        batch = self.config.commit_batch
        for start in range(0, len(messages), batch):
            self._fence_batch(
                [
                    (worker, delivered)
                    for worker, message in messages[start : start + batch]
                    for delivered in self._deliveries(worker, message)
                ]
            )

    def _give_back_pairs(self, pairs: list[tuple[int, str]]) -> None:
        for worker, work_id in pairs:
            self._free_slot(worker)
            self.workload.give_back(work_id)

    def _fence_and_dispatch(
        self, deliveries: list[tuple[int, Result | bytes]], pairs: list[tuple[int, str]]
    ) -> None:
        """One group for a pass (`store.commit_claim_and_complete`): the
        commits of `deliveries`, the `done`s awaiting, the claims of `pairs`,
        and one claim ahead per result checked, for the worker its result
        frees. Only once the group is durable: the `done`s are released, the
        results that passed the fence are triaged (their `done`s await the
        next group), and the claimed dispatches are sent, to `pairs` and to
        the workers just freed. An error in one result's fence is raised
        after all that."""
        now = self.transport.now()
        awaiting = self._take_awaiting_done()
        passed: list[tuple[int, int, Result]] = []
        opened: list[_Opened] = []
        ahead: list[tuple[str, int]] = []
        pool: list[tuple[str, int]] = []  # claimed ahead for the workers results free
        freed_items: list[str] = []  # taken for them, not yet given back or opened
        dones: list[CompleteOutcome | Exception] = []
        first_error: Exception | None = None
        next_pair = 0
        failed = False
        try:
            with self.store.batch():
                grouped, alone, first_error = self._checked_for_group(deliveries)
                freed_items = self._take_items(len(grouped) + len(alone))
                commits, ahead, pool, dones = self._group_of_pass(
                    grouped, pairs, freed_items, now, awaiting
                )
                freed_items = [work_id for work_id, _ in pool]
                first_error = self._fence_answers(grouped, alone, commits, passed) or first_error
                for worker, work_id in pairs:
                    next_pair += 1
                    one = self._open(worker, work_id, now)
                    if one is not None:
                        opened.append(one)
        except (OutcomeUnknown, StoreIOError) as error:
            # The group's fsync failed: send none of its claims (abandoning
            # each publishes after it, and that fsync makes both durable or
            # fails); settle each commit on its own before acting on it; the
            # `done`s are settled by a retry.
            failed = True
            self.stats.counts[Stat.COMMIT_BATCHES_RETRIED] += 1
            self.stats.counts[Stat.CLAIM_BATCHES_FAILED] += 1
            log.info("a pass's group did not become durable, settling one by one: %s", error)
            for txn, _, _, _ in opened:
                self._compensate(txn)
            self._give_back_pairs(pairs[next_pair:])
            self._give_back_freed(pool, freed_items)
            pool, freed_items = [], []
            self._finish_awaiting_done(awaiting, [error] * len(awaiting))
            awaiting, dones = [], []
            self._settle_commits(passed)
        except Exception as error:
            # Not the store's answer: nothing of the group is known durable.
            # The claims are not sent; the commits that passed are settled
            # and carried on before the error goes up, as `_fence_batch` does.
            for txn, _, _, _ in opened:
                self._compensate(txn)
            self._give_back_pairs(pairs[next_pair:])
            self._give_back_freed(pool, freed_items)
            self._finish_awaiting_done(awaiting, [error] * len(awaiting))
            self._settle_commits(passed)
            self._carry_on(passed)
            raise
        except BaseException:
            # An interrupt: what was opened is compensated (as the dispatch
            # boundary does), what was taken and not opened is given back (a
            # claim made ahead is ours: adopted when its item is taken again);
            # the commits that passed are in the store, left to recovery.
            self._give_back_pairs(pairs[next_pair:])
            for work_id in freed_items:
                self.workload.give_back(work_id)
            for txn, _, _, _ in opened:
                self._compensate(txn)
            self._awaiting_done[:0] = awaiting  # still to settle (shutdown does)
            raise
        finally:
            self._abandon_unused(ahead, opened)  # the compensated ones are not abandoned twice
        if failed:
            opened = []
        self._finish_awaiting_done(awaiting, dones)  # durable now: released
        if len(passed) > 1:
            self.stats.counts[Stat.COMMIT_BATCHES] += 1
            self.stats.counts[Stat.RESULTS_IN_BATCHES] += len(passed)
        try:
            self._carry_on(passed)  # frees the workers whose results passed
        except BaseException:
            # A kill in triage: nothing of this pass is sent.
            for txn, _, _, _ in opened:
                self._compensate(txn)
            for work_id in freed_items:
                self.workload.give_back(work_id)
            raise
        # The time of sending: after the results were heard (a worker's
        # deadline strikes count only what it was sent after its answer).
        now = self.transport.now()
        opened.extend(self._open_pool(pool, now))
        sent_before = self.stats.counts[Stat.DISPATCHES]
        self._send_opened(opened, now)
        self._last_pass_sent = self.stats.counts[Stat.DISPATCHES] > sent_before or not pairs
        if first_error is not None:
            raise first_error

    def _take_items(self, wanted: int) -> list[str]:
        """Up to `wanted` next items, for claims made ahead (none while new
        claims are paused)."""
        items: list[str] = []
        if self._dispatch_paused_until > self.transport.now():
            return items
        try:
            while len(items) < wanted:
                work_id = self.workload.take()
                if work_id is None:
                    break
                items.append(work_id)
        except BaseException:
            for work_id in items:
                self.workload.give_back(work_id)
            raise
        return items

    def _open_pool(self, pool: list[tuple[str, int]], now: float) -> list[_Opened]:
        """Dispatches of the items claimed ahead, to free workers (each
        `_open` adopts its claim); a claim no worker takes is given back."""
        opened: list[_Opened] = []
        left = list(pool)
        try:
            while left:
                worker = self._free_worker()
                if worker is None:
                    break
                work_id, _ = left.pop(0)
                one = self._open(worker, work_id, now)
                if one is not None:
                    opened.append(one)
        except BaseException:
            for txn, _, _, _ in opened:
                self._compensate(txn)
            raise
        finally:
            self._give_back_pool(left)
            self._abandon_unused([claim for claim in pool if claim not in left], opened)
        return opened

    def _free_worker(self) -> int | None:
        free = self._free_slots
        while free:
            worker = free.popleft()
            if worker not in self.lost_workers:  # a slot freed before its worker was lost
                return worker
        return None

    def _give_back_pool(self, pool: list[tuple[str, int]]) -> None:
        """Claims made ahead that no dispatch took: abandoned (never sent),
        their items back to the workload."""
        self._give_back_freed(pool, [work_id for work_id, _ in pool])

    def _give_back_freed(self, pool: list[tuple[str, int]], items: list[str]) -> None:
        """The claims made ahead in `pool` abandoned (never sent), and the
        `items` taken for freed workers back to the workload."""
        self._abandon_unused(pool, [])
        for work_id in items:
            self.workload.give_back(work_id)

    def _group_of_pass(
        self,
        grouped: list[_Checked],
        pairs: list[tuple[int, str]],
        for_freed: list[str],
        now: float,
        awaiting: list[_AwaitingDone],
    ) -> tuple[
        list[CommitOutcome | Exception],
        list[tuple[str, int]],
        list[tuple[str, int]],
        list[CompleteOutcome | Exception],
    ]:
        """The pass's one store call. Returns each commit's answer, the
        claims made for `pairs` and those for `for_freed` (work id, token),
        and each `done`'s answer. An item of `for_freed` not claimed goes
        back to the workload (a pair's `_open` claims it on its own later).
        If the call as a whole fails, each commit is left to `begin_commit`
        alone, each pair's `_open` claims on its own, each `done` to a retry."""
        commits = self._commits_of(grouped)
        completions = [(committed.work_id, committed.token) for _, committed, _ in awaiting]
        work_ids = [work_id for _, work_id in pairs] + for_freed
        try:
            committed, claimed, completed = self.store.commit_claim_and_complete(
                commits, work_ids, completions, now
            )
        except Exception as error:
            log.info("a pass's group failed, one by one: %s", error)
            for work_id in for_freed:
                self.workload.give_back(work_id)
            return [error] * len(commits), [], [], [error] * len(awaiting)
        made = [
            claim_made(work_id, result) for work_id, result in zip(work_ids, claimed, strict=True)
        ]
        ahead = [claim for claim in made[: len(pairs)] if claim is not None]
        pool: list[tuple[str, int]] = []
        refused: list[tuple[str, ClaimResult | Exception]] = []
        for work_id, claim, result in zip(
            for_freed, made[len(pairs) :], claimed[len(pairs) :], strict=True
        ):
            if claim is None:
                refused.append((work_id, result))
            else:
                pool.append(claim)
        for work_id, result in refused:
            # As `_open` does with a refused claim: the item goes back, and
            # one done elsewhere or quarantined is settled in the workload.
            self.workload.give_back(work_id)
            if isinstance(result, ClaimResult):
                self._refused(work_id, result)
        if len(ahead) + len(pool) > 1:
            self.stats.counts[Stat.CLAIM_BATCHES] += 1
            self.stats.counts[Stat.CLAIMS_IN_BATCHES] += len(ahead) + len(pool)
        return committed, ahead, pool, completed

    def _send_opened(self, opened: list[_Opened], now: float) -> None:
        journaled = self.dispatch_log is not None and len(opened) > 1
        if journaled:
            opened = self._journal_dispatches(opened)
        for index, one in enumerate(opened):
            try:
                self._send(*one, now, journaled=journaled)
            except BaseException:
                for txn, _, _, _ in opened[index + 1 :]:
                    self._compensate(txn)
                raise

    def _journal_dispatches(self, opened: list[_Opened]) -> list[_Opened]:
        """The dispatch-log records of `opened`, as ONE journal record (one
        write, one fsync), before any of them is sent; returns those that
        may go on. A fault or an error compensates the dispatches it hit
        (never sent: their undos), as `_send` would."""
        dispatch_log = self.dispatch_log
        assert dispatch_log is not None
        ready = self._past_fault_point(FaultPoint.SEND_AFTER_CLAIM, opened)
        try:
            dispatch_log.reserve_many(
                [(txn, work_id, lease.token) for txn, _, work_id, lease in ready]
            )
        except BaseException as error:
            for txn, _, _, _ in ready:
                self._compensate(txn)
            if not isinstance(error, Exception):
                raise
            for _, worker, work_id, _ in ready:
                self._dispatch_failed(work_id, worker, error)
            return []
        return self._past_fault_point(FaultPoint.SEND_AFTER_JOURNAL, ready)

    def _past_fault_point(self, point: FaultPoint, dispatches: list[_Opened]) -> list[_Opened]:
        """Visit `point` once per dispatch, as `_send` does: one it fires at
        is compensated (never sent) and dropped; an interrupt compensates
        them all and goes up."""
        going: list[_Opened] = []
        for index, one in enumerate(dispatches):
            try:
                self.faults.check(point)
            except BaseException as error:
                self._compensate(one[0])
                if not isinstance(error, Exception):
                    for txn, _, _, _ in [*going, *dispatches[index + 1 :]]:
                        self._compensate(txn)
                    raise
                self._dispatch_failed(one[2], one[1], error)
                continue
            going.append(one)
        return going
