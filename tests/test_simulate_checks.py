"""Each check `simulate` runs after a schedule fires on the bug it is for.

A plausible regression is planted (monkeypatched into the pure core or an
adapter), a few dozen schedules run, and the check must report it. The
coordinator runs on the pure core here in both legs, so a bug planted in
`dispatchtx._core_py` is the one the coordinator meets.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

import dispatchtx.coordinator.loop as loop
from dispatchtx import Compensation, DispatchTables, _core_py
from dispatchtx.fs import Fault, FaultKind, Op, RandomDiskFaults, SimulatedFS
from dispatchtx.jobs import simulate
from dispatchtx.jobs.ledger import CompensationLedger, LedgerTables
from dispatchtx.jobs.resource_check import TrueCounts
from dispatchtx.journal import Event
from dispatchtx.journal import log as journal_log
from dispatchtx.resources import algorithms, journaling, pairing, params, shards
from dispatchtx.store import CommitOutcome, claims, publication
from dispatchtx.store.records import Change, Record

NO_FAILURES: tuple[()] = ()
SCHEDULES = 60


@pytest.fixture(autouse=True)
def pure_core(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(loop, "DispatchTables", _core_py.DispatchTables)
    logging.getLogger("dispatchtx").setLevel(logging.ERROR)
    yield


# A planted bug can livelock a schedule: a few thousand steps show it.
PLANTED_MAX_STEPS = 20_000


def violations(
    match: str | Callable[[str], bool], schedules: int = SCHEDULES, seed: int = 1
) -> list[str]:
    """The violations that `match` (a text in them, or a test) of the first
    schedule that has any: one schedule shows that the check fires."""
    matches = match if callable(match) else lambda violation: match in violation
    for schedule in range(schedules):
        report = simulate.run_schedule(seed, schedule, max_steps=PLANTED_MAX_STEPS)
        found = [v for v in report.violations if matches(v)]
        if found:
            return found
    return []


@dataclass
class CleanRun:
    """What the schedules drew and found on the code as it is (run once)."""

    violations: dict[int, list[str]] = field(default_factory=dict)
    fired: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    moves_checked: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
def clean_run() -> Iterator[CleanRun]:
    run = CleanRun()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "DispatchTables", _core_py.DispatchTables)
        for schedule in range(SCHEDULES):
            report = simulate.run_schedule(1, schedule)
            run.violations[schedule] = report.violations
            run.fired.update(report.fired)
            run.counts.update(report.counts)
            run.moves_checked.append(report.counts["ledger moves checked"])
    yield run


def test_the_checks_pass_the_code_as_it_is(clean_run: CleanRun) -> None:
    assert {s: v[:3] for s, v in clean_run.violations.items() if v} == {}
    assert all(clean_run.moves_checked), clean_run.moves_checked


# -- the compensation ledger ---------------------------------------------------


def test_compensations_run_in_forward_order_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def forward(txn: Any, stack: list[Any], which: int) -> tuple[Any, None]:
        for i in range(0, len(stack), 2):
            fn = stack[i]._callables[which]
            if fn is not None:
                fn(stack[i + 1])
        return NO_FAILURES, None

    monkeypatch.setattr(_core_py, "_run", forward)
    found = violations("compensation ledger")
    assert found, "forward order passed the ledger"
    assert "the design says" in found[0]


def test_a_discard_that_runs_the_before_send_side_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fenced_out(self: Any, dispatch_id: int) -> Any:
        txn = self._find(dispatch_id, _core_py._FENCED_OUT_FROM, "fenced_out")
        del self._txns[txn._id]
        self._unlink_sent(txn)
        self._occupied[txn._worker] -= 1
        self._unlink_worker(txn)
        return self._roll_back(txn, _core_py._BEFORE)

    monkeypatch.setattr(_core_py.DispatchTables, "fenced_out", fenced_out)
    found = violations("compensation ledger: fenced_out")
    assert found and "before_send" in found[0]


def test_a_sweep_that_picks_the_before_send_side_for_a_sent_dispatch_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = _core_py._run

    def run_before(txn: Any, stack: list[Any], which: int) -> Any:
        if which == _core_py._AFTER:
            which = _core_py._BEFORE
        return real(txn, stack, which)

    monkeypatch.setattr(_core_py, "_run", run_before)
    found = violations(
        lambda v: "compensation ledger" in v and ("lose_worker" in v or "shutdown" in v)
    )
    assert found


def test_a_sweep_that_leaves_preparing_dispatches_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def shutdown(self: Any) -> Any:
        victims = [txn for txn in self._txns.values() if txn._phase is _core_py._ACTIVE]
        return self._sweep(victims) if victims else NO_FAILURES

    monkeypatch.setattr(_core_py.DispatchTables, "shutdown", shutdown)
    found = violations("compensation ledger: shutdown left dispatch")
    assert found and "PREPARING" in found[0]


def test_the_schedules_draw_a_stop_signal_while_dispatches_are_preparing(
    clean_run: CleanRun,
) -> None:
    assert clean_run.fired["stop-signal-mid-dispatch"] > 0


def test_the_ledger_passes_each_move_done_right() -> None:
    ledger = CompensationLedger()
    tables: LedgerTables[None] = LedgerTables(DispatchTables(2, max_in_flight=2), ledger)
    ran: list[tuple[str, int]] = []
    first: Compensation[int] = tables.compensation("first", lambda a: ran.append(("undo", a)), None)
    second: Compensation[int] = tables.compensation(
        "second", lambda a: ran.append(("undo", a)), lambda a: ran.append(("discard", a))
    )
    never_sent = tables.prepare(0)
    never_sent.add(first, 1)
    never_sent.add(second, 2)
    tables.abort(never_sent.id)
    sent = tables.prepare(1)
    sent.add(first, 3)
    sent.add(second, 4)
    tables.sent(sent.id, 1.0)
    preparing = tables.prepare(1)
    preparing.add(second, 5)
    tables.shutdown()
    assert ran == [("undo", 2), ("undo", 1), ("undo", 5), ("discard", 4)]
    assert ledger.violations == [] and ledger.moves_checked == 2
    assert ledger.dispatches == {}


# -- the journal against memory ------------------------------------------------


def test_memory_changed_before_its_journal_append_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def apply_then_append(
        self: Any, kind: str, is_release: bool, method: Any, adapter: Any, args: Any
    ) -> Any:
        if self._applying:
            return method(adapter, *args)
        self._applying = True
        try:
            result = method(adapter, *args)
            self._journal.append(Event(kind, list(args)))
        finally:
            self._applying = False
        return result

    monkeypatch.setattr(journaling.AdapterJournal, "_apply", apply_then_append)
    found = violations("journal")
    assert found, "memory ahead of the journal passed"


def test_a_failed_append_left_in_the_file_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def keep_torn_bytes(self: Any, handle: Any, good_size: int) -> None:
        self._poisoned = False

    monkeypatch.setattr(journal_log.Journal, "_cut_back", keep_torn_bytes)
    found = violations("journal")
    assert found, "a torn record left in the journal passed"


class _Unclosable:
    """An append handle that a compaction cannot close or replace."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def test_a_journal_that_keeps_its_handle_after_compaction_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = journal_log.Journal._rewrite

    def rewrite_without_reopen(self: Any) -> None:
        old, fs = self._handle, self._fs
        if old is None:
            return real(self)
        kept = old if isinstance(old, _Unclosable) else _Unclosable(old)
        self._handle = kept

        class OpensNothing:
            def __getattr__(self, name: str) -> Any:
                return getattr(fs, name)

            def open_append(self, path: str) -> Any:
                return kept

        self._fs = OpensNothing()
        try:
            real(self)
        finally:
            self._fs = fs

    monkeypatch.setattr(journal_log.Journal, "_rewrite", rewrite_without_reopen)
    found = violations("journal")
    assert found and "replays to another state" in found[0], found[:1]


