"""The local adapters kept in the local work journal (resources/journaling.py)
and the dispatch history (resources/dispatch_log.py), on the simulated disk
(docs/design.md "Local work journal", §6 fault points 4 and 6). Each test is
named by the rule it checks."""

from __future__ import annotations

import copy
import errno
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx import CompensationError, DispatchTables, Phase, Transaction
from dispatchtx.fs import (
    CrashKind,
    DiskFaultPlan,
    Fault,
    FaultKind,
    FaultRule,
    Op,
    SimulatedCrash,
    SimulatedFS,
)
from dispatchtx.journal import Event, FsyncPolicy, Journal, JournalCorrupt, JSONValue, json_model
from dispatchtx.resources import (
    NEVER_SENT,
    OWNER_RESTARTED,
    RESULT_UNTRUSTED,
    AdapterJournal,
    AlgorithmSelection,
    AlgorithmSelector,
    DispatchEntry,
    DispatchLog,
    JournaledResource,
    Leak,
    NotReserved,
    ObjectCache,
    ParameterAssignment,
    ParameterBandit,
    ProposalBoard,
    ProposalTicket,
    ReleaseNotJournaled,
    SeedPairing,
    ShardLeases,
    SnapshotError,
    TargetRegistry,
    Unavailable,
    all_leaks,
    release_events,
    replay_adapters,
)

DIRECTORY = "/coordinator"
PATH = DIRECTORY + "/local.journal"

EVERY = FsyncPolicy.EVERY
GROUP = FsyncPolicy.GROUP
NONE = FsyncPolicy.NONE
ALL_POLICIES = (EVERY, GROUP, NONE)

STAGES = ("det", "havoc", "splice")
SEEDS = tuple(f"seed{i}" for i in range(4))

State = dict[str, Any]


def new_fs() -> SimulatedFS:
    fs = SimulatedFS()
    fs.mkdir(DIRECTORY)
    return fs


def fail_at(op: Op, fault: Fault, nth: int | None = 0) -> DiskFaultPlan:
    return DiskFaultPlan(FaultRule(fault, op=op, nth=nth))


EIO = Fault(FaultKind.EIO)
ENOSPC = Fault(FaultKind.ENOSPC)


def out_of_step(journal: AdapterJournal) -> bool:
    # A function, not the property, so that the type checker does not carry
    # one assert's narrowing over to the next look.
    return journal.out_of_step


def closed(journal: AdapterJournal) -> bool:
    return journal.closed


def records(fs: SimulatedFS) -> list[dict[str, Any]]:
    """The records of the volatile file, without their checksums."""
    return [json.loads(line.partition(b" ")[2]) for line in fs.read(PATH).splitlines()]


def event_kinds(fs: SimulatedFS) -> list[str]:
    return [record["kind"] for record in records(fs) if "kind" in record]


# -- a coordinator's local adapters, reserved the way a coordinator would -----


@dataclass
class Dispatched:
    """What one dispatch reserved."""

    work_id: str
    token: int
    assignment: ParameterAssignment
    selection: AlgorithmSelection
    ticket: ProposalTicket | None


class Coordinator:
    """Every local adapter, configured before the journal opens (so the
    configuration reaches the file through the opening snapshot)."""

    def __init__(self, seed: int = 7, n_workers: int = 3) -> None:
        tables = self.tables = DispatchTables(n_workers)
        self.targets = TargetRegistry(tables)
        self.shards = ShardLeases(tables)
        self.params = ParameterBandit(
            tables, {"fast": {"t": 1}, "deep": {"t": 9}}, policy="thompson", seed=seed
        )
        self.algorithms = AlgorithmSelector(tables, STAGES, seed=seed, rewind_depth=4)
        self.pairing = SeedPairing(tables)
        self.proposals = ProposalBoard(tables, max_attempts=2)
        self.cache = ObjectCache(tables)
        self.log = DispatchLog(tables)
        for target in ("t0", "t1"):
            self.targets.add_target(target, group="fuzz", capacity=2)
        for shard in ("s0", "s1"):
            for task in ("a", "b", "c"):
                self.shards.add_task(shard, task)
        for i in range(6):
            self.proposals.propose(f"p{i}", {"input": i})
        self.dispatched: dict[int, Dispatched] = {}
        self.results: dict[int, float] = {}  # dispatch id -> reward, once fenced in
        self.items = 0  # work items handed out; item n is claimed with token n
        self._journal: AdapterJournal | None = None

    @property
    def adapters(self) -> list[JournaledResource]:
        return [
            self.targets,
            self.shards,
            self.params,
            self.algorithms,
            self.pairing,
            self.proposals,
            self.cache,
            self.log,
        ]

    @property
    def journal(self) -> AdapterJournal:
        assert self._journal is not None, "open the journal first"
        return self._journal

    def open(
        self, fs: SimulatedFS, policy: FsyncPolicy = EVERY, compact_every: int | None = None
    ) -> AdapterJournal:
        self._journal = AdapterJournal(
            fs, PATH, self.adapters, policy=policy, compact_every=compact_every
        )
        return self._journal

    def state(self) -> State:
        """Every adapter's snapshot. Snapshots are JSON already and built
        afresh (what they share with the adapter, no event changes)."""
        return {adapter.name: adapter.snapshot() for adapter in self.adapters}

    def leaks(self) -> list[Leak]:
        return all_leaks(self.adapters)

    # -- dispatching ----------------------------------------------------------

    def reserve(self, txn: Transaction) -> Dispatched:
        self.items += 1
        work_id, token = f"item{self.items}", self.items
        self.targets.reserve(txn, "fuzz")
        self.shards.reserve(txn, f"s{txn.worker % 2}")
        assignment = self.params.reserve(txn)
        selection = self.algorithms.reserve(txn)
        seed = self.pairing.least_assigned(SEEDS, txn.worker)
        if seed is None:
            raise Unavailable("no free seed")
        self.pairing.reserve(txn, seed)
        ticket = self.proposals.reserve(txn) if self.proposals.pending() else None
        self.cache.reserve(txn, [seed, "dict"])
        self.log.reserve(txn, work_id, token)
        return Dispatched(work_id, token, assignment, selection, ticket)

    def send(self, txn: Transaction) -> None:
        # Nothing is sent whose records a power loss could still take away.
        if self._journal is not None and self.journal.policy is not NONE:
            assert self.journal.unsynced == 0 and not self.journal.in_group
        self.tables.sent(txn.id, float(txn.id))

    def dispatch(self, worker: int, *, send_fails: bool = False) -> int | None:
        """One dispatch through the D8 boundary; None if its send failed."""
        try:
            with self.tables.dispatch(worker) as txn:
                self.dispatched[txn.id] = self.reserve(txn)
                if send_fails:
                    raise ConnectionError("send failed")  # the boundary undoes at once
                self.send(txn)
        except ConnectionError:
            return None
        return txn.id

    def dispatch_group(self, workers: Sequence[int]) -> list[int]:
        """Reserve for several dispatches in one journal group; send none of
        them before the group's exit made their records durable."""
        txns: list[Transaction] = []
        try:
            with self.journal.group():
                for worker in workers:
                    txn = self.tables.prepare(worker)
                    txns.append(txn)
                    self.dispatched[txn.id] = self.reserve(txn)
        except Exception:
            for txn in txns:
                self.tables.abort(txn.id)
            raise
        for txn in txns:
            self.send(txn)
        return [txn.id for txn in txns]

    def triage(self, dispatch_id: int, reward: float) -> None:
        """The owner's local effects, once per (item, commit slot), then the
        releases on commit."""
        plan = self.dispatched[dispatch_id]
        # A retry reruns triage from the result stored with the commit.
        reward = self.results.setdefault(dispatch_id, reward)
        slot = plan.token + 1  # the commit slot follows the claim
        with self.tables.committing(dispatch_id):
            if not self.log.applied(plan.work_id, slot):
                self.params.observe(plan.assignment.token, reward)
                self.algorithms.feedback(plan.selection.token, reward)
                if plan.ticket is not None:
                    self.proposals.verdict(plan.ticket.proposal_id, accepted=reward > 0.5)
                self.log.mark_applied(plan.work_id, slot)

    def phase(self, dispatch_id: int | None) -> Phase | None:
        return None if dispatch_id is None else self.tables.phase_of(dispatch_id)

    def finish_everything(self) -> None:
        """Shut down, then finish every dispatch left COMMITTING."""
        self.tables.shutdown()
        for txn in list(self.tables.in_flight()):
            self.triage(txn.id, 1.0)


