"""The resource adapters (DESIGN.md §4), each row of the table through real
`DispatchTables` moves, against whichever build of the core is loaded."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx import (
    Compensation,
    CompensationError,
    DispatchTables,
    IllegalMove,
    Phase,
    Side,
    Transaction,
)
from dispatchtx.resources import (
    RESULT_LOST,
    AlgorithmSelection,
    AlgorithmSelector,
    JournaledAdapter,
    JournaledResource,
    Leak,
    NotReserved,
    ObjectCache,
    Pairing,
    ParameterAssignment,
    ParameterBandit,
    ProposalBoard,
    ProposalState,
    ProposalTicket,
    ResourceAdapter,
    SeedPairing,
    ShardLease,
    ShardLeases,
    SnapshotError,
    TargetRegistry,
    TargetReservation,
    Unavailable,
    all_leaks,
)
from dispatchtx.resources import algorithms as algorithms_module

STAGES = ("det", "havoc", "splice")


def send(tables: DispatchTables, txn: Transaction, now: float = 1.0) -> None:
    tables.sent(txn.id, now)


def commit(tables: DispatchTables, txn: Transaction) -> None:
    """Fence, then finish with no failure."""
    tables.fence_passed(txn.id)
    assert tables.finished(txn.id) == ()


def json_round_trip(state: Mapping[str, Any]) -> Any:
    return json.loads(json.dumps(state, allow_nan=False))


def without_dispatch_ids(state: dict[str, Any]) -> dict[str, Any]:
    """A selector snapshot with the pending tokens' dispatch ids left out:
    a replay runs on new dispatches."""
    pending = [{k: v for k, v in p.items() if k != "dispatch_id"} for p in state["pending"]]
    return {**state, "pending": pending}


# -- target group / local target: release, release, release ---------------------


def make_targets() -> tuple[DispatchTables, TargetRegistry]:
    tables = DispatchTables(5)
    targets = TargetRegistry(tables)
    targets.add_target("t0", group="fuzz", capacity=2)
    targets.add_target("t1", group="fuzz", capacity=1)
    targets.add_target("local")
    return tables, targets


def test_target_undo_before_send_releases() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    held = targets.reserve(txn, "fuzz")
    assert held == TargetReservation("t0", txn.id)
    assert targets.load("t0") == 1
    assert tables.abort(txn.id) == ()
    assert targets.load("t0") == 0
    assert targets.leaks() == []


def test_target_discard_after_send_releases() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    targets.reserve_target(txn, "local")
    send(tables, txn)
    assert targets.holders("local") == [txn.id]
    assert tables.fenced_out(txn.id) == ()
    assert targets.load("local") == 0
    assert targets.leaks() == []


def test_target_release_on_commit() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    targets.reserve(txn, "fuzz")
    send(tables, txn)
    tables.fence_passed(txn.id)
    assert targets.load("t0") == 1  # held while triage runs (D6)
    assert tables.finished(txn.id) == ()
    assert targets.leaks() == []


def test_target_group_fills_least_loaded_first_then_is_unavailable() -> None:
    tables, targets = make_targets()
    picked = [targets.reserve(tables.prepare(w), "fuzz").target for w in range(3)]
    assert picked == ["t0", "t1", "t0"]
    assert targets.free_capacity("fuzz") == 0
    txn = tables.prepare(3)
    with pytest.raises(Unavailable):
        targets.reserve(txn, "fuzz")
    assert len(txn) == 0  # a refused reservation registers nothing
    targets.reserve_target(txn, "local")
    with pytest.raises(Unavailable):
        targets.reserve_target(tables.prepare(4), "local")  # a local target of capacity 1
    assert tables.lose_worker(0) == ()
    assert targets.free_capacity("fuzz") == 1


def test_a_second_release_is_a_recorded_failure_never_a_negative_load() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    held = targets.reserve(txn, "fuzz")
    targets.release(held)  # a regression releasing early
    failures = tables.abort(txn.id)
    assert [(f.resource, f.side, type(f.error)) for f in failures] == [
        ("targets", Side.BEFORE_SEND, NotReserved)
    ]
    assert targets.load("t0") == 0


def test_reserving_on_a_sent_dispatch_is_refused_and_leaves_no_trace() -> None:
    tables, targets = make_targets()
    txn = tables.prepare(0)
    send(tables, txn)
    with pytest.raises(IllegalMove):
        targets.reserve(txn, "fuzz")
    assert targets.leaks() == []
    assert targets.free_capacity("fuzz") == 3


# -- state-shard task: take back the lease count / record one failure -----------


def make_shards() -> tuple[DispatchTables, ShardLeases]:
    tables = DispatchTables(3)
    shards = ShardLeases(tables)
    for task in ("a", "b"):
        shards.add_task("s0", task)
    return tables, shards


def test_shard_undo_drops_the_lease_and_takes_back_the_lease_count() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    lease = shards.reserve(txn, "s0", "a")
    assert lease == ShardLease("s0", "a", txn.id)
    assert (shards.lease_count("s0", "a"), shards.holder("s0", "a")) == (1, txn.id)
    assert tables.abort(txn.id) == ()
    assert shards.lease_count("s0", "a") == 0
    assert shards.failure_count("s0", "a") == 0
    assert shards.holder("s0", "a") is None


def test_shard_discard_drops_the_lease_and_records_one_failure() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    shards.reserve(txn, "s0", "a")
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()
    assert shards.lease_count("s0", "a") == 1  # it really went out
    assert shards.failure_count("s0", "a") == 1
    assert shards.holder("s0", "a") is None


def test_shard_release_on_commit_keeps_the_counts() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    shards.reserve(txn, "s0", "a")
    send(tables, txn)
    commit(tables, txn)
    assert (shards.lease_count("s0", "a"), shards.failure_count("s0", "a")) == (1, 0)
    assert shards.leaks() == []


def test_shard_lost_worker_undoes_preparing_and_discards_active() -> None:
    tables = DispatchTables(1, max_in_flight=2)
    shards = ShardLeases(tables)
    for task in ("a", "b"):
        shards.add_task("s0", task)
    first = tables.prepare(0)
    shards.reserve(first, "s0", "a")
    send(tables, first)
    second = tables.prepare(0)
    shards.reserve(second, "s0", "b")
    assert tables.lose_worker(0) == ()
    assert (shards.lease_count("s0", "a"), shards.failure_count("s0", "a")) == (1, 1)
    assert (shards.lease_count("s0", "b"), shards.failure_count("s0", "b")) == (0, 0)
    assert shards.leaks() == []


def test_shard_picks_the_free_task_with_fewest_failures() -> None:
    tables, shards = make_shards()
    txn = tables.prepare(0)
    shards.reserve(txn, "s0", "a")
    send(tables, txn)
    tables.fenced_out(txn.id)
    assert shards.reserve(tables.prepare(0), "s0").task == "b"
    assert shards.reserve(tables.prepare(1), "s0").task == "a"
    with pytest.raises(Unavailable):
        shards.reserve(tables.prepare(2), "s0")


# -- self-config parameters: delete the token / observe no reward ---------------


def make_bandit(policy: str = "ucb1") -> tuple[DispatchTables, ParameterBandit]:
    tables = DispatchTables(2)
    configs = {"fast": {"timeout": 1}, "deep": {"timeout": 30}}
    bandit = ParameterBandit(
        tables, configs, policy="thompson" if policy == "thompson" else "ucb1", seed=3
    )
    return tables, bandit


def test_params_undo_deletes_the_token_and_the_pull_does_not_count() -> None:
    tables, bandit = make_bandit()
    txn = tables.prepare(0)
    first = bandit.reserve(txn)
    assert first.arm == "fast" and first.config == {"timeout": 1}
    assert bandit.pulls("fast") == 1
    assert tables.abort(txn.id) == ()
    assert bandit.pending_arm(first.token) is None
    assert bandit.pulls("fast") == 0  # D3
    # UCB1 still owes "fast" its first pull; tokens are never reused.
    again = bandit.reserve(tables.prepare(0))
    assert again.arm == "fast" and again.token != first.token


def test_params_discard_deletes_the_token_and_learns_no_reward() -> None:
    tables, bandit = make_bandit()
    txn = tables.prepare(0)
    assignment = bandit.reserve(txn)
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()
    assert bandit.pending_arm(assignment.token) is None
    assert bandit.pulls("fast") == 1  # the true dispatch count stays (D4)
    assert (bandit.observations("fast"), bandit.reward_sum("fast")) == (0, 0.0)
    with pytest.raises(NotReserved):
        bandit.observe(assignment.token, 1.0)  # a late result is never learned


def test_params_success_observes_then_commit_drops_the_token() -> None:
    tables, bandit = make_bandit()
    txn = tables.prepare(0)
    assignment = bandit.reserve(txn)
    send(tables, txn)
    with tables.committing(txn.id):
        assert bandit.observe(assignment.token, 0.75) is True
        assert bandit.observe(assignment.token, 0.75) is False  # a rerun of triage
        assert bandit.leaks() != []  # held until the release (D6)
    assert bandit.pending_arm(assignment.token) is None
    assert (bandit.observations("fast"), bandit.reward_sum("fast")) == (1, 0.75)
    assert bandit.leaks() == []


@pytest.mark.parametrize("policy", ["ucb1", "thompson"])
def test_params_bandit_learns_the_better_configuration(policy: str) -> None:
    tables, bandit = make_bandit(policy)
    outcome = random.Random(11)
    for _ in range(300):
        txn = tables.prepare(0)
        assignment = bandit.reserve(txn)
        send(tables, txn)
        chance = 0.9 if assignment.arm == "deep" else 0.2
        with tables.committing(txn.id):
            bandit.observe(assignment.token, 1.0 if outcome.random() < chance else 0.0)
    assert bandit.pulls("deep") > 3 * bandit.pulls("fast")


def test_params_thompson_is_reproducible_from_its_seed() -> None:
    def arms() -> list[str]:
        tables, bandit = make_bandit("thompson")
        chosen = []
        for _ in range(20):
            txn = tables.prepare(0)
            chosen.append(bandit.reserve(txn).arm)
            send(tables, txn)
            with tables.committing(txn.id):
                bandit.observe(f"params:{len(chosen)}", 0.5)
        return chosen

    assert arms() == arms()


def test_params_an_exception_in_the_dispatch_block_undoes_at_once() -> None:
    tables, bandit = make_bandit()
    with pytest.raises(OSError), tables.dispatch(0) as txn:
        bandit.reserve(txn)
        raise OSError("send failed")  # D8
    assert bandit.pulls("fast") == 0 and bandit.leaks() == []


# -- multi-stage algorithm: exact rewind / drop the feedback only ---------------


def make_selector(workers: int = 4, seed: int = 5) -> tuple[DispatchTables, AlgorithmSelector]:
    tables = DispatchTables(workers)
    return tables, AlgorithmSelector(tables, STAGES, seed=seed)


def run_committed(tables: DispatchTables, selector: AlgorithmSelector, reward: float) -> None:
    txn = tables.prepare(0)
    selection = selector.reserve(txn)
    send(tables, txn)
    with tables.committing(txn.id):
        selector.feedback(selection.token, reward)


def test_algorithm_undo_before_send_rewinds_exactly() -> None:
    tables, selector = make_selector()
    for reward in (1.0, 0.0, 0.5, 1.0):  # past the first walk: the RNG is in use
        run_committed(tables, selector, reward)
    before = selector.snapshot()
    txn = tables.prepare(1)
    selection = selector.reserve(txn)
    assert selector.seq == selection.seq == before["seq"] + 1
    assert list(selector.rng_state()[1]) != before["rng"]["internal"]  # the RNG was drawn
    assert tables.abort(txn.id) == ()
    assert selector.snapshot() == before  # cursor, counts, RNG, seq: all of it
    assert selector.reserve(tables.prepare(1)) == selection  # the same stage and token


def test_algorithm_undo_rewinds_the_stage_cursor() -> None:
    tables, selector = make_selector()
    txn = tables.prepare(0)
    assert selector.reserve(txn).stage == "det"
    assert selector.cursor == 1
    tables.abort(txn.id)
    assert (selector.cursor, selector.seq, selector.pulls("det")) == (0, 0, 0)


def test_algorithm_late_undo_takes_back_the_pull_but_not_cursor_rng_or_seq() -> None:
    tables, selector = make_selector()
    early = tables.prepare(0)
    first = selector.reserve(early)
    later = tables.prepare(1)
    second = selector.reserve(later)
    state = (selector.cursor, selector.seq, selector.rng_state())
    assert not selector.can_rewind(first.token) and selector.can_rewind(second.token)
    assert tables.abort(early.id) == ()
    assert selector.pending_stage(first.token) is None
    assert selector.pulls(first.stage) == 0  # D3: never counted
    assert (selector.cursor, selector.seq, selector.rng_state()) == state
    # The later one is still exactly rewindable; the late one's seq is never reused.
    assert tables.abort(later.id) == ()
    assert (selector.cursor, selector.seq) == (1, first.seq)
    assert selector.reserve(tables.prepare(1)) == second


def test_algorithm_an_earlier_selection_is_late_once_a_later_one_was_undone_late() -> None:
    """Z, A, B unsent; A undone late, B rewound exactly: Z is still late, since
    A (a later selection) used the sequence number and the RNG."""
    tables, selector = make_selector()
    for _ in range(3):
        run_committed(tables, selector, 1.0)  # past the first walk
    txns = [tables.prepare(w) for w in (1, 2, 3)]
    z, a = selector.reserve(txns[0]), selector.reserve(txns[1])
    after_a = selector.rng_state()
    b = selector.reserve(txns[2])
    assert tables.abort(txns[1].id) == ()  # A: late
    assert tables.abort(txns[2].id) == ()  # B: exact, back to just after A
    assert selector.seq == a.seq
    assert not selector.can_rewind(z.token)
    assert tables.abort(txns[0].id) == ()  # Z: late
    assert selector.seq == a.seq  # A's token is never handed out again
    assert selector.rng_state() == after_a
    assert selector.reserve(tables.prepare(1)).token == b.token
    assert sum(selector.pulls(stage) for stage in STAGES) == 3 + 1


def test_algorithm_discard_drops_the_pending_feedback_only() -> None:
    tables, selector = make_selector()
    txn = tables.prepare(0)
    selection = selector.reserve(txn)
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()
    assert selector.pending_stage(selection.token) is None
    assert selector.pulls("det") == 1  # the stage that ran stays run
    assert (selector.cursor, selector.seq) == (1, 1)
    assert selector.reward_sum("det") == 0.0
    assert selector.snapshot()["window"] == []  # a sent selection is never rewound
    assert selector.reserve(tables.prepare(0)).stage == "havoc"


def test_algorithm_feedback_then_commit_drops_the_token() -> None:
    tables, selector = make_selector()
    txn = tables.prepare(0)
    selection = selector.reserve(txn)
    send(tables, txn)
    with tables.committing(txn.id):
        assert selector.feedback(selection.token, 1.0) is True
        assert selector.snapshot()["window"] == []  # feedback proves it went out
        assert selector.feedback(selection.token, 1.0) is False
    assert selector.reward_sum("det") == 1.0
    assert selector.leaks() == []
    assert selector.snapshot()["window"] == []


def test_algorithm_commit_without_feedback_learns_nothing_and_drops_the_token() -> None:
    tables, selector = make_selector()
    txn = tables.prepare(0)
    selection = selector.reserve(txn)
    send(tables, txn)
    commit(tables, txn)
    assert selector.pending_stage(selection.token) is None
    assert (selector.pulls("det"), selector.reward_sum("det")) == (1, 0.0)
    assert selector.snapshot()["window"] == []


def test_algorithm_a_sent_selection_is_never_rewound_exactly() -> None:
    tables, selector = make_selector()
    txn = tables.prepare(0)
    selection = selector.reserve(txn)
    send(tables, txn)
    with tables.committing(txn.id):
        selector.feedback(selection.token, 1.0)
    assert not selector.can_rewind(selection.token)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    warm_rewards=st.lists(st.sampled_from([0.0, 0.25, 1.0]), max_size=8),
    sent_groups=st.lists(st.tuples(st.integers(1, 3), st.booleans()), max_size=3),
    unsent_groups=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    rewound=st.integers(1, 4),
    rebase_draws=st.sampled_from([0, 7, 4096]),
)
def test_algorithm_lifo_rewind_of_unsent_selections_is_exact_and_replays(
    seed: int,
    warm_rewards: list[float],
    sent_groups: list[tuple[int, bool]],
    unsent_groups: list[int],
    rewound: int,
    rebase_draws: int,
) -> None:
    """Any LIFO rewind of unsent selections restores the sequence number and
    the RNG (and the rest) exactly, and the next selections replay the same
    stages and tokens; also when the RNG's saved base moves forward often."""
    with patch.object(algorithms_module, "_REBASE_DRAWS", rebase_draws):
        lifo_rewind_scenario(seed, warm_rewards, sent_groups, unsent_groups, rewound)


