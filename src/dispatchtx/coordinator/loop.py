"""The coordinator ("master"): dispatch through the tables, fence results in
the shared store, triage inside the committing boundary, roll forward what
others left COMMITTING (docs/design.md).

It never calls mpi4py itself: it talks to a `Transport` (MPI or the
simulator), so the simulator runs this very code. Time comes from the
transport's clock; the store and the journal reach the disk through `fs`.

One pass of `step()`:
1. retry the triage of dispatches parked COMMITTING;
2. dispatch to every free worker: claim the item in the store, reserve every
   resource through its adapter inside `tables.dispatch()`, build the
   message (object contents only for ids the worker lacks), send, `sent()`;
3. take results: `match`, `begin_commit` (the fence), then triage in
   `tables.committing()`; a fenced-out result runs the after-send discards;
4. find hung workers by their deadline and `lose_worker` them;
5. heartbeat the leases held, and roll forward items a stalled peer (or an
   earlier incarnation of this coordinator) left COMMITTING.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from dispatchtx import (
    DispatchTables,
    Phase,
    Transaction,
)
from dispatchtx.coordinator.config import CoordinatorConfig
from dispatchtx.coordinator.faults import FaultPlan, FaultPoint
from dispatchtx.coordinator.fence import _AwaitingDone
from dispatchtx.coordinator.passes import Passes, claim_made
from dispatchtx.coordinator.recovery import Committed
from dispatchtx.coordinator.stats import REFUSED_BY_OUTCOME, CoordinatorStats, Stat
from dispatchtx.coordinator.workers import Strikes
from dispatchtx.coordinator.workload import UNCLAIMED, DispatchTag, Workload
from dispatchtx.fs import FS
from dispatchtx.resources import Leak
from dispatchtx.resources.dispatch_log import DispatchLog
from dispatchtx.resources.journaling import AdapterJournal
from dispatchtx.resources.lease import ClaimRefused, WorkLease, WorkLeases
from dispatchtx.store import (
    ClaimOutcome,
    ClaimResult,
    CompleteOutcome,
    CorruptRecord,
    OutcomeUnknown,
    StoreError,
    StoreIOError,
    WorkStore,
)
from dispatchtx.transport import Result, Transport, Work

__all__ = ["Coordinator", "CoordinatorConfig", "DispatchTag", "Workload"]

log = logging.getLogger("dispatchtx.coordinator")

# Dispatch ids of incarnation n start at n << ID_SHIFT: a restarted
# coordinator never reuses one.
ID_SHIFT = 40


class Coordinator(Passes):
    """One coordinator incarnation."""

    def __init__(
        self,
        config: CoordinatorConfig,
        transport: Transport,
        store: WorkStore,
        workload: Workload,
        *,
        faults: FaultPlan | None = None,
        journal_fs: FS | None = None,
        wrap_tables: Callable[[DispatchTables[DispatchTag]], DispatchTables[DispatchTag]]
        | None = None,
    ) -> None:
        self.config = config
        self.transport = transport
        self.store = store
        self.workload = workload
        self.faults = faults or FaultPlan.none()
        self.incarnation = store.register(config.coordinator_id)
        self.tables: DispatchTables[DispatchTag] = DispatchTables(
            transport.n_workers,
            max_in_flight=config.max_in_flight,
            first_id=self.incarnation << ID_SHIFT,
        )
        if wrap_tables is not None:  # a checker in front of the tables (the simulator's ledger)
            self.tables = wrap_tables(self.tables)
        self.leases = WorkLeases(self.tables, store)
        self.dispatch_log: DispatchLog | None = None
        self.journal: AdapterJournal | None = None
        if config.journal_path is not None:
            if journal_fs is None:
                raise ValueError("a journal_path needs the journal_fs it lives on")
            self.dispatch_log = DispatchLog(self.tables)
            self.journal = AdapterJournal(
                journal_fs, config.journal_path, [self.dispatch_log], policy=config.journal_policy
            )
        # The item itself is a reservation: given back to the workload by the
        # undo and the discard, marked done on commit.
        self._item = self.tables.compensation(
            "work-item", workload.give_back, workload.give_back, workload.done
        )
        # So is a worker's slot: free again when the dispatch is compensated
        # (unless the worker is lost) or passes the fence (its result is in).
        self._slot = self.tables.compensation("worker-slot", self._free_slot, self._free_slot)
        self._free_slots: deque[int] = deque(
            worker for _ in range(config.max_in_flight) for worker in range(transport.n_workers)
        )
        self.stats = CoordinatorStats()
        self.lost_workers: set[int] = set()
        # CPU seconds workers spent on runs whose results were not committed
        # (stale, fenced out, failed): the price of duplicate execution.
        self.wasted_cpu_seconds = 0.0
        self._recently_committed: set[int] = set()
        self._committed_order: deque[int] = deque()
        self._strikes = Strikes(config.strikes)
        self._committed: dict[int, Committed] = {}  # COMMITTING dispatches' results
        self._parked: list[int] = []  # COMMITTING dispatches whose triage failed
        # Results held back by the STALE_RESULT fault point, until past their deadline.
        self._held_back: deque[tuple[float, int, Result | bytes]] = deque()
        self._next_heartbeat = float("-inf")
        # A fence attempt that stored nothing (a full disk) pauses new claims
        # for a while, doubling while the store keeps failing.
        self._store_failures_in_row = 0
        self._awaiting_done: list[_AwaitingDone] = []
        self._last_pass_sent = True
        self._dispatch_paused_until = float("-inf")
        self._recovered = False
        # The first look for items to roll forward reads every item: after a
        # power loss the "maybe committing" marks may be gone.
        self._full_look_due = True
        self._orphan_wait: tuple[float, int] | None = None
        self._orphans_given_up: set[str] = set()
        interval = config.heartbeat_every
        self._heartbeat_every = store.ttl / 3 if interval is None else interval
        # The main thread holds this lock except while user triage code runs;
        # the heartbeat thread takes it to touch the store and the leases.
        self._lock = threading.Lock()
        self._lock.acquire()
        # The workload's own set-up, before any thread runs: if it raises,
        # nothing of this incarnation is left running.
        workload.attach(self.tables, self.dispatch_log)
        self._stop_beating = threading.Event()
        self._beater: threading.Thread | None = None
        if config.background_heartbeat:
            self._beater = threading.Thread(
                target=self._beat_in_background, name="dispatchtx-heartbeat", daemon=True
            )
            self._beater.start()

    def _beat_in_background(self) -> None:
        while not self._stop_beating.wait(self._heartbeat_every):
            with self._lock:
                self.stats.counts[Stat.BACKGROUND_HEARTBEATS] += 1
                self._heartbeat()

    def stop_heartbeats(self) -> None:
        """Stop the heartbeat thread (shutdown does)."""
        self._stop_beating.set()
        if self._beater is not None and self._beater is not threading.current_thread():
            self._lock.release()
            try:
                self._beater.join()
            finally:
                self._lock.acquire()

    # -- the loop ------------------------------------------------------------

    @property
    def recovering(self) -> bool:
        """Whether the first look at every item of the store (for what an
        earlier incarnation left COMMITTING) has yet to succeed."""
        return self._full_look_due

    @property
    def idle(self) -> bool:
        """Every item done or dropped, nothing in flight, and what an earlier
        incarnation left COMMITTING looked for: nothing left to step for."""
        return not (self.workload.remaining() or len(self.tables) or self._full_look_due)

    def run(self, *, max_steps: int | None = None) -> None:
        """Step until `idle`."""
        steps = 0
        while not self.idle:
            self.step()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"not done after {steps} steps: {self.tables!r}")

    def step(self) -> None:
        if not self._recovered:
            self.roll_forward()
            self._close_stale_entries()
            self._recovered = True
        self._retry_parked()
        batch = self.config.commit_batch
        if batch > 1:
            self._grouped_pass(batch)
        else:
            self._dispatch_to_free_workers()
            for worker, message in self.transport.poll(self.config.poll_timeout):
                self._fence_batch([(worker, one) for one in self._deliveries(worker, message)])
        now = self.transport.now()
        released: list[tuple[int, Result | bytes]] = []
        while self._held_back and self._held_back[0][0] <= now:
            _, worker, message = self._held_back.popleft()
            released.append((worker, message))
        if released:
            self._fence_batch(released)
        self._sweep_lost_workers(now)
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self._heartbeat_every
            self._heartbeat()
            self.roll_forward()
            self._close_stale_entries()

    def shutdown(self) -> None:
        """Compensate every PREPARING and ACTIVE dispatch, finish what is
        COMMITTING (or leave it to recovery if its triage keeps failing),
        and stop the workers."""
        late = [(worker, message) for _, worker, message in self._held_back]
        self._held_back.clear()
        if late:  # late answers still on their way arrive now
            self._fence_batch(late)
        self._flush_awaiting_done()
        failures = self.tables.shutdown()
        self.stats.counts[Stat.COMPENSATION_FAILURES] += len(failures)
        for _ in range(3):  # entries an earlier incarnation left, if any remain
            if self.dispatch_log is None or not self.dispatch_log.stale():
                break
            self._close_stale_entries()
        for failure in failures:
            log.warning("shutdown: %s", failure)
        self._retry_parked()
        self.stop_heartbeats()
        self.transport.stop_workers()

    # -- dispatching ---------------------------------------------------------

    def _free_slot(self, worker: int) -> None:
        if worker not in self.lost_workers:
            self._free_slots.append(worker)

    def _dispatch_to_free_workers(self) -> None:
        # O(dispatches made): free slots are kept, never searched for. A slot
        # given back in this pass (a refused claim) waits for the next one.
        # The `done`s of the last poll's group go with the first group of
        # claims, or on their own when no group is made.
        if self._dispatch_paused_until <= self.transport.now():
            budget = len(self._free_slots)
            batch = self.config.commit_batch
            while budget > 0:
                wanted = min(batch, budget)
                pairs = self._take_pairs(wanted)
                budget -= len(pairs)
                if pairs:
                    self._dispatch_batch(pairs)
                if len(pairs) < wanted:
                    break  # out of free workers or of startable items
        # (Else the store failed to take results: no new claims for now.)
        self._flush_awaiting_done()

    def _take_pairs(self, wanted: int) -> list[tuple[int, str]]:
        """Up to `wanted` (free worker, next item) pairs; fewer when either
        runs out."""
        pairs: list[tuple[int, str]] = []
        free = self._free_slots
        while free and len(pairs) < wanted:
            worker = free.popleft()
            if worker in self.lost_workers:
                continue  # a slot freed before its worker was lost: drop it
            work_id = self.workload.take()
            if work_id is None:
                free.appendleft(worker)
                break
            pairs.append((worker, work_id))
        return pairs

    def _dispatch_batch(self, pairs: list[tuple[int, str]]) -> None:
        """The claims of `pairs` in one store batch; only once they are
        durable is any of them sent."""
        now = self.transport.now()
        opened: list[tuple[Transaction[DispatchTag], int, str, WorkLease]] = []
        ahead: list[tuple[str, int]] = []
        awaiting = self._take_awaiting_done()
        dones: list[CompleteOutcome | Exception] = []
        next_pair = 0
        try:
            with self.store.batch():
                if len(pairs) > 1 or awaiting:
                    ahead, dones = self._claim_ahead(pairs, now, awaiting)
                for worker, work_id in pairs:
                    next_pair += 1
                    one = self._open(worker, work_id, now)
                    if one is not None:
                        opened.append(one)
        except (OutcomeUnknown, StoreIOError) as error:
            # The batch's fsync failed: send none of it. Abandoning each claim
            # publishes after it, and that fsync makes both durable or fails.
            self.stats.counts[Stat.CLAIM_BATCHES_FAILED] += 1
            log.info("a group of claims did not become durable; none is sent: %s", error)
            for txn, _, _, _ in opened:
                self._compensate(txn)
            # Their `done`s are not known durable: each is settled by a retry.
            self._finish_awaiting_done(awaiting, [error] * len(awaiting))
            return
        except BaseException:
            # An interrupt: what was opened is compensated (as the dispatch
            # boundary does), what was taken and not opened is given back.
            self._give_back_pairs(pairs[next_pair:])
            for txn, _, _, _ in opened:
                self._compensate(txn)
            self._awaiting_done[:0] = awaiting  # still to settle (shutdown does)
            raise
        finally:
            self._abandon_unused(ahead, opened)
        self._finish_awaiting_done(awaiting, dones)  # durable now: released
        if len(opened) > 1:
            self.stats.counts[Stat.CLAIM_BATCHES] += 1
            self.stats.counts[Stat.CLAIMS_IN_BATCHES] += len(opened)
        self._send_opened(opened, now)

    def _claim_ahead(
        self, pairs: list[tuple[int, str]], now: float, awaiting: list[_AwaitingDone]
    ) -> tuple[list[tuple[str, int]], list[CompleteOutcome | Exception]]:
        """Claim the items of `pairs` together, and publish the `done`s
        `awaiting`, as one group (`claim_and_complete`: one file for all
        their records). Each `_open` then adopts its item's claim (the store
        answers ALREADY_HELD). Returns the claims made here, (work id, token),
        and the outcome of each `done`. A failure here is no failure of the
        pass: `_open` claims on its own, and a `done` without a plain answer
        is settled by a retry."""
        completions = [(committed.work_id, committed.token) for _, committed, _ in awaiting]
        try:
            results, dones = self.store.claim_and_complete(
                [work_id for _, work_id in pairs], completions, now
            )
        except Exception as error:  # the group as a whole: each is tried alone
            log.info("a group of claims failed, claiming one by one: %s", error)
            return [], [error] * len(awaiting)
        made = [
            claim_made(work_id, result) for (_, work_id), result in zip(pairs, results, strict=True)
        ]
        return [claim for claim in made if claim is not None], dones

    def _abandon_unused(
        self,
        ahead: list[tuple[str, int]],
        opened: list[tuple[Transaction[DispatchTag], int, str, WorkLease]],
    ) -> None:
        """Give back a claim made ahead that no dispatch took (its `_open`
        failed before the claim): never sent, so it counts towards nothing."""
        leased = {work_id for _, _, work_id, _ in opened}
        for work_id, token in ahead:
            if work_id in leased or self.leases.held(work_id) is not None:
                continue
            try:
                self.store.abandon(work_id, token, sent=False)
            except Exception as error:  # left to expire, as an undo that failed
                self.stats.counts[Stat.COMPENSATION_FAILURES] += 1
                log.warning("a claim made ahead of %r was not given back: %s", work_id, error)

    def _open(
        self, worker: int, work_id: str, now: float
    ) -> tuple[Transaction[DispatchTag], int, str, WorkLease] | None:
        """Prepare a dispatch to `worker` and claim `work_id` for it; None if
        the item cannot be claimed or anything failed (compensated)."""
        slot_registered = item_registered = False
        txn: Transaction[DispatchTag] | None = None
        try:
            txn = self.tables.prepare(worker, tag=DispatchTag(work_id, UNCLAIMED))
            txn.add(self._slot, worker)
            slot_registered = True
            txn.add(self._item, work_id)
            item_registered = True
            try:
                lease = self.leases.reserve(txn, work_id, now)
            except ClaimRefused as refused:
                self.tables.abort(txn.id)  # gives the slot and the item back
                self._refused(work_id, refused.result)
                return None
            txn.tag = DispatchTag(work_id, lease.token)
            return txn, worker, work_id, lease
        except BaseException as error:
            if txn is not None and slot_registered:
                self._compensate(txn)  # the undos registered so far
            else:
                self._free_slot(worker)
                if txn is not None and self.tables.get(txn.id) is txn:
                    self.tables.abort(txn.id)  # nothing registered to run
            if not item_registered:
                self.workload.give_back(work_id)
            if not isinstance(error, Exception):
                raise
            self._dispatch_failed(work_id, worker, error)
            if isinstance(error, CorruptRecord):
                # Its chain cannot be read: a claim would fail again, forever.
                self.stats.counts[Stat.CORRUPT_ITEMS_DROPPED] += 1
                self.workload.drop(work_id, "corrupt")
            return None

    def _send(
        self,
        txn: Transaction[DispatchTag],
        worker: int,
        work_id: str,
        lease: WorkLease,
        now: float,
        *,
        journaled: bool = False,
    ) -> None:
        """Reserve the rest, build the message, send, `sent()`. Anything that
        fails compensates: the undos if it was never sent, the discards if it
        was (an ambiguous send), as the `tables.dispatch()` boundary does.
        `journaled`: its dispatch-log record was made already, with those of
        the other dispatches of its pass (`_journal_dispatches`)."""
        faults = self.faults
        try:
            if not journaled:
                faults.check(FaultPoint.SEND_AFTER_CLAIM)
                if self.dispatch_log is not None:
                    self.dispatch_log.reserve(txn, work_id, lease.token)
                    faults.check(FaultPoint.SEND_AFTER_JOURNAL)
            payload, object_ids = self.workload.reserve(txn, worker, work_id)
            faults.check(FaultPoint.SEND_AFTER_RESERVATIONS)
            missing = self.tables.missing(worker, object_ids)
            txn.ship(missing)
            faults.check(FaultPoint.MESSAGE_BUILD)
            work = Work(
                txn.id,
                work_id,
                lease.token,
                payload,
                {oid: self.workload.object_content(oid) for oid in missing},
            )
            if missing:
                faults.check(FaultPoint.OBJECT_TRANSFER)
            faults.check(FaultPoint.SEND)
            self.transport.send(worker, work)
            self.tables.sent(txn.id, now)
            self.stats.counts[Stat.DISPATCHES] += 1
            self.stats.counts[Stat.OBJECTS_SHIPPED] += len(missing)
            if faults.fires(FaultPoint.AMBIGUOUS_SEND):
                # Delivered, but the coordinator saw an error: the dispatch
                # is ACTIVE, so it is discarded after send.
                raise ConnectionError("injected: ambiguous send")
        except BaseException as error:
            self._compensate(txn)
            if not isinstance(error, Exception):
                raise
            self._dispatch_failed(work_id, worker, error)

    def _compensate(self, txn: Transaction[DispatchTag]) -> None:
        """A dispatch that failed before it was settled: undo it if it was
        never sent, discard it if it was."""
        if txn.phase is Phase.PREPARING:
            failures = self.tables.abort(txn.id)
        elif txn.phase is Phase.ACTIVE:
            failures = self.tables.fenced_out(txn.id)
        else:
            return
        self.stats.counts[Stat.COMPENSATION_FAILURES] += len(failures)
        for failure in failures:
            log.info("compensating a failed dispatch: %s", failure)

    def _dispatch_failed(self, work_id: str, worker: int, error: Exception) -> None:
        self.stats.counts[Stat.DISPATCH_FAILURES] += 1
        log.info("dispatch of %r to worker %d failed: %s", work_id, worker, error)

    def _refused(self, work_id: str, result: ClaimResult | None) -> None:
        """The item could not be claimed: the store's answer says whether it
        is finished (None: this coordinator leases it already)."""
        if result is None:
            self.stats.counts[Stat.REFUSED_HELD_HERE] += 1
            return
        # A claim without a token (which the store never returns) is taken
        # as "not claimable now".
        self.stats.counts[REFUSED_BY_OUTCOME.get(result.outcome, Stat.REFUSED_BUSY)] += 1
        if result.outcome is ClaimOutcome.DONE:
            self.workload.done(work_id)
        elif result.outcome is ClaimOutcome.QUARANTINED:
            self.workload.drop(work_id, "quarantined")

    # -- lost workers, heartbeats, recovery ------------------------------------

    def _sweep_lost_workers(self, now: float) -> None:
        expired = list(self.tables.sent_before(now - self.config.deadline))
        if expired and self.config.commit_batch > 1:
            # The grouped pass sends after its poll: answers that came in
            # during a long send are held by the transport, not yet heard.
            # Take them in before calling any dispatch unanswered.
            self._take_in_arrived()
            expired = list(self.tables.sent_before(now - self.config.deadline))
        lost = set(self.transport.take_lost_workers())
        for txn in expired:
            if txn.worker in lost or self.tables.get(txn.id) is None:
                continue
            if txn.worker in self.lost_workers:  # cannot happen; never leave one hanging
                self._fenced_out(txn.id)
                continue
            if self._strikes.missed(txn.worker, txn.sent_at):
                lost.add(txn.worker)
            else:
                self.stats.counts[Stat.DEADLINES_MISSED] += 1
                self._fenced_out(txn.id)
        for worker in sorted(lost - self.lost_workers):
            self.lost_workers.add(worker)
            self.stats.counts[Stat.WORKERS_LOST] += 1
            failures = self.tables.lose_worker(worker)
            self.stats.counts[Stat.COMPENSATION_FAILURES] += len(failures)
            log.warning("worker %d lost; its dispatches were compensated", worker)

    def _take_in_arrived(self) -> None:
        """Fence what the transport already holds, without waiting."""
        self._fence_in_groups(self.transport.poll(0.0))

    def readmit(self, worker: int) -> None:
        """A lost worker is back (restarted by its launcher, or it answered
        after all): give it its slots again, with an empty object cache."""
        if worker not in self.lost_workers:
            return
        self.lost_workers.discard(worker)
        self._strikes.forgive(worker)
        # Its stale free slots are still queued: count them, and add the rest.
        occupied = sum(1 for txn in self.tables.in_flight(worker) if txn.phase.value <= 1)
        queued = self._free_slots.count(worker)
        self._free_slots.extend([worker] * (self.config.max_in_flight - occupied - queued))
        self.stats.counts[Stat.WORKERS_READMITTED] += 1

    def _heartbeat(self) -> None:
        try:
            lost = self.leases.heartbeat_all()
        except StoreError as error:  # advisory: the next round tries again
            self.stats.counts[Stat.HEARTBEAT_FAILURES] += 1
            log.info("heartbeat failed: %s", error)
            return
        self.stats.counts[Stat.LEASES_FOUND_LOST] += len(lost)

    # -- audit ---------------------------------------------------------------------

    def leaks(self) -> list[Leak]:
        """What this coordinator and its workload's adapters still hold:
        empty once every dispatch ended."""
        leaks = self.leases.leaks()
        if self.dispatch_log is not None:
            leaks.extend(self.dispatch_log.leaks())
        leaks.extend(
            Leak("tables", "dispatch", f"{txn.id}:{txn.phase.name}", txn.id)
            for txn in self.tables.in_flight()
        )
        leaks.extend(self.workload.leaks())
        return leaks