def reopened(fs: SimulatedFS, policy: FsyncPolicy = EVERY) -> Coordinator:
    """A restarted coordinator: new adapters, rebuilt from the journal."""
    fresh = Coordinator(seed=99)  # a different seed: the state must come from the file
    fresh.open(fs, policy)
    return fresh


def disk_image(fs: SimulatedFS, kind: CrashKind) -> SimulatedFS:
    """A new disk holding the journal file as a crash now would leave it. The
    file is read around the fault plan, so that the plan's count stays."""
    if kind is CrashKind.POWER:
        data = fs.durable_read(PATH) if fs.durable_exists(PATH) else b""
    else:
        plan, fs.fault = fs.fault, None
        try:
            data = fs.read(PATH)
        finally:
            fs.fault = plan
    image = new_fs()
    image.open_append(PATH).append(data)
    return image


def on_disk(fs: SimulatedFS, kind: CrashKind, policy: FsyncPolicy = EVERY) -> Coordinator:
    """What a restart after a crash now would rebuild."""
    fresh = Coordinator(seed=99)
    replay_adapters(disk_image(fs, kind), PATH, fresh.adapters, policy=policy)
    return fresh


@contextmanager
def watching(
    adapters: Sequence[JournaledResource], on_event: Callable[[object, str], None]
) -> Iterator[None]:
    """Call `on_event(adapter, event)` each time an event method of one of
    `adapters` has changed it. Enter before opening their journal: the hook
    then runs the watched method after the append."""
    watched = {id(adapter) for adapter in adapters}
    patched: list[tuple[type, str, Any]] = []

    def watching_method(event: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: object, *args: Any) -> Any:
            result = original(self, *args)
            if id(self) in watched:
                on_event(self, event)
            return result

        return method

    for cls in {type(adapter) for adapter in adapters}:
        for event in cls.JOURNAL_EVENTS:
            name = f"_ev_{event}"
            patched.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, watching_method(event, cls.__dict__[name]))
    try:
        yield
    finally:
        watched.clear()
        for cls, name, original in patched:
            setattr(cls, name, original)


# -- the hook: append durably, then change memory ------------------------------


def test_each_event_is_one_record_named_adapter_dot_event_with_its_arguments() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    assert list(records(fs)[0]) == ["seq", "snapshot"]  # a new journal starts as built
    txn = c.tables.prepare(1)
    appends = fs.calls[Op.APPEND]
    c.reserve(txn)
    assert fs.calls[Op.APPEND] - appends == len(event_kinds(fs)) == 7
    assert records(fs)[1:] == [
        {"seq": 2, "kind": "targets.hold", "payload": ["t0", txn.id]},
        {"seq": 3, "kind": "shards.lease", "payload": ["s1", "a", txn.id]},
        {"seq": 4, "kind": "params.assign", "payload": [txn.id]},
        {"seq": 5, "kind": "algorithms.select", "payload": [txn.id]},
        {"seq": 6, "kind": "pairing.pair", "payload": ["seed0", 1, txn.id]},
        {"seq": 7, "kind": "proposals.dispatch", "payload": ["p0", txn.id]},
        {"seq": 8, "kind": "dispatch-log.dispatch", "payload": [txn.id, 1, "item1", 1]},
    ]
    assert reopened(fs).state() == c.state()


def test_hooked_adapters_keep_their_class_name_and_isinstance() -> None:
    c = Coordinator()
    c.open(new_fs())
    assert isinstance(c.targets, TargetRegistry) and type(c.targets).__name__ == "TargetRegistry"
    assert isinstance(c.targets, JournaledResource)
    assert c.journal.adapters["targets"] is c.targets