def lifo_rewind_scenario(
    seed: int,
    warm_rewards: list[float],
    sent_groups: list[tuple[int, bool]],
    unsent_groups: list[int],
    rewound: int,
) -> None:
    tables = DispatchTables(1 + len(sent_groups) + len(unsent_groups))
    selector = AlgorithmSelector(tables, STAGES, seed=seed)
    for reward in warm_rewards:
        run_committed(tables, selector, reward)
    worker = 1
    to_commit: list[tuple[Transaction, list[AlgorithmSelection]]] = []
    for count, committed in sent_groups:  # earlier selections that went out
        txn = tables.prepare(worker)
        made = [selector.reserve(txn) for _ in range(count)]
        send(tables, txn)
        if committed:
            to_commit.append((txn, made))
        worker += 1
    for txn, made in to_commit:  # moves the oldest rewindable selection on
        with tables.committing(txn.id):
            for selection in made:
                selector.feedback(selection.token, 0.5)
    unsent: list[tuple[Transaction, dict[str, Any], list[AlgorithmSelection]]] = []
    for count in unsent_groups:
        before = selector.snapshot()
        txn = tables.prepare(worker)
        made = [selector.reserve(txn) for _ in range(count)]
        unsent.append((txn, before, made))
        worker += 1
    after_all = selector.snapshot()
    rewound = min(rewound, len(unsent))
    for txn, before, _ in reversed(unsent[-rewound:]):  # newest first: LIFO
        assert tables.abort(txn.id) == ()
        assert selector.snapshot() == before
        assert selector.seq == before["seq"]
        assert list(selector.rng_state()[1]) == before["rng"]["internal"]
        assert selector.snapshot()["draws"] == before["draws"]
    for txn, _, made in unsent[-rewound:]:  # the replay
        again = tables.prepare(txn.worker)
        assert [selector.reserve(again) for _ in made] == made
    assert without_dispatch_ids(selector.snapshot()) == without_dispatch_ids(after_all)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    order=st.permutations(range(4)),
    warm=st.integers(0, 5),
)
def test_algorithm_any_undo_order_never_counts_an_unsent_pull(
    seed: int, order: list[int], warm: int
) -> None:
    """Undone in any order, exactly or late, no unsent selection stays
    counted and no token is handed out twice while pending."""
    tables, selector = make_selector(workers=5, seed=seed)
    for _ in range(warm):
        run_committed(tables, selector, 0.5)
    pulls_before = {stage: selector.pulls(stage) for stage in STAGES}
    txns = [tables.prepare(1 + i) for i in range(4)]
    tokens = [selector.reserve(txn).token for txn in txns]
    assert len(set(tokens)) == 4
    for i in order:
        assert tables.abort(txns[i].id) == ()
    assert {stage: selector.pulls(stage) for stage in STAGES} == pulls_before
    assert selector.leaks() == []
    fresh = [selector.reserve(tables.prepare(1 + i)).token for i in range(4)]
    assert len(set(fresh)) == 4