def test_the_schedules_draw_faults_on_the_journal_disks(clean_run: CleanRun) -> None:
    fired = clean_run.fired
    assert fired["journal-disk-eio"] and fired["journal-disk-short-write"], fired


# -- each counting resource, re-derived from the moves -------------------------


def test_a_shard_undo_that_keeps_its_lease_count_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def take_back_keeping_the_count(self: Any, shard: str, task: str, dispatch_id: int) -> None:
        self._shards[shard][task].holder = None

    monkeypatch.setattr(shards.ShardLeases, "_ev_take_back", take_back_keeping_the_count)
    found = violations("shards:")
    assert found and "went out" in found[0], found[:1]


def test_an_algorithm_discard_that_rewinds_the_stage_that_ran_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = algorithms.AlgorithmSelector._ev_discard

    def discard_and_rewind(self: Any, token: str) -> None:
        self._stages[self._pending[token].stage].pulls -= 1
        real(self, token)

    monkeypatch.setattr(algorithms.AlgorithmSelector, "_ev_discard", discard_and_rewind)
    found = violations("algorithms:")
    assert found and "went out" in found[0], found[:1]


@pytest.mark.parametrize(
    ("adapter", "name"), [(pairing.SeedPairing, "pairing:"), (params.ParameterBandit, "params:")]
)
def test_an_adapter_discard_that_runs_its_undo_is_caught(
    monkeypatch: pytest.MonkeyPatch, adapter: type[Any], name: str
) -> None:
    monkeypatch.setattr(adapter, "discard", adapter.undo)
    found = violations(name)
    assert found and "a discard keeps it" in found[0], found[:1]