@pytest.mark.parametrize("kill", [FaultKind.KILL_BEFORE, FaultKind.KILL_AFTER], ids=str)
def test_memory_changes_only_after_the_append_returned(kill: FaultKind) -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    txn = c.tables.prepare(0)
    before = c.state()
    fs.fault = fail_at(Op.APPEND, Fault(kill))
    with pytest.raises(SimulatedCrash):
        c.targets.reserve(txn, "fuzz")
    assert c.state() == before  # killed with or without its record: memory untouched
    fs.crash(CrashKind.PROCESS)
    holders = reopened(fs).targets.holders("t0")
    assert holders == ([] if kill is FaultKind.KILL_BEFORE else [txn.id])


@pytest.mark.parametrize(
    ("op", "fault"),
    [
        (Op.APPEND, EIO),
        (Op.APPEND, ENOSPC),
        (Op.APPEND, Fault(FaultKind.SHORT_WRITE)),
        (Op.FSYNC, EIO),
    ],
    ids=["append-eio", "append-enospc", "short-write", "fsync-eio"],
)
def test_a_reservation_whose_append_fails_raises_and_leaves_the_adapter_untouched(
    op: Op, fault: Fault
) -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    before = c.state()
    fs.fault = fail_at(op, fault)
    with pytest.raises(OSError):
        c.dispatch(0)  # the first reservation fails: the boundary has nothing to undo
    assert c.state() == before and c.leaks() == [] and len(c.tables) == 0
    assert on_disk(fs, CrashKind.PROCESS).state() == before
    fs.fault = None
    c.dispatch(0)
    assert reopened(fs).state() == c.state()


def test_a_release_whose_append_fails_is_released_in_memory_and_the_file_rewritten_first() -> None:
    """A briefly unwritable disk must not keep in-process resources from
    being released: the core records the failure, memory releases anyway,
    and the journal rewrites itself from memory before its next record."""
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    txn = c.tables.prepare(0)
    c.reserve(txn)
    # The disk is unwritable: every append and every rewrite fails.
    fs.fault = DiskFaultPlan(FaultRule(EIO, op=Op.APPEND), FaultRule(ENOSPC, op=Op.WRITE_TEMP))
    failures = c.tables.abort(txn.id)
    assert len(failures) == 7
    for failure in failures:
        assert isinstance(failure.error, ReleaseNotJournaled)
        # The first fails at its append, the others at the rewrite first.
        assert failure.error.error.errno in (errno.EIO, errno.ENOSPC)
    assert c.leaks() == [] and c.log.reclaimed(NEVER_SENT) == 1
    assert c.journal.out_of_step and c.journal.needs_rewrite
    assert c.journal.releases_not_journaled == 7
    # The file is behind (every hold still there), never ahead or torn.
    behind = on_disk(fs, CrashKind.PROCESS)
    assert {leak.dispatch_id for leak in behind.leaks()} == {txn.id}
    # A reservation is refused while nothing can be written...
    with pytest.raises(OSError):
        c.dispatch(1)
    assert c.leaks() == [] and out_of_step(c.journal)
    # ...and once the disk is back, the file is rewritten before the next record.
    fs.fault = None
    fs.log = []
    c.dispatch(1)
    assert [call.op for call in fs.log[:5]] == [
        Op.WRITE_TEMP,
        Op.RENAME,
        Op.CLOSE,
        Op.FSYNC_DIR,
        Op.OPEN_APPEND,
    ]
    assert not out_of_step(c.journal)
    fs.crash(CrashKind.POWER)
    assert reopened(fs).state() == c.state()


@pytest.mark.parametrize("cure", ["sync", "close", "group", "compact"])
def test_an_out_of_step_journal_is_rewritten_by_sync_close_group_end_or_compact(
    cure: str,
) -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    txn = c.tables.prepare(0)
    c.targets.reserve(txn, "fuzz")
    fs.fault = fail_at(Op.APPEND, EIO)
    (failure,) = c.tables.abort(txn.id)
    assert isinstance(failure.error, ReleaseNotJournaled) and c.journal.out_of_step
    fs.fault = None
    if cure == "sync":
        c.journal.sync()
    elif cure == "close":
        c.journal.close()
    elif cure == "group":
        with c.journal.group():
            pass
    else:
        c.journal.compact()
    assert not out_of_step(c.journal)
    fs.crash(CrashKind.POWER)
    assert reopened(fs).state() == c.state()


def test_close_of_an_out_of_step_journal_that_cannot_rewrite_raises_and_stays_open() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    txn = c.tables.prepare(0)
    c.targets.reserve(txn, "fuzz")
    fs.fault = DiskFaultPlan(FaultRule(EIO, op=Op.APPEND), FaultRule(ENOSPC, op=Op.WRITE_TEMP))
    c.tables.abort(txn.id)
    with pytest.raises(OSError):
        c.journal.close()
    assert not closed(c.journal) and out_of_step(c.journal)
    fs.fault = None
    c.journal.close()
    assert closed(c.journal)
    assert reopened(fs).state() == c.state()


def test_a_failed_triage_append_parks_the_dispatch_and_the_retry_applies_each_effect_once() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    dispatch_id = c.dispatch(0)
    assert dispatch_id is not None
    fs.fault = fail_at(Op.APPEND, EIO, nth=1)  # the observe goes through, the feedback fails
    with pytest.raises(OSError):
        c.triage(dispatch_id, 1.0)
    assert c.phase(dispatch_id) is Phase.COMMITTING  # parked, never discarded
    assert c.algorithms.pulls(STAGES[0]) == 1 and c.algorithms.reward_sum(STAGES[0]) == 0.0
    fs.fault = None
    c.triage(dispatch_id, 1.0)
    assert c.phase(dispatch_id) is None  # committed: out of every table
    assert sum(c.params.observations(arm) for arm in ("fast", "deep")) == 1
    assert c.algorithms.reward_sum(STAGES[0]) == 1.0
    assert c.leaks() == [] and c.log.completed == 1
    assert reopened(fs).state() == c.state()