# -- seed-to-worker: take back the count / keep the true count ------------------


def test_pairing_undo_drops_the_pairing_and_takes_back_the_count() -> None:
    tables = DispatchTables(2)
    pairing = SeedPairing(tables)
    txn = tables.prepare(1)
    assert pairing.reserve(txn, "seed-a") == Pairing("seed-a", 1, txn.id)
    assert (pairing.paired_worker("seed-a"), pairing.assignments("seed-a", 1)) == (1, 1)
    assert tables.abort(txn.id) == ()
    assert pairing.paired_worker("seed-a") is None
    assert (pairing.assignments("seed-a"), pairing.assignments("seed-a", 1)) == (0, 0)


def test_pairing_discard_drops_the_pairing_and_keeps_the_true_count() -> None:
    tables = DispatchTables(2)
    pairing = SeedPairing(tables)
    txn = tables.prepare(1)
    pairing.reserve(txn, "seed-a")
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()
    assert pairing.paired_worker("seed-a") is None
    assert (pairing.assignments("seed-a"), pairing.assignments("seed-a", 1)) == (1, 1)


def test_pairing_commit_releases_and_a_paired_seed_is_unavailable() -> None:
    tables = DispatchTables(2)
    pairing = SeedPairing(tables)
    txn = tables.prepare(0)
    pairing.reserve(txn, "seed-a")
    with pytest.raises(Unavailable):
        pairing.reserve(tables.prepare(1), "seed-a")
    assert pairing.least_assigned(["seed-a", "seed-b"], worker=1) == "seed-b"
    send(tables, txn)
    commit(tables, txn)
    assert pairing.leaks() == [] and pairing.assignments("seed-a", 0) == 1
    assert pairing.least_assigned(["seed-a", "seed-b"], worker=0) == "seed-b"