def test_true_counts_follow_undo_discard_and_release() -> None:
    ledger = CompensationLedger()
    tables: LedgerTables[None] = LedgerTables(DispatchTables(1, max_in_flight=3), ledger)
    leases = shards.ShardLeases(cast(DispatchTables[Any], tables))
    leases.add_task("s", "t")
    count = TrueCounts(
        leases.name,
        lambda lease: (lease.shard, lease.task),
        lambda key: leases.lease_count(*key),
        lambda key: leases.failure_count(*key),
    )
    ledger.observers[leases.name] = count
    for end in ("abort", "fenced_out", "finished"):
        txn = tables.prepare(0)
        leases.reserve(cast(Any, txn), "s", "t")
        if end == "abort":
            tables.abort(txn.id)
            continue
        tables.sent(txn.id, 1.0)
        if end == "fenced_out":
            tables.fenced_out(txn.id)
        else:
            tables.fence_passed(txn.id)
            tables.finished(txn.id)
    assert count.counted[("s", "t")] == 2 and count.discarded[("s", "t")] == 1
    assert count.problems() == []
    leases._shards["s"]["t"].leases += 1  # an adapter off by one
    assert count.problems() and "counts 3 dispatches, but 2 went out" in count.problems()[0]


# -- the store's chains and who acts on them -------------------------------------


def test_owner_effects_applied_by_a_peer_rolling_forward_are_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = loop.Coordinator._triage

    def always_as_owner(self: Any, committed: Any, *, owner: bool) -> None:
        real(self, committed, owner=True)

    monkeypatch.setattr(loop.Coordinator, "_triage", always_as_owner)
    found = violations("applied the owner's local effects")
    assert found and "whose commit is" in found[0], found[:1]


def test_the_schedules_pause_a_coordinator_mid_commit_and_its_peer_rolls_forward(
    clean_run: CleanRun,
) -> None:
    fired, counts = clean_run.fired, clean_run.counts
    assert fired["coordinator-paused-in-begin-commit"] and fired["coordinator-paused-in-complete"]
    assert counts["rolled forward for a peer"] > 0, counts
    # Some pauses end the moment the peer claims the paused item, so that the
    # paused coordinator resumes with the peer's claim at the chain's head.
    assert counts["pauses ended by a takeover"] > 0, counts