def test_a_release_on_commit_whose_append_fails_is_raised_after_commit_and_still_released() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    dispatch_id = c.dispatch(0)
    assert dispatch_id is not None
    # The triage records go through; then the dispatch log's `done` fails.
    fs.fault = DiskFaultPlan(FaultRule(EIO, op=Op.APPEND, nth=4))
    with pytest.raises(CompensationError) as raised:
        c.triage(dispatch_id, 1.0)
    (failure,) = raised.value.failures
    assert failure.resource == "dispatch-log" and isinstance(failure.error, ReleaseNotJournaled)
    assert c.phase(dispatch_id) is None and c.leaks() == []  # committed all the same
    assert c.log.completed == 1
    fs.fault = None
    c.journal.sync()
    assert reopened(fs).state() == c.state()


def test_the_release_events_are_exactly_the_events_compensations_make() -> None:
    """Run every way a dispatch can end and check which events ran inside a
    compensation (or a release after losing a worker) and which outside."""
    c = Coordinator()
    inside: set[tuple[str, str]] = set()
    outside: set[tuple[str, str]] = set()
    compensating = [False]

    def seen(adapter: object, event: str) -> None:
        (inside if compensating[0] else outside).add((type(adapter).__name__, event))

    @contextmanager
    def ending() -> Iterator[None]:
        compensating[0] = True
        try:
            yield
        finally:
            compensating[0] = False

    with watching(c.adapters, seen):
        for end in ("abort", "fenced_out", "lose", "commit", "no verdict"):
            c.cache.report_miss(0, "dict")  # so that a commit delivers and a loss forgets
            txn = c.tables.prepare(0)
            plan = c.dispatched[txn.id] = c.reserve(txn)
            if end == "abort":
                with ending():
                    c.tables.abort(txn.id)
                continue
            c.tables.sent(txn.id, 1.0)
            if end == "fenced_out":
                with ending():
                    c.tables.fenced_out(txn.id)
            elif end == "lose":
                with ending():
                    c.tables.lose_worker(0)
                    c.cache.forget_worker(0)
            else:
                c.tables.fence_passed(txn.id)
                c.params.observe(plan.assignment.token, 1.0)
                c.algorithms.feedback(plan.selection.token, 1.0)
                c.log.mark_applied(plan.work_id, plan.token + 1)
                if end == "commit" and plan.ticket is not None:
                    c.proposals.verdict(plan.ticket.proposal_id, accepted=True)
                with ending():
                    c.tables.finished(txn.id)
    for adapter in c.adapters:
        cls = type(adapter)
        releases = release_events(cls)
        made_inside = {event for name, event in inside if name == cls.__name__}
        made_outside = {event for name, event in outside if name == cls.__name__}
        assert made_inside <= releases, cls.__name__
        assert not made_outside & releases, cls.__name__
        assert releases <= made_inside, cls.__name__  # every one declared was seen
    assert c.leaks() == []


# -- replay ---------------------------------------------------------------------


def ignore_event(state: JSONValue, event: Event) -> JSONValue:
    return state


def raw_journal(fs: SimulatedFS, *events: Event, snapshot: JSONValue = None) -> None:
    """Write a journal file by hand: a snapshot line if given, then events."""
    journal = Journal(fs, PATH, json_model(snapshot, ignore_event))
    if snapshot is not None:
        journal.compact()
    for event in events:
        journal.append(event)
    journal.close()


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (Event("nobody.hold", ["t0", 1]), "no adapter named 'nobody'"),
        (Event("targets.select", [1]), "journals no event 'select'"),
        (Event("hold", ["t0", 1]), "no adapter named ''"),
        (Event("targets.hold", {"target": "t0"}), "must be a JSON array"),
    ],
    ids=["adapter", "event", "no-dot", "payload"],
)
def test_a_record_naming_what_is_not_here_is_corruption_naming_the_line(
    event: Event, reason: str
) -> None:
    fs = new_fs()
    raw_journal(fs, Event("targets.hold", ["t0", 1]), event)
    c = Coordinator()
    built = c.state()
    with pytest.raises(JournalCorrupt, match=reason) as raised:
        c.open(fs)
    assert (raised.value.path, raised.value.line) == (PATH, 2)
    assert c.state() == built  # the first record was replayed, then taken back
    assert type(c.targets) is TargetRegistry  # and nothing was hooked


@pytest.mark.parametrize(
    ("snapshot", "reason"),
    [
        ({"nobody": {}}, "adapters \\['nobody'\\] that are not here"),
        ({"targets": {"kind": "targets", "version": 9}}, "not a targets snapshot"),
        ({"targets": []}, "must be a JSON object"),
        ([], "must be a JSON object"),
    ],
    ids=["adapter", "state", "not-object", "not-a-map"],
)
def test_a_snapshot_this_journal_cannot_restore_is_corruption(
    snapshot: JSONValue, reason: str
) -> None:
    fs = new_fs()
    raw_journal(fs, snapshot=snapshot)
    c = Coordinator()
    built = c.state()
    with pytest.raises(JournalCorrupt, match=reason) as raised:
        c.open(fs)
    assert raised.value.line == 1
    assert c.state() == built


def test_an_adapter_the_snapshot_does_not_name_keeps_the_state_it_was_built_with() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    c.dispatch(0)
    c.journal.close()
    other = TargetRegistry(c.tables, name="devices")
    other.add_target("gpu")
    restarted = Coordinator(seed=99)
    journal = AdapterJournal(fs, PATH, [*restarted.adapters, other])
    assert restarted.state() == c.state()
    assert other.load("gpu") == 0 and journal.adapters["devices"] is other


def test_replay_adapters_rebuilds_without_touching_the_file() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    c.dispatch(0)
    data = fs.read(PATH)
    fresh = Coordinator(seed=99)
    report = replay_adapters(fs, PATH, fresh.adapters)
    assert report.from_snapshot and report.records_applied == 7
    assert fresh.state() == c.state() and fs.read(PATH) == data
    assert type(fresh.targets) is TargetRegistry  # not hooked