# -- verified proposals: take back the attempt / retry with "result lost" -------


def test_proposal_undo_takes_back_the_attempt_and_keeps_its_turn() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables, max_attempts=2)
    board.propose("p1", {"input": "AAAA"})
    board.propose("p2")
    txn = tables.prepare(0)
    assert board.reserve(txn) == ProposalTicket("p1", 1, txn.id)
    assert board.state("p1") is ProposalState.DISPATCHED
    assert tables.abort(txn.id) == ()
    assert (board.state("p1"), board.attempts("p1"), board.reason("p1")) == (
        ProposalState.PENDING,
        0,
        None,
    )
    assert board.pending() == ["p1", "p2"]


def test_proposal_discard_keeps_the_attempt_and_retries_then_rejects() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables, max_attempts=2)
    board.propose("p1")
    board.propose("p2")
    for attempt, expected in ((1, ProposalState.PENDING), (2, ProposalState.REJECTED)):
        txn = tables.prepare(0)
        board.reserve(txn, "p1")
        send(tables, txn)
        assert tables.fenced_out(txn.id) == ()
        assert board.attempts("p1") == attempt
        assert (board.state("p1"), board.reason("p1")) == (expected, RESULT_LOST)
    assert board.pending() == ["p2"]
    assert board.leaks() == []