def test_a_fence_that_takes_a_token_other_than_the_head_claims_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = claims.WorkStore.begin_commit

    def commit_after_whatever_heads_the_chain(
        self: Any, work_id: str, token: int, result: bytes
    ) -> CommitOutcome:
        outcome = real(self, work_id, token, result)
        key = self._key(work_id)
        chain = self._chain(key)
        if outcome is not CommitOutcome.FENCED_OUT or chain[-1].change is not Change.CLAIM:
            return outcome
        # The planted bug: the commit goes after a peer's newer claim.
        record = self._record(
            key, len(chain) + 1, Change.COMMIT, token, self.owner,
            object_id=self.objects.put(result), size=len(result),
        )  # fmt: skip
        published = self._publish(key, record, "begin_commit")
        return CommitOutcome.COMMITTED if published.ours else outcome

    monkeypatch.setattr(claims.WorkStore, "begin_commit", commit_after_whatever_heads_the_chain)
    assert violations(lambda v: "cannot follow" in v or "other than the head claim's" in v)


def test_a_claim_decided_from_an_absent_read_back_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = publication.SlotChains._link_publish

    def link_publish(
        self: Any, action: str, path: str, directory: str, data: bytes, nonce: str, read: Any
    ) -> Any:
        def read_taking_absent_for_ours() -> Any:
            try:
                return read()
            except FileNotFoundError:  # the planted bug: the slot must hold what we wrote
                if "/slots/" not in path:
                    return nonce
                key, slot = path.split("/")[-1].split(".")[0], int(path.rsplit(".", 1)[1])
                return Record.decode(data, path, key, slot)

        return real(self, action, path, directory, data, nonce, read_taking_absent_for_ours)

    monkeypatch.setattr(publication.SlotChains, "_link_publish", link_publish)
    found = violations("acted on its claim")
    assert found and "but slot" in found[0], found[:1]


def test_incarnations_taken_out_of_order_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real = claims.WorkStore.register

    def register_not_made_durable(self: Any, coordinator_id: str) -> int:
        fs, fsync_dir = self._fs, type(self._fs).fsync_dir
        fs.fsync_dir = lambda d: None if d == self._incarnations else fsync_dir(fs, d)
        try:
            return real(self, coordinator_id)
        finally:
            del fs.fsync_dir

    monkeypatch.setattr(claims.WorkStore, "register", register_not_made_durable)
    found = violations("incarnations out of order")
    assert found and "started as incarnation" in found[0], found[:1]


def test_a_real_miss_is_cached_for_its_path_only() -> None:
    faults = RandomDiskFaults(random.Random(0), 0.0, absent_repeats=2, miss_cached=1.0)
    fs = SimulatedFS(fault=faults)
    fs.on_miss = faults.cache_miss
    fs.mkdir("/d")
    assert not fs.exists("/d/a")  # a real miss, cached
    temp = fs.write_temp("/d", b"x")
    fs.link(temp, "/d/a")  # a peer creates it
    assert fs.read(temp) == b"x"  # another path: not cached
    with pytest.raises(FileNotFoundError):
        fs.read("/d/a")
    assert not fs.exists("/d/a")  # still cached "absent"
    with pytest.raises(FileExistsError):
        fs.link(temp, "/d/a")  # while a link onto it meets it
    assert fs.read("/d/a") == b"x"  # the cache entry expired
    assert faults.fired["disk-stale-absent"] == 2


def test_a_sticky_stale_absent_repeats_for_its_path_only() -> None:
    faults = RandomDiskFaults(
        random.Random(0), 1.0, {Op.READ: (FaultKind.STALE_ABSENT,)}, absent_repeats=2
    )
    assert faults(Op.READ, "/a") == Fault(FaultKind.STALE_ABSENT)
    faults.rate = 0.0
    assert faults(Op.READ, "/b") is None
    assert faults(Op.EXISTS, "/a") == Fault(FaultKind.STALE_ABSENT)
    assert faults(Op.READ, "/a") == Fault(FaultKind.STALE_ABSENT)
    assert faults(Op.READ, "/a") is None
    assert faults.fired["disk-stale-absent"] == 3