def test_two_adapters_with_one_name_or_one_adapter_in_two_journals_are_refused() -> None:
    c = Coordinator()
    twin = TargetRegistry(c.tables)  # also named "targets"
    with pytest.raises(ValueError, match="two adapters are named 'targets'"):
        AdapterJournal(new_fs(), PATH, [c.targets, twin])
    c.open(new_fs())
    with pytest.raises(ValueError, match="already kept by an open journal"):
        AdapterJournal(new_fs(), PATH, [c.targets])


def test_an_event_after_close_raises_and_changes_nothing() -> None:
    c = Coordinator()
    c.open(new_fs())
    c.journal.close()
    c.journal.close()  # a no-op
    before = c.state()
    txn = c.tables.prepare(0)
    with pytest.raises(ValueError, match="closed"):
        c.targets.reserve(txn, "fuzz")
    assert c.state() == before


def test_opening_an_empty_journal_starts_it_with_a_snapshot_of_the_adapters_as_built() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    (line,) = records(fs)
    assert line == {"seq": 1, "snapshot": c.state()}
    fs.crash(CrashKind.POWER)  # the snapshot and its name are durable
    assert reopened(fs).state() == c.state()


def test_a_fault_at_every_call_of_opening_leaves_the_adapters_as_built_or_opened() -> None:
    for existing in (False, True):
        base = new_fs()
        if existing:
            first = Coordinator()
            first.open(base)
            first.dispatch(0)
            expected = first.state()
        else:
            expected = Coordinator().state()
        counting = copy.deepcopy(base)
        counting.log = []
        Coordinator().open(counting)
        calls = len(counting.log)
        assert calls >= 5
        for nth in range(calls):
            for kind in (FaultKind.EIO, FaultKind.KILL_BEFORE, FaultKind.KILL_AFTER):
                fs = copy.deepcopy(base)
                fs.fault = DiskFaultPlan(FaultRule(Fault(kind), nth=nth))
                c = Coordinator()
                built = c.state()
                where = f"existing={existing} {fs.fault}"
                try:
                    c.open(fs)
                except OSError:
                    assert c.state() == built, where  # as built: nothing half-replayed
                except SimulatedCrash:
                    pass
                else:
                    assert c.state() == expected, where
                fs.fault = None
                fs.crash(CrashKind.POWER)
                restarted = Coordinator()
                restarted.open(fs)
                assert restarted.state() == expected, where


# -- compaction -------------------------------------------------------------------


def test_compaction_on_demand_then_replay_equals_memory() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    first = c.dispatch(0)
    c.dispatch(1, send_fails=True)
    assert first is not None
    c.triage(first, 1.0)
    c.journal.compact()
    assert [list(record) for record in records(fs)] == [["seq", "snapshot"]]
    fs.crash(CrashKind.POWER)
    assert reopened(fs).state() == c.state()


def test_compaction_when_due_snapshots_the_event_that_made_it_due() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs, compact_every=3)
    txn = c.tables.prepare(0)
    c.targets.reserve(txn, "fuzz")
    c.shards.reserve(txn, "s0")
    assert len(event_kinds(fs)) == 2
    c.params.reserve(txn)  # the third record: compacted right after it is applied
    (line,) = records(fs)
    assert line["snapshot"] == c.state()
    assert c.journal.last_compaction_error is None
    c.tables.abort(txn.id)
    fs.crash(CrashKind.POWER)
    assert reopened(fs).state() == c.state()


def test_compaction_when_due_waits_for_the_end_of_a_group() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs, GROUP, compact_every=3)
    (dispatch_id,) = c.dispatch_group([0])  # seven records in one group
    assert [list(record) for record in records(fs)] == [["seq", "snapshot"]]
    assert c.phase(dispatch_id) is Phase.ACTIVE
    assert reopened(fs).state() == c.state()


def test_a_failed_automatic_compaction_does_not_fail_the_event() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs, compact_every=2)
    txn = c.tables.prepare(0)
    fs.fault = fail_at(Op.WRITE_TEMP, ENOSPC)
    c.targets.reserve(txn, "fuzz")
    c.shards.reserve(txn, "s0")  # due: the compaction fails, the lease stands
    assert isinstance(c.journal.last_compaction_error, OSError)
    assert c.shards.holder("s0", "a") == txn.id
    fs.fault = None
    c.tables.abort(txn.id)
    assert reopened(fs).state() == c.state()


# -- fsync policies: groups under GROUP -----------------------------------------


def test_group_policy_records_become_durable_at_the_groups_end_before_any_send() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs, GROUP)
    built = c.state()
    with c.journal.group():
        txns = [c.tables.prepare(worker) for worker in (0, 1)]
        for txn in txns:
            c.dispatched[txn.id] = c.reserve(txn)
        assert c.journal.unsynced == 14
        assert on_disk(fs, CrashKind.POWER, GROUP).state() == built  # none acted on yet
        assert on_disk(fs, CrashKind.PROCESS, GROUP).state() == c.state()
    assert c.journal.unsynced == 0
    for txn in txns:
        c.send(txn)
    assert on_disk(fs, CrashKind.POWER, GROUP).state() == c.state()


def test_group_policy_a_failed_fsync_at_the_groups_end_sends_nothing_and_undoes() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs, GROUP)
    fs.fault = fail_at(Op.FSYNC, EIO)  # the group's one fsync
    with pytest.raises(OSError):
        c.dispatch_group([0, 1])
    assert len(c.tables) == 0 and c.leaks() == []
    assert c.params.pulls("fast") + c.params.pulls("deep") == 0  # never sent, never counted
    assert not c.journal.needs_rewrite  # the undo records rewrote the file first
    fs.crash(CrashKind.POWER)
    assert reopened(fs, GROUP).state() == c.state()


# -- the dispatch log ---------------------------------------------------------------