def test_proposal_verdict_via_triage_then_release() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables)
    board.propose("p1")
    txn = tables.prepare(0)
    board.reserve(txn)
    send(tables, txn)
    with tables.committing(txn.id):
        assert board.verdict("p1", accepted=True, reason="verified") is True
        assert [leak.kind for leak in board.leaks()] == ["accepted proposal"]
    assert (board.state("p1"), board.attempts("p1")) == (ProposalState.ACCEPTED, 1)
    assert board.leaks() == []
    assert board.verdict("p1", accepted=True, reason="verified") is False  # a rerun
    with pytest.raises(Exception, match="refusing verdict"):
        board.verdict("p1", accepted=False)


def test_proposal_committed_without_a_verdict_is_queued_again_and_reported() -> None:
    tables = DispatchTables(2)
    board = ProposalBoard(tables)
    board.propose("p1")
    txn = tables.prepare(0)
    board.reserve(txn)
    send(tables, txn)
    with pytest.raises(CompensationError) as raised, tables.committing(txn.id):
        pass  # a triage that forgot the verdict
    assert [f.resource for f in raised.value.failures] == ["proposals"]
    assert tables.phase_of(txn.id) is None  # COMMITTED all the same
    assert (board.state("p1"), board.attempts("p1")) == (ProposalState.PENDING, 1)


