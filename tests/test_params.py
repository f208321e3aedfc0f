"""The parameter bandit (`dispatchtx.resources.params`): self-config parameters,
through real `DispatchTables` moves, against whichever build of the core is
loaded."""

from __future__ import annotations

import random

import pytest

from dispatchtx import DispatchTables
from dispatchtx.resources import NotReserved, ParameterBandit

from support import send

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