def log_records(fs: SimulatedFS) -> list[tuple[str, list[Any]]]:
    return [
        (record["kind"], record["payload"])
        for record in records(fs)
        if record.get("kind", "").startswith("dispatch-log.")
    ]


def test_dispatch_log_undo_before_send_appends_reclaim_never_sent_and_drops_the_entry() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    assert c.dispatch(2, send_fails=True) is None
    assert log_records(fs) == [
        ("dispatch-log.dispatch", [0, 2, "item1", 1]),
        ("dispatch-log.reclaim", [0, NEVER_SENT]),
    ]
    assert c.log.leaks() == [] and c.log.open_dispatches() == []
    assert (c.log.dispatched, c.log.completed, c.log.reclaimed(NEVER_SENT)) == (1, 0, 1)


def test_dispatch_log_discard_appends_reclaim_result_untrusted_and_never_done() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    dispatch_id = c.dispatch(1)
    assert dispatch_id is not None
    assert c.log.entry(dispatch_id) == DispatchEntry(dispatch_id, 1, "item1", 1)
    assert c.tables.fenced_out(dispatch_id) == ()
    assert log_records(fs) == [
        ("dispatch-log.dispatch", [dispatch_id, 1, "item1", 1]),
        ("dispatch-log.reclaim", [dispatch_id, RESULT_UNTRUSTED]),
    ]
    assert (c.log.completed, c.log.reclaimed(RESULT_UNTRUSTED), c.log.reclaimed()) == (0, 1, 1)
    assert reopened(fs).log.reclaimed(RESULT_UNTRUSTED) == 1


def test_dispatch_log_commit_appends_done_after_the_applied_mark() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    dispatch_id = c.dispatch(0)
    assert dispatch_id is not None
    c.triage(dispatch_id, 0.0)
    assert log_records(fs) == [
        ("dispatch-log.dispatch", [dispatch_id, 0, "item1", 1]),
        ("dispatch-log.applied", ["item1", 2]),
        ("dispatch-log.done", [dispatch_id]),
    ]
    # The store says done: the marks of the item are no longer needed.
    assert not c.log.applied("item1", 2) and c.log.completed == 1


def test_dispatch_log_records_a_pass_of_dispatches_as_one_record_that_replays_whole() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    txns = [c.tables.prepare(worker) for worker in (0, 1, 2)]
    entries = c.log.reserve_many([(txn, f"item{n}", n + 1) for n, txn in enumerate(txns)])
    assert [entry.work_id for entry in entries] == ["item0", "item1", "item2"]
    assert log_records(fs) == [
        (
            "dispatch-log.dispatch_many",
            [[[txn.id, txn.worker, f"item{n}", n + 1] for n, txn in enumerate(txns)]],
        ),
    ]
    # Each dispatch still ends on its own: the first is never sent.
    c.tables.abort(txns[0].id)
    restarted = reopened(fs)
    assert [entry.work_id for entry in restarted.log.stale()] == ["item1", "item2"]
    assert restarted.log.dispatched == 3 and restarted.log.reclaimed(NEVER_SENT) == 1


def test_dispatch_log_records_nothing_of_a_pass_with_one_bad_reservation() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    good, bad = c.tables.prepare(0), c.tables.prepare(1)
    with pytest.raises(ValueError, match="fencing token"):
        c.log.reserve_many([(good, "item0", 1), (bad, "item1", 0)])
    with pytest.raises(Unavailable):
        c.log.reserve_many([(good, "item0", 1), (good, "item0", 1)])
    assert log_records(fs) == [] and c.log.open_dispatches() == []
    assert c.log.reserve_many([]) == []


def test_dispatch_log_refuses_to_replay_a_malformed_pass_record() -> None:
    for payload in ([[1, 0, "item", 1], [2, 0]], [[1, 0, 5, 1]], [[1, "0", "item", 1]]):
        log = DispatchLog(DispatchTables(1))
        with pytest.raises(ValueError):
            log._ev_dispatch_many(payload)
        assert log.open_dispatches() == [] and log.dispatched == 0


def test_dispatch_log_refuses_a_second_end_and_a_second_entry_per_dispatch() -> None:
    c = Coordinator()
    txn = c.tables.prepare(0)
    entry = c.log.reserve(txn, "item", 3)
    with pytest.raises(Unavailable):
        c.log.reserve(txn, "item", 3)
    c.log.undo(entry)
    for end in (c.log.undo, c.log.discard, c.log.complete):
        with pytest.raises(NotReserved):
            end(entry)
    with pytest.raises(ValueError, match="slot number"):
        c.log.reserve(c.tables.prepare(1), "item", 0)


def test_applied_marks_survive_a_restart_and_tell_what_is_left_to_apply() -> None:
    """Killed between the triage effects and the applied mark, the restarted
    owner applies the item's local effects again (each one idempotent); once
    marked, it applies nothing and ends the stale entry from the store."""
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    dispatch_id = c.dispatch(0)
    assert dispatch_id is not None
    plan = c.dispatched[dispatch_id]
    fs.fault = fail_at(Op.APPEND, Fault(FaultKind.KILL_BEFORE), nth=3)  # the applied mark
    with pytest.raises(SimulatedCrash):
        c.triage(dispatch_id, 1.0)
    fs.crash(CrashKind.POWER)
    r = reopened(fs)
    assert not r.log.applied("item1", 2)
    assert r.params.observe(plan.assignment.token, 1.0) is False  # already learned
    assert r.algorithms.feedback(plan.selection.token, 1.0) is False
    assert r.log.mark_applied("item1", 2) is True
    assert r.log.mark_applied("item1", 2) is False  # once
    r.journal.close()
    again = reopened(fs)
    assert again.log.applied("item1", 2) and again.log.applied_slots("item1") == [2]
    (stale,) = again.log.stale()
    assert stale == DispatchEntry(dispatch_id, 0, "item1", 1)
    assert again.log.close_stale(dispatch_id, committed=True) == stale
    assert again.log.applied_slots("item1") == [] and again.log.leaks() == []
    assert reopened_after_close(again, fs).log.completed == 1


