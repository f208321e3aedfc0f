"""The algorithm selector (`dispatchtx.resources.algorithms`): multi-stage
selection with exact rewind, through real `DispatchTables` moves, against
whichever build of the core is loaded."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx import DispatchTables, Transaction
from dispatchtx.resources import AlgorithmSelection, AlgorithmSelector
from dispatchtx.resources import algorithms as algorithms_module

from support import STAGES, commit, send


def without_dispatch_ids(state: dict[str, Any]) -> dict[str, Any]:
    """A selector snapshot with the pending tokens' dispatch ids left out:
    a replay runs on new dispatches."""
    pending = [{k: v for k, v in p.items() if k != "dispatch_id"} for p in state["pending"]]
    return {**state, "pending": pending}


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
