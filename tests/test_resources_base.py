"""What the resource adapters share (`dispatchtx.resources`, `resources._base`):
all of them together in one world, the `ResourceAdapter` protocol, the leak
audit, snapshots and the journal seam; against whichever build of the core is
loaded."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx import Compensation, DispatchTables, Phase, Transaction
from dispatchtx.resources import (
    RESULT_LOST,
    AlgorithmSelection,
    AlgorithmSelector,
    JournaledAdapter,
    JournaledResource,
    Leak,
    ObjectCache,
    ParameterAssignment,
    ParameterBandit,
    ProposalBoard,
    ProposalState,
    ProposalTicket,
    ResourceAdapter,
    SeedPairing,
    ShardLeases,
    SnapshotError,
    TargetRegistry,
    Unavailable,
    all_leaks,
)

from support import STAGES, send


def json_round_trip(state: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(state, allow_nan=False))


# -- all of them together: one world of adapters --------------------------------


@dataclass
class Plan:
    """What one dispatch reserved."""

    assignment: ParameterAssignment
    selection: AlgorithmSelection
    ticket: ProposalTicket | None
    sent: bool = False


@dataclass
class World:
    """A coordinator's resources, reserved the way a coordinator would."""

    n_workers: int = 3
    seed: int = 7
    tables: DispatchTables = field(init=False)
    targets: TargetRegistry = field(init=False)
    shards: ShardLeases = field(init=False)
    params: ParameterBandit = field(init=False)
    algorithms: AlgorithmSelector = field(init=False)
    pairing: SeedPairing = field(init=False)
    proposals: ProposalBoard = field(init=False)
    cache: ObjectCache = field(init=False)
    plans: dict[int, Plan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tables = self.tables = DispatchTables(self.n_workers)
        self.targets = TargetRegistry(tables)
        self.shards = ShardLeases(tables)
        self.params = ParameterBandit(
            tables, {"fast": {"t": 1}, "deep": {"t": 9}}, policy="thompson", seed=self.seed
        )
        self.algorithms = AlgorithmSelector(tables, STAGES, seed=self.seed, rewind_depth=4)
        self.pairing = SeedPairing(tables)
        self.proposals = ProposalBoard(tables, max_attempts=2)
        self.cache = ObjectCache(tables)
        for target in ("t0", "t1"):
            self.targets.add_target(target, group="fuzz", capacity=2)
        for shard in ("s0", "s1"):
            for task in ("a", "b", "c"):
                self.shards.add_task(shard, task)
        for i in range(6):
            self.proposals.propose(f"p{i}", {"input": i})

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
        ]

    def dispatch(self, worker: int) -> None:
        with self.tables.dispatch(worker) as txn:
            try:
                self.targets.reserve(txn, "fuzz")
                self.shards.reserve(txn, f"s{worker % 2}")
                assignment = self.params.reserve(txn)
                selection = self.algorithms.reserve(txn)
                seed = self.pairing.least_assigned([f"seed{i}" for i in range(4)], worker)
                if seed is None:
                    raise Unavailable("no free seed")
                self.pairing.reserve(txn, seed)
                ticket = self.proposals.reserve(txn) if self.proposals.pending() else None
                self.cache.reserve(txn, [seed, "dict"])
            except Unavailable:
                assert self.tables.abort(txn.id) == ()
                return
            plan = self.plans[txn.id] = Plan(assignment, selection, ticket)
            if (txn.id + self.seed) % 4 == 0:
                raise ConnectionError("send failed")  # the boundary undoes at once (D8)
            self.tables.sent(txn.id, float(txn.id))
            plan.sent = True

    def triage(self, txn: Transaction, reward: float) -> None:
        plan = self.plans[txn.id]
        with self.tables.committing(txn.id):
            self.params.observe(plan.assignment.token, reward)
            self.algorithms.feedback(plan.selection.token, reward)
            if plan.ticket is not None:
                self.proposals.verdict(plan.ticket.proposal_id, accepted=reward > 0.5)

    def step(self, op: str, worker: int, reward: float) -> None:
        in_flight = list(self.tables.in_flight(worker))
        active = [txn for txn in in_flight if txn.phase is Phase.ACTIVE]
        committing = [txn for txn in in_flight if txn.phase is Phase.COMMITTING]
        if op == "dispatch" and len(in_flight) == len(committing):
            with suppress(ConnectionError):
                self.dispatch(worker)
        elif op == "fenced_out" and active:
            assert self.tables.fenced_out(active[0].id) == ()
        elif op == "commit" and active:
            self.triage(active[0], reward)
        elif op == "park" and active:
            self.tables.fence_passed(active[0].id)
        elif op == "finish" and committing:
            self.triage(committing[0], reward)
        elif op == "lose":
            assert self.tables.lose_worker(worker) == ()
            self.cache.forget_worker(worker)

    def close(self) -> list[Transaction]:
        """Shut down; return the COMMITTING dispatches that stay."""
        assert self.tables.shutdown() == ()
        return list(self.tables.in_flight())