def reopened_after_close(c: Coordinator, fs: SimulatedFS) -> Coordinator:
    c.journal.close()
    return reopened(fs)


def test_close_stale_reclaims_an_uncommitted_entry_and_refuses_a_live_one() -> None:
    fs = new_fs()
    c = Coordinator()
    c.open(fs)
    live = c.dispatch(0)
    assert live is not None
    with pytest.raises(ValueError, match="live transaction"):
        c.log.close_stale(live, committed=False)
    assert c.log.stale() == []
    c.journal.close()
    r = reopened(fs)
    assert [entry.dispatch_id for entry in r.log.stale()] == [live]
    r.log.close_stale(live, committed=False)
    assert r.log.reclaimed(OWNER_RESTARTED) == 1 and r.log.leaks() == []
    with pytest.raises(NotReserved):
        r.log.close_stale(live, committed=False)
    r.log.forget_applied("unknown")  # nothing to forget: no record
    assert reopened_after_close(r, fs).state() == r.state()


def test_dispatch_log_snapshot_round_trips_and_restore_refuses_what_it_did_not_write() -> None:
    c = Coordinator()
    for worker in range(3):
        txn = c.tables.prepare(worker)
        c.log.reserve(txn, f"item{worker}", worker + 1)
        if worker == 1:
            c.tables.abort(txn.id)
    c.log.mark_applied("item0", 2)
    state = c.log.snapshot()
    copy_ = DispatchLog(DispatchTables(1))
    copy_.restore(json.loads(json.dumps(state)))
    assert copy_.snapshot() == state and copy_.stale() == copy_.open_dispatches()
    broken = [
        {**state, "dispatched": 7},
        {**state, "open": [state["open"][0], state["open"][0]]},
        {**state, "applied": [{"work_id": "item0", "slots": [0]}]},
        {**state, "reclaimed": {NEVER_SENT: 0}},
        {**state, "version": 2},
    ]
    for bad in broken:
        with pytest.raises(SnapshotError):
            copy_.restore(bad)
        assert copy_.snapshot() == state


# -- replay after every prefix equals memory at that point -------------------------


OPS = ("dispatch", "dispatch", "unsent", "fenced_out", "commit", "park", "finish", "miss", "lose")


def step(c: Coordinator, op: str, worker: int, reward: float) -> None:
    """One coordinator move on `worker`, where it makes sense."""
    in_flight = list(c.tables.in_flight(worker))
    active = [txn for txn in in_flight if txn.phase is Phase.ACTIVE]
    committing = [txn for txn in in_flight if txn.phase is Phase.COMMITTING]
    if op in ("dispatch", "unsent") and len(in_flight) == len(committing):
        with suppress(Unavailable):
            c.dispatch(worker, send_fails=op == "unsent")
    elif op == "fenced_out" and active:
        c.tables.fenced_out(active[0].id)
    elif op == "commit" and active:
        c.triage(active[0].id, reward)
    elif op == "park" and active:
        c.tables.fence_passed(active[0].id)
    elif op == "finish" and committing:
        c.triage(committing[0].id, reward)
    elif op == "miss":
        c.cache.report_miss(worker, "dict")
    elif op == "lose":
        c.tables.lose_worker(worker)
        c.cache.forget_worker(worker)


@settings(max_examples=12, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 2), st.sampled_from([0.0, 1.0])),
        max_size=12,
    )
)
def test_replay_after_every_prefix_of_the_event_stream_equals_memory_at_that_point(
    ops: list[tuple[str, int, float]],
) -> None:
    fs = new_fs()
    c = Coordinator()
    trace: list[State] = []
    with watching(c.adapters, lambda adapter, event: trace.append(c.state())):
        c.open(fs)
        trace.insert(0, c.state())
        for op, worker, reward in ops:
            step(c, op, worker, reward)
        c.finish_everything()
    assert c.leaks() == []
    lines = fs.read(PATH).splitlines(keepends=True)
    assert len(lines) == len(trace)  # the opening snapshot, then one record per event
    for count in range(1, len(lines) + 1):
        prefix = new_fs()
        handle = prefix.open_append(PATH)
        handle.append(b"".join(lines[:count]))
        fresh = Coordinator(seed=99)
        report = replay_adapters(prefix, PATH, fresh.adapters)
        assert report.records_applied == count - 1
        assert fresh.state() == trace[count - 1], f"after {count} line(s)"
    assert reopened(fs).leaks() == []  # nothing leaked after shutdown and replay


# -- a fault at every FS call during a run of dispatches ------------------------------

#: Due once among the reservations of a dispatch, once in triage.
COMPACT_EVERY = 20

Ids = dict[str, int | None]


def in_phase(c: Coordinator, ids: Ids, name: str, phase: Phase) -> int | None:
    """The dispatch called `name`, if it is in `phase` (a step whose
    dispatch failed earlier finds nothing to do)."""
    dispatch_id = ids.get(name)
    return dispatch_id if c.phase(dispatch_id) is phase else None


def report_miss(c: Coordinator, ids: Ids) -> None:
    c.cache.report_miss(0, "dict")  # a's message carries it again


def group_of_two_sent(c: Coordinator, ids: Ids) -> None:
    ids["a"], ids["b"] = c.dispatch_group([0, 1])


def one_never_sent(c: Coordinator, ids: Ids) -> None:
    c.dispatch(2, send_fails=True)


def discard_b(c: Coordinator, ids: Ids) -> None:
    if (dispatch_id := in_phase(c, ids, "b", Phase.ACTIVE)) is not None:
        c.tables.fenced_out(dispatch_id)


def park_a(c: Coordinator, ids: Ids) -> None:
    if (dispatch_id := in_phase(c, ids, "a", Phase.ACTIVE)) is not None:
        c.tables.fence_passed(dispatch_id)


def shut_down(c: Coordinator, ids: Ids) -> None:
    c.tables.shutdown()  # a stays COMMITTING


