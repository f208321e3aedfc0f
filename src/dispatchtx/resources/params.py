"""Self-config parameter assignment: a bandit over parameter configurations
(docs/design.md).

Each dispatch is assigned one configuration (an arm) by UCB1 or by Thompson
sampling, and gets a pending token; triage later reports the reward of that
token. What each end of the dispatch does:

- undo before send: delete the pending token, and the pull does not count
  (D3: an unsent task is never counted as a strategy pull);
- discard after a stale or lost result: delete the pending token and learn
  nothing (D4: the pull really happened and stays counted, the untrusted
  result is not learned);
- success: triage calls `observe(token, reward)`, then the release on commit
  drops the token.

Rewards are in [0, 1]. UCB1 plays every arm once, then the arm with the
highest `mean + sqrt(2 ln(total pulls) / pulls)`; pulls still waiting for
their reward count in the exploration term (so concurrent dispatches spread
over the arms) and an arm pulled but never observed has the optimistic mean
1. Thompson sampling draws each arm from Beta(1 + rewards, 1 + observations
- rewards) with the adapter's seeded `random.Random`.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    JournaledAdapter,
    JsonDict,
    Leak,
    NotReserved,
    SnapshotError,
    Unavailable,
    as_object,
    check_reward,
    expect_kind,
    get_dict,
    get_float,
    get_int,
    get_list,
    get_optional_float,
    get_str,
    rng_state_from_json,
    rng_state_to_json,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from dispatchtx import DispatchTables, Transaction

__all__ = ["BanditPolicy", "ParameterAssignment", "ParameterBandit"]

BanditPolicy = Literal["ucb1", "thompson"]
_POLICIES: tuple[BanditPolicy, ...] = ("ucb1", "thompson")

_KIND = "params"
_VERSION = 1


class ParameterAssignment(NamedTuple):
    """What `reserve` hands back: the token to report the reward under, the
    arm, and its configuration (a read-only view)."""

    token: str
    arm: str
    config: Mapping[str, Any]


@dataclass(slots=True)
class _Arm:
    config: dict[str, Any]
    pulls: int = 0  # assignments that went out, or are pending now
    observed: int = 0  # rewards learned
    reward_sum: float = 0.0


@dataclass(slots=True)
class _Pending:
    arm: str
    dispatch_id: int
    reward: float | None = None  # set once triage has observed it


class ParameterBandit(AdapterBase[str], JournaledAdapter):
    """A seeded bandit over named parameter configurations, with one pending
    token per assignment."""

    __slots__ = ("_arms", "_pending", "_policy", "_rng", "_seq", "_total")

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = (
        "add_arm",
        "assign",
        "retract",
        "forget",
        "observe",
        "settle",
    )

    def __init__(
        self,
        tables: DispatchTables[Any],
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        policy: BanditPolicy = "ucb1",
        seed: int = 0,
        name: str = "params",
    ) -> None:
        if policy not in _POLICIES:
            raise ValueError(f"policy must be one of {_POLICIES}, got {policy!r}")
        super().__init__(tables, name, self.undo, self.discard, self.settle)
        self._policy: BanditPolicy = policy
        self._rng = random.Random(seed)
        self._arms: dict[str, _Arm] = {}
        self._pending: dict[str, _Pending] = {}
        self._seq = 0  # tokens are never reused, not even after an undo
        self._total = 0  # sum of pulls over the arms
        for arm, config in (configs or {}).items():
            self.add_arm(arm, config)

    @property
    def policy(self) -> BanditPolicy:
        return self._policy

    # -- configuration ------------------------------------------------------

    def add_arm(self, arm: str, config: Mapping[str, Any]) -> None:
        """Add a configuration to choose from; `config` must be JSON."""
        if not isinstance(arm, str) or not arm:
            raise ValueError(f"an arm name must be a non-empty str, got {arm!r}")
        if arm in self._arms:
            raise ValueError(f"arm {arm!r} already exists")
        # A JSON round trip both checks the config and takes a deep copy.
        copied = json.loads(json.dumps(dict(config), allow_nan=False))
        self._ev_add_arm(arm, copied)

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any]) -> ParameterAssignment:
        """Choose a configuration for `txn` and open its pending token."""
        self._require_preparing(txn)
        if not self._arms:
            raise Unavailable(f"{self._name}: no configuration to choose from")
        assignment = self._ev_assign(txn.id)
        self._register(txn, assignment.token, self.undo)
        return assignment

    def _choose(self) -> str:
        arms = self._arms
        best = ""
        best_score = -math.inf
        if self._policy == "ucb1":
            log_total = math.log(self._total) if self._total > 0 else 0.0
            for arm, record in arms.items():
                if record.pulls == 0:
                    return arm
                mean = record.reward_sum / record.observed if record.observed else 1.0
                score = mean + math.sqrt(2.0 * log_total / record.pulls)
                if score > best_score:
                    best, best_score = arm, score
        else:
            betavariate = self._rng.betavariate
            for arm, record in arms.items():
                misses = max(0.0, record.observed - record.reward_sum)
                score = betavariate(1.0 + record.reward_sum, 1.0 + misses)
                if score > best_score:
                    best, best_score = arm, score
        return best

    def undo(self, token: str) -> None:
        """Before send: delete the pending token; the pull does not count."""
        self._check_pending(token)
        self._ev_retract(token)

    def discard(self, token: str) -> None:
        """After a stale or lost result: delete the token, learn nothing."""
        self._check_pending(token)
        self._ev_forget(token)

    def observe(self, token: str, reward: float) -> bool:
        """Triage's report: learn `reward` (in [0, 1]) for the token's arm.

        Returns False, learning nothing, if this token was observed already
        (a rerun of triage); `NotReserved` if the token is not pending.
        """
        value = check_reward(reward)
        pending = self._check_pending(token)
        if pending.reward is not None:
            return False
        self._ev_observe(token, value)
        return True

    def settle(self, token: str) -> None:
        """Release on commit: drop the token (its reward, if any, is learned)."""
        self._check_pending(token)
        self._ev_settle(token)

    def _check_pending(self, token: str) -> _Pending:
        pending = self._pending.get(token)
        if pending is None:
            raise NotReserved(f"{self._name}: no pending token {token!r}")
        return pending

    # -- looking --------------------------------------------------------------

    def arms(self) -> list[str]:
        return list(self._arms)

    def pulls(self, arm: str) -> int:
        """Assignments of `arm` that went out or are pending now."""
        return self._arms[arm].pulls

    def observations(self, arm: str) -> int:
        """Rewards learned for `arm`."""
        return self._arms[arm].observed

    def reward_sum(self, arm: str) -> float:
        return self._arms[arm].reward_sum

    def pending_arm(self, token: str) -> str | None:
        """The arm a pending token was assigned, or None."""
        pending = self._pending.get(token)
        return None if pending is None else pending.arm

    def leaks(self) -> list[Leak]:
        """Every pending token."""
        return [
            self._leak("pending token", token, pending.dispatch_id)
            for token, pending in self._pending.items()
        ]

    # -- journaled events -----------------------------------------------------

    def _ev_add_arm(self, arm: str, config: dict[str, Any]) -> None:
        self._arms[arm] = _Arm(config)

    def _ev_assign(self, dispatch_id: int) -> ParameterAssignment:
        # Deterministic in (state, dispatch_id): replaying it makes the same
        # RNG draws and hands out the same token.
        arm = self._choose()
        record = self._arms[arm]
        self._seq += 1
        token = f"{self._name}:{self._seq}"
        record.pulls += 1
        self._total += 1
        self._pending[token] = _Pending(arm, dispatch_id)
        return ParameterAssignment(token, arm, MappingProxyType(record.config))

    def _ev_retract(self, token: str) -> None:
        pending = self._pending.pop(token)
        self._arms[pending.arm].pulls -= 1
        self._total -= 1

    def _ev_forget(self, token: str) -> None:
        del self._pending[token]

    def _ev_observe(self, token: str, reward: float) -> None:
        pending = self._pending[token]
        pending.reward = reward
        record = self._arms[pending.arm]
        record.observed += 1
        record.reward_sum += reward

    def _ev_settle(self, token: str) -> None:
        del self._pending[token]

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """Arms, counts, pending tokens, sequence number and RNG state."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "policy": self._policy,
            "seq": self._seq,
            "rng": rng_state_to_json(self._rng.getstate()),
            "arms": [
                {
                    "arm": arm,
                    "config": record.config,
                    "pulls": record.pulls,
                    "observed": record.observed,
                    "reward_sum": record.reward_sum,
                }
                for arm, record in self._arms.items()
            ],
            "pending": [
                {
                    "token": token,
                    "arm": pending.arm,
                    "dispatch_id": pending.dispatch_id,
                    "reward": pending.reward,
                }
                for token, pending in self._pending.items()
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the whole bandit by a `snapshot()`."""
        expect_kind(state, _KIND, _VERSION)
        policy = get_str(state, "policy")
        if policy not in _POLICIES:
            raise SnapshotError(f"unknown policy {policy!r}")
        arms: dict[str, _Arm] = {}
        for item in get_list(state, "arms"):
            entry = as_object(item, "an arm")
            arm = get_str(entry, "arm")
            if arm in arms:
                raise SnapshotError(f"arm {arm!r} appears twice")
            arms[arm] = _Arm(
                get_dict(entry, "config"),
                get_int(entry, "pulls"),
                get_int(entry, "observed"),
                get_float(entry, "reward_sum"),
            )
        pending: dict[str, _Pending] = {}
        for item in get_list(state, "pending"):
            entry = as_object(item, "a pending token")
            token, arm = get_str(entry, "token"), get_str(entry, "arm")
            if arm not in arms or token in pending:
                raise SnapshotError(f"pending token {token!r}: unknown arm or duplicate")
            pending[token] = _Pending(
                arm, get_int(entry, "dispatch_id"), get_optional_float(entry, "reward")
            )
        rng_state = rng_state_from_json(state.get("rng"))
        seq = get_int(state, "seq")
        # Everything is checked: only now does the state change.
        self._policy = "ucb1" if policy == "ucb1" else "thompson"
        self._seq = seq
        self._rng.setstate(rng_state)
        self._arms = arms
        self._pending = pending
        self._total = sum(record.pulls for record in arms.values())