WORLD_OPS = ("dispatch", "dispatch", "fenced_out", "commit", "park", "finish", "lose")
world_ops = st.lists(
    st.tuples(st.sampled_from(WORLD_OPS), st.integers(0, 2), st.sampled_from([0.0, 1.0])),
    max_size=50,
)


@settings(max_examples=80, deadline=None)
@given(ops=world_ops)
def test_leak_audit_after_shutdown_is_empty_and_counts_are_true(
    ops: list[tuple[str, int, float]],
) -> None:
    world = World()
    for op, worker, reward in ops:
        world.step(op, worker, reward)
    parked = world.close()
    # Shutdown leaves COMMITTING dispatches for the caller: only they hold.
    held_by = {leak.dispatch_id for leak in all_leaks(world.adapters)}
    assert held_by <= {txn.id for txn in parked}
    for txn in parked:
        world.triage(txn, 1.0)
    assert all_leaks(world.adapters) == []
    # Every count is a count of dispatches that really went out (D3).
    went_out = [plan for plan in world.plans.values() if plan.sent]
    assert sum(world.params.pulls(arm) for arm in ("fast", "deep")) == len(went_out)
    assert sum(world.algorithms.pulls(stage) for stage in STAGES) == len(went_out)
    assert sum(
        world.shards.lease_count(s, t) for s in ("s0", "s1") for t in ("a", "b", "c")
    ) == len(went_out)
    assert sum(world.pairing.assignments(f"seed{i}") for i in range(4)) == len(went_out)
    assert sum(world.proposals.attempts(f"p{i}") for i in range(6)) == sum(
        plan.ticket is not None for plan in went_out
    )


def test_shutdown_undoes_preparing_discards_active_and_leaves_committing() -> None:
    tables = DispatchTables(3)
    shards = ShardLeases(tables)
    board = ProposalBoard(tables)
    txns = [tables.prepare(worker) for worker in range(3)]
    for txn, name in zip(txns, ("a", "b", "c"), strict=True):
        shards.add_task("s", name)
        board.propose(name)
        shards.reserve(txn, "s", name)
        board.reserve(txn, name)
    send(tables, txns[1])
    send(tables, txns[2])
    tables.fence_passed(txns[2].id)
    assert tables.shutdown() == ()
    # PREPARING: undone, never counted.
    assert (shards.lease_count("s", "a"), shards.failure_count("s", "a")) == (0, 0)
    assert (board.state("a"), board.attempts("a")) == (ProposalState.PENDING, 0)
    # ACTIVE: discarded, the true count kept.
    assert (shards.lease_count("s", "b"), shards.failure_count("s", "b")) == (1, 1)
    assert (board.attempts("b"), board.reason("b")) == (1, RESULT_LOST)
    # COMMITTING: stays, still held, until the caller finishes it.
    assert {leak.dispatch_id for leak in all_leaks([shards, board])} == {txns[2].id}
    with tables.committing(txns[2].id):
        board.verdict("c", accepted=True)
    assert all_leaks([shards, board]) == []
    assert (shards.lease_count("s", "c"), board.state("c")) == (1, ProposalState.ACCEPTED)


def test_every_adapter_is_a_resource_adapter_with_one_compensation() -> None:
    world = World()
    for adapter in world.adapters:
        assert isinstance(adapter, ResourceAdapter)
        assert isinstance(adapter, JournaledResource)
        assert adapter.compensation is adapter.compensation
        assert adapter.compensation.name == adapter.name
    txn = world.tables.prepare(0)
    world.targets.reserve(txn, "fuzz")
    world.params.reserve(txn)
    assert len(txn) == 2  # one (compensation, argument) pair per reservation


class Licences:
    """A resource kind of a user's own, written the documented way."""

    name = "licences"

    def __init__(self, tables: DispatchTables, count: int) -> None:
        self.free = count
        self.held: dict[int, None] = {}
        self._comp = tables.compensation("licences", self.give_back, self.give_back, self.give_back)

    @property
    def compensation(self) -> Compensation[int]:
        return self._comp

    def reserve(self, txn: Transaction) -> int:
        if not self.free:
            raise Unavailable("no licence")
        self.free -= 1
        self.held[txn.id] = None
        txn.add(self._comp, txn.id)
        return txn.id

    def give_back(self, dispatch_id: int) -> None:
        del self.held[dispatch_id]
        self.free += 1

    def leaks(self) -> list[Leak]:
        return [Leak(self.name, "licence", str(d), d) for d in self.held]