def finish_a(c: Coordinator, ids: Ids) -> None:
    if (dispatch_id := in_phase(c, ids, "a", Phase.COMMITTING)) is not None:
        c.triage(dispatch_id, 1.0)  # its release on commit delivers the recarried object


#: Dispatches with every local adapter: a miss, then a group of two sent
#: (the first carries the missed object again), one never sent, a discard,
#: and a commit parked across shutdown and finished after it.
SCENARIO: tuple[Callable[[Coordinator, Ids], None], ...] = (
    report_miss,
    group_of_two_sent,
    one_never_sent,
    discard_b,
    park_a,
    shut_down,
    finish_a,
)


@dataclass(frozen=True)
class Reference:
    """The fault-free run: the state after each event, and its FS calls."""

    trace: list[State]
    calls: list[tuple[Op, str]]


_references: dict[FsyncPolicy, Reference] = {}


def reference(policy: FsyncPolicy) -> Reference:
    if policy not in _references:
        fs = new_fs()
        c = Coordinator()
        trace: list[State] = []
        with watching(c.adapters, lambda adapter, event: trace.append(c.state())):
            c.open(fs, policy, COMPACT_EVERY)
            trace.insert(0, c.state())
            fs.log = []
            ids: Ids = {}
            for scenario_step in SCENARIO:
                scenario_step(c, ids)
        assert c.leaks() == [] and len(c.tables) == 0
        assert fs.log is not None
        _references[policy] = Reference(trace, [(call.op, call.path) for call in fs.log])
    return _references[policy]


def fault_rules(
    policy: FsyncPolicy, fault: Fault, ops: Sequence[Op | None] = (None,)
) -> list[FaultRule]:
    """One rule per call of the scenario (of `ops`; None: any) at which
    `fault` can happen."""
    calls = reference(policy).calls
    rules = []
    for op in ops:
        matching = sum(FaultRule(fault, op=op).matches(*call) for call in calls)
        rules += [FaultRule(fault, op=op, nth=nth) for nth in range(matching)]
    return rules


class EventCount:
    """Counts the events applied in memory (a `watching` callback)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, adapter: object, event: str) -> None:
        self.count += 1


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
def test_a_kill_at_every_fs_call_rebuilds_the_state_before_or_after_the_interrupted_event(
    policy: FsyncPolicy,
) -> None:
    ref = reference(policy)
    rules = fault_rules(policy, Fault(FaultKind.KILL_BEFORE)) + fault_rules(
        policy, Fault(FaultKind.KILL_AFTER)
    )
    assert len(rules) > 110  # appends, fsyncs and every step of two compactions
    for rule in rules:
        fs = new_fs()
        c = Coordinator()
        applied = EventCount()
        durable = 0  # events that a power loss cannot take away
        with watching(c.adapters, applied):
            c.open(fs, policy, COMPACT_EVERY)
            fs.fault = DiskFaultPlan(rule)
            ids: Ids = {}
            try:
                for scenario_step in SCENARIO:
                    scenario_step(c, ids)
                    if policy is not NONE:  # each step ends synced under EVERY and GROUP
                        durable = applied.count
            except SimulatedCrash:
                pass
            else:
                pytest.fail(f"{rule} never fired")
        where = f"{rule}, {applied.count} event(s) applied"
        memory = c.state()
        assert memory == ref.trace[applied.count], where  # memory: exactly the events appended
        # Before or after the interrupted event, nothing else.
        allowed = ref.trace[applied.count : applied.count + 2]
        power = on_disk(fs, CrashKind.POWER, policy).state()
        fs.crash(CrashKind.PROCESS)
        assert reopened(fs, policy).state() in allowed, f"process kill: {where}"
        recovered = power
        if policy is EVERY:
            assert recovered in allowed, f"power loss: {where}"
        else:
            # An unsynced suffix may go, never a synced event, never a hole.
            kept = [i for i, state in enumerate(ref.trace) if state == recovered]
            assert any(durable <= i <= applied.count + 1 for i in kept), f"power loss: {where}"


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
def test_an_io_error_at_every_fs_call_keeps_memory_no_further_than_the_disk(
    policy: FsyncPolicy,
) -> None:
    # ENOSPC where part of the data lands first; elsewhere it fails like EIO.
    rules = fault_rules(policy, EIO) + fault_rules(policy, ENOSPC, (Op.APPEND, Op.WRITE_TEMP))
    assert len(rules) > 100
    for rule in rules:
        plan = DiskFaultPlan(rule)
        fs = new_fs()
        c = Coordinator()
        c.open(fs, policy, COMPACT_EVERY)
        fs.fault = plan
        checked = False
        ids: Ids = {}
        for scenario_step in SCENARIO:
            # A failure is recorded by the core or parks the dispatch: go on.
            with suppress(OSError, CompensationError):
                scenario_step(c, ids)
            if plan.fired and not checked:
                checked = True
                check_disk_against_memory(c, fs, policy, f"{plan.fired}")
        assert plan.fired, rule
        c.finish_everything()
        c.journal.sync()  # the one fault is gone: the journal must cure itself
        assert not c.journal.needs_rewrite
        assert c.leaks() == [] and len(c.tables) == 0, plan.fired
        fs.crash(CrashKind.POWER)
        restarted = reopened(fs, policy)
        assert restarted.state() == c.state(), plan.fired
        assert restarted.leaks() == []


def check_disk_against_memory(
    c: Coordinator, fs: SimulatedFS, policy: FsyncPolicy, where: str
) -> None:
    """Memory never runs ahead of the disk: a process kill now rebuilds
    memory exactly, unless a release was applied without its record (then
    the disk holds what memory holds, and more); under EVERY a power loss
    loses no record whose append returned."""
    killed = on_disk(fs, CrashKind.PROCESS, policy)
    crashes = [killed, on_disk(fs, CrashKind.POWER, policy)] if policy is EVERY else [killed]
    for recovered in crashes:
        if c.journal.out_of_step:
            assert set(c.leaks()) <= set(recovered.leaks()), where
        elif not c.journal.needs_rewrite:
            assert recovered.state() == c.state(), where