PROPOSAL_OPS = ("dispatch", "send", "abort", "fenced_out", "finish", "lose", "park")


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(PROPOSAL_OPS), st.integers(0, 2)), max_size=60),
    max_attempts=st.integers(1, 4),
)
def test_proposal_attempts_counted_equal_dispatches_sent(
    ops: list[tuple[str, int]], max_attempts: int
) -> None:
    tables = DispatchTables(3)
    board = ProposalBoard(tables, max_attempts=max_attempts)
    for i in range(5):
        board.propose(f"p{i}")
    carried: dict[int, str] = {}  # dispatch id -> proposal id
    sent: dict[str, int] = {f"p{i}": 0 for i in range(5)}

    def latest(worker: int, phase: Phase) -> Transaction | None:
        found = [txn for txn in tables.in_flight(worker) if txn.phase is phase]
        return found[-1] if found else None

    def triage(txn: Transaction) -> None:
        with tables.committing(txn.id):
            board.verdict(carried[txn.id], accepted=txn.id % 2 == 0)

    for op, worker in ops:
        preparing = latest(worker, Phase.PREPARING)
        active = latest(worker, Phase.ACTIVE)
        if op == "dispatch" and preparing is None and active is None and board.pending():
            txn = tables.prepare(worker)
            carried[txn.id] = board.reserve(txn).proposal_id
        elif op == "send" and preparing is not None:
            send(tables, preparing)
            sent[carried[preparing.id]] += 1
        elif op == "abort" and preparing is not None:
            assert tables.abort(preparing.id) == ()
        elif op == "fenced_out" and active is not None:
            assert tables.fenced_out(active.id) == ()
        elif op == "finish" and active is not None:
            triage(active)
        elif op == "park" and active is not None:
            tables.fence_passed(active.id)  # stays COMMITTING across later moves
        elif op == "lose":
            assert tables.lose_worker(worker) == ()
        # An attempt is counted at reservation: until its dispatch is sent or
        # undone, a PREPARING one is counted too.
        unsent = [carried[t.id] for t in tables.in_flight() if t.phase is Phase.PREPARING]
        assert {p: board.attempts(p) - unsent.count(p) for p in sent} == sent
    assert tables.shutdown() == ()
    for txn in list(tables.in_flight()):
        triage(txn)  # the parked ones: finished by the caller
    assert {p: board.attempts(p) for p in sent} == sent
    assert board.leaks() == []
    for p, count in sent.items():
        state = board.state(p)
        assert state is not ProposalState.DISPATCHED
        if state is ProposalState.PENDING:
            assert count < max_attempts
        if state is ProposalState.REJECTED and board.reason(p) == RESULT_LOST:
            assert count == max_attempts