def test_a_users_own_adapter_fits_the_protocol() -> None:
    tables = DispatchTables(2)
    licences = Licences(tables, 1)
    adapters: list[ResourceAdapter] = [licences]
    assert isinstance(licences, ResourceAdapter)
    assert not isinstance(licences, JournaledResource)
    txn = tables.prepare(0)
    licences.reserve(txn)
    assert all_leaks(adapters) == [Leak("licences", "licence", str(txn.id), txn.id)]
    assert tables.shutdown() == ()
    assert all_leaks(adapters) == [] and licences.free == 1


# -- snapshots and the journal seam ---------------------------------------------


def busy_world(seed: int = 7) -> World:
    world = World(seed=seed)
    pick = random.Random(seed)
    for _ in range(120):
        world.step(pick.choice(WORLD_OPS), pick.randrange(3), pick.choice([0.0, 1.0]))
    world.cache.report_miss(1, "dict")
    return world


def test_snapshots_are_json_and_restore_rebuilds_the_same_state() -> None:
    world = busy_world()
    fresh = World()
    for live, blank in zip(world.adapters, fresh.adapters, strict=True):
        state = live.snapshot()
        assert json_round_trip(state) == state
        blank.restore(json_round_trip(state))
        assert blank.snapshot() == state, live.name


def test_restored_random_state_makes_the_same_next_choices() -> None:
    world = busy_world()
    for txn in world.close():
        world.triage(txn, 1.0)
    fresh = World(seed=99)  # a different seed: the RNG must come from the snapshot
    for live, blank in zip(world.adapters, fresh.adapters, strict=True):
        blank.restore(json_round_trip(live.snapshot()))

    def next_choices(w: World) -> list[tuple[str, str, str, str]]:
        chosen = []
        for _ in range(12):
            txn = w.tables.prepare(0)
            assignment = w.params.reserve(txn)
            selection = w.algorithms.reserve(txn)
            chosen.append((assignment.token, assignment.arm, selection.token, selection.stage))
            w.tables.sent(txn.id, 1.0)
            with w.tables.committing(txn.id):
                w.params.observe(assignment.token, 0.5)
                w.algorithms.feedback(selection.token, 0.5)
        return chosen

    assert next_choices(world) == next_choices(fresh)


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"kind": "targets", "version": 2, "targets": []},
        {"kind": "params", "version": 1, "policy": "ucb1", "seq": 0, "arms": [], "pending": []},
    ],
)
def test_restore_refuses_a_state_it_did_not_write(state: dict[str, Any]) -> None:
    world = World()
    before = [adapter.snapshot() for adapter in world.adapters]
    for adapter in world.adapters:
        with pytest.raises(SnapshotError):
            adapter.restore(state)
    assert [adapter.snapshot() for adapter in world.adapters] == before


@contextmanager
def journal_of(adapters: list[JournaledResource]) -> Iterator[list[tuple[int, str, Any]]]:
    """Record every event each adapter applies, as a journal would: (which
    adapter, event, JSON arguments)."""
    records: list[tuple[int, str, Any]] = []
    patched: list[tuple[type[JournaledResource], str, Callable[..., Any]]] = []
    index_of = {id(adapter): i for i, adapter in enumerate(adapters)}

    def recording(event: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: JournaledAdapter, *args: Any) -> Any:
            which = index_of.get(id(self))
            if which is not None:
                records.append((which, event, json.loads(json.dumps(list(args)))))
            return original(self, *args)

        return method

    for cls in {type(adapter) for adapter in adapters}:
        for event in cls.JOURNAL_EVENTS:
            name = f"_ev_{event}"
            original = getattr(cls, name)
            patched.append((cls, name, original))
            setattr(cls, name, recording(event, original))
    try:
        yield records
    finally:
        for cls, name, original in patched:
            setattr(cls, name, original)


def test_the_journaled_events_replay_to_the_same_state() -> None:
    """Every state change goes through a journaled event with JSON arguments,
    deterministic in (state, arguments): a snapshot plus the events rebuild
    the state, RNGs and exact-rewind windows included."""
    world = World()
    start = [adapter.snapshot() for adapter in world.adapters]
    with journal_of(world.adapters) as records:
        pick = random.Random(3)
        for _ in range(150):
            world.step(pick.choice(WORLD_OPS), pick.randrange(3), pick.choice([0.0, 1.0]))
        world.cache.report_miss(2, "dict")
        for txn in world.close():
            world.triage(txn, 0.0)
    assert {event for _, event, _ in records} >= {"select", "undo", "assign", "retract"}
    replica = World(seed=123)  # a different seed: everything must come from the journal
    for adapter, state in zip(replica.adapters, start, strict=True):
        adapter.restore(state)
    for which, event, args in records:
        replica.adapters[which].replay(event, args)
    for live, copy in zip(world.adapters, replica.adapters, strict=True):
        assert copy.snapshot() == live.snapshot(), live.name


def test_replay_refuses_an_event_the_adapter_does_not_journal() -> None:
    world = World()
    with pytest.raises(ValueError, match="journals no event"):
        world.targets.replay("select", [])