# -- worker object cache: nothing to undo ----------------------------------------


def test_cache_an_unsent_message_leaves_the_worker_without_the_content() -> None:
    tables = DispatchTables(2)
    cache = ObjectCache(tables)
    txn = tables.prepare(0)
    assert cache.reserve(txn, ["corpus/1", "dict"]) == ["corpus/1", "dict"]
    assert len(txn) == 0  # nothing to undo: no compensation at all
    assert tables.abort(txn.id) == ()
    txn = tables.prepare(0)
    assert cache.reserve(txn, ["corpus/1", "dict"]) == ["corpus/1", "dict"]  # fault point 5
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()  # the worker got the content all the same
    txn = tables.prepare(0)
    assert cache.reserve(txn, ["corpus/1", "dict", "corpus/2"]) == ["corpus/2"]
    assert cache.leaks() == []


def test_cache_a_reported_miss_is_carried_until_a_commit_proves_delivery() -> None:
    tables = DispatchTables(2)
    cache = ObjectCache(tables)
    txn = tables.prepare(0)
    cache.reserve(txn, ["dict"])
    send(tables, txn)
    commit(tables, txn)
    cache.report_miss(0, "dict")  # the worker restarted and lost it
    for end in ("abort", "fenced_out", "commit"):
        txn = tables.prepare(0)
        assert cache.reserve(txn, ["dict"]) == ["dict"]
        assert len(txn) == 1
        if end == "abort":
            tables.abort(txn.id)
        else:
            send(tables, txn)
            if end == "fenced_out":
                tables.fenced_out(txn.id)
            else:
                commit(tables, txn)
        assert cache.to_recarry(0) == ([] if end == "commit" else ["dict"])
    assert cache.reserve(tables.prepare(0), ["dict"]) == []
    assert cache.misses == 1


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
