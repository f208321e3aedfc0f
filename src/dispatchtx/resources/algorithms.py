"""Multi-stage algorithm selection (docs/design.md).

A selection picks one stage of a multi-stage algorithm for a dispatch. The
stage cursor first walks every stage once, in order (each stage's first run
is scheduled); after that, Thompson sampling with the adapter's seeded
`random.Random` picks the stage: each stage is drawn from
Beta(1 + rewards, 1 + pulls - rewards), its prior counts, so a pull still
waiting for its feedback (or whose result was lost) weighs as a miss and
concurrent selections spread over the stages. Every selection takes the next
global sequence number and opens a pending feedback token named by it.

What each end of the dispatch does:

- undo before send, with no later selection standing: an exact rewind. The
  cursor, the stage's pull count, the RNG state and the sequence number go
  back to what they were before the selection, so the next selection
  replays the same stage and token. Rewinding several unsent selections in
  LIFO order is exact for each of them.
- undo before send after a later selection was made (a late undo): delete
  the pending token and take back the stage's pull count (D3), but leave the
  cursor, the RNG and the sequence number alone: the later selection used
  them.
- discard after a stale or lost result: drop the pending feedback only; the
  stage that ran stays run (its pull stays counted, its cursor step stays).
- success: triage calls `feedback(token, reward)`, then the release on
  commit drops the token.

How the RNG is rewound cheaply: `random.Random.getstate()` builds (and later
frees) 625 ints, about 20 us a selection, so a selection does not save it.
The RNG counts its draws instead, and the selector keeps ONE saved state, the
base, at or before every selection still rewindable. An exact rewind is
`setstate(base)` plus skipping the draws up to the selection's position: a
rare path, bounded by moving the base forward every few thousand draws. The
latest `rewind_depth` selections are rewindable; an older one is undone
late, which is always safe.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    JournaledAdapter,
    JsonDict,
    Leak,
    NotReserved,
    SnapshotError,
    as_object,
    check_reward,
    expect_kind,
    get_float,
    get_int,
    get_list,
    get_optional_float,
    get_str,
    rng_state_from_json,
    rng_state_to_json,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from dispatchtx import DispatchTables, Transaction

__all__ = ["AlgorithmSelection", "AlgorithmSelector"]

_KIND = "algorithms"
_VERSION = 1

# Move the base forward once the oldest rewindable position is this many
# draws past it: an exact rewind then skips at most this many (~0.2 ms).
_REBASE_DRAWS = 4096

_DRAW = random.Random.random


class _CountingRandom(random.Random):
    """A `random.Random` that counts its draws, so that a position in its
    stream is an int. The selector draws only through `betavariate`, which
    draws only through `random()`."""

    def __init__(self, seed: int) -> None:
        self.draws = 0
        super().__init__(seed)

    def random(self) -> float:
        self.draws += 1
        return _DRAW(self)

    def skip(self, count: int) -> None:
        """Advance by `count` draws."""
        draw = _DRAW
        for _ in range(count):
            draw(self)
        self.draws += count


class AlgorithmSelection(NamedTuple):
    """What `reserve` hands back: the feedback token, the stage to run, and
    the global sequence number of the selection."""

    token: str
    stage: str
    seq: int


@dataclass(slots=True)
class _Stage:
    name: str
    pulls: int = 0  # selections that went out, or are pending now
    reward_sum: float = 0.0


@dataclass(slots=True)
class _Pending:
    stage: int
    dispatch_id: int
    seq: int
    reward: float | None = None  # set once triage has given feedback


@dataclass(frozen=True, slots=True)
class _Rewind:
    """The state just before one selection: what an exact rewind restores."""

    token: str
    cursor: int
    draws: int  # the RNG's position
    seq: int
    # The RNG base this selection moved forward, if it did (rare), so that a
    # rewind leaves no trace at all.
    base: tuple[tuple[Any, ...], int] | None = None


class AlgorithmSelector(AdapterBase[str], JournaledAdapter):
    """Stage selection with a cursor, prior counts, a seeded RNG, a global
    sequence number and pending feedback tokens."""

    __slots__ = (
        "_cursor",
        "_pending",
        "_base_draws",
        "_base_state",
        "_rng",
        "_seq",
        "_stages",
        "_window",
    )

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = (
        "select",
        "undo",
        "discard",
        "feedback",
        "settle",
    )

    def __init__(
        self,
        tables: DispatchTables[Any],
        stages: Sequence[str],
        *,
        seed: int = 0,
        rewind_depth: int = 32,
        name: str = "algorithms",
    ) -> None:
        super().__init__(tables, name, self.undo, self.discard, self.settle)
        names = list(stages)
        if not names or any(not isinstance(s, str) or not s for s in names):
            raise ValueError("stages must be a non-empty sequence of non-empty str")
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be distinct, got {names}")
        if rewind_depth < 1:
            raise ValueError(f"rewind_depth must be >= 1, got {rewind_depth}")
        self._stages = [_Stage(stage) for stage in names]
        self._cursor = 0
        self._rng = _CountingRandom(seed)
        # The RNG state at position `_base_draws`, at or before every saved
        # position in the window.
        self._base_state = self._rng.getstate()
        self._base_draws = 0
        self._seq = 0
        self._pending: dict[str, _Pending] = {}
        # Pre-selection states, oldest first; only the newest can be rewound
        # exactly, and only while the sequence number is still its own.
        self._window: deque[_Rewind] = deque(maxlen=rewind_depth)

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any]) -> AlgorithmSelection:
        """Select a stage for `txn` and open its pending feedback token."""
        self._require_preparing(txn)
        selection = self._ev_select(txn.id)
        self._register(txn, selection.token, self.undo)
        return selection

    def _choose(self) -> int:
        if self._cursor < len(self._stages):
            return self._cursor
        betavariate = self._rng.betavariate
        best = 0
        best_score = -1.0
        for index, stage in enumerate(self._stages):
            misses = max(0.0, stage.pulls - stage.reward_sum)
            score = betavariate(1.0 + stage.reward_sum, 1.0 + misses)
            if score > best_score:
                best, best_score = index, score
        return best

    def undo(self, token: str) -> None:
        """Before send: rewind exactly if no later selection stands, else
        take back the token and the pull only (see the module doc)."""
        self._check_pending(token)
        self._ev_undo(token)

    def discard(self, token: str) -> None:
        """After a stale or lost result: drop the pending feedback only."""
        self._check_pending(token)
        self._ev_discard(token)

    def feedback(self, token: str, reward: float) -> bool:
        """Triage's report: learn `reward` (in [0, 1]) for the token's stage.

        Returns False, learning nothing, if this token had its feedback
        already (a rerun of triage); `NotReserved` if it is not pending.
        """
        value = check_reward(reward)
        pending = self._check_pending(token)
        if pending.reward is not None:
            return False
        self._ev_feedback(token, value)
        return True

    def settle(self, token: str) -> None:
        """Release on commit: drop the token."""
        self._check_pending(token)
        self._ev_settle(token)

    def _check_pending(self, token: str) -> _Pending:
        pending = self._pending.get(token)
        if pending is None:
            raise NotReserved(f"{self._name}: no pending token {token!r}")
        return pending

    # -- looking --------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """How many stages the first in-order walk has scheduled."""
        return self._cursor

    @property
    def seq(self) -> int:
        """The global sequence number of the latest selection standing."""
        return self._seq

    def rng_state(self) -> tuple[Any, ...]:
        """`random.Random.getstate()` of the selection RNG."""
        return self._rng.getstate()

    def stages(self) -> list[str]:
        return [stage.name for stage in self._stages]

    def pulls(self, stage: str) -> int:
        """Selections of `stage` that went out or are pending now."""
        return self._stages[self._index(stage)].pulls

    def reward_sum(self, stage: str) -> float:
        return self._stages[self._index(stage)].reward_sum

    def pending_stage(self, token: str) -> str | None:
        """The stage a pending token selected, or None."""
        pending = self._pending.get(token)
        return None if pending is None else self._stages[pending.stage].name

    def can_rewind(self, token: str) -> bool:
        """Whether undoing `token` now would be an exact rewind."""
        pending = self._pending.get(token)
        return pending is not None and self._is_exact(token, pending)

    def _index(self, stage: str) -> int:
        for index, record in enumerate(self._stages):
            if record.name == stage:
                return index
        raise KeyError(stage)

    def leaks(self) -> list[Leak]:
        """Every pending feedback token."""
        return [
            self._leak("pending token", token, pending.dispatch_id)
            for token, pending in self._pending.items()
        ]

    # -- journaled events -----------------------------------------------------

    def _is_exact(self, token: str, pending: _Pending) -> bool:
        window = self._window
        # The newest saved state is this selection's, and every selection
        # after it was rewound exactly (the sequence number is still its own).
        return bool(window) and window[-1].token == token and self._seq == pending.seq

    def _ev_select(self, dispatch_id: int) -> AlgorithmSelection:
        # Deterministic in (state, dispatch_id): replaying it makes the same
        # RNG draws and hands out the same token.
        seq = self._seq + 1
        token = f"{self._name}:{seq}"
        moved_base = self._move_base_forward()
        saved = _Rewind(token, self._cursor, self._rng.draws, self._seq, moved_base)
        index = self._choose()
        if self._cursor < len(self._stages):
            self._cursor += 1
        stage = self._stages[index]
        stage.pulls += 1
        self._seq = seq
        self._pending[token] = _Pending(index, dispatch_id, seq)
        self._window.append(saved)
        return AlgorithmSelection(token, stage.name, seq)

    def _ev_undo(self, token: str) -> None:
        pending = self._pending[token]
        exact = self._is_exact(token, pending)
        del self._pending[token]
        self._stages[pending.stage].pulls -= 1
        if exact:
            saved = self._window.pop()
            self._cursor = saved.cursor
            self._rewind_rng_to(saved.draws)
            if saved.base is not None:
                self._base_state, self._base_draws = saved.base
            self._seq = saved.seq
        else:
            # Late: the cursor, RNG and sequence number stay as later
            # selections left them; only this selection's saved state goes.
            for saved in self._window:
                if saved.token == token:
                    self._window.remove(saved)
                    break

    def _rewind_rng_to(self, draws: int) -> None:
        rng = self._rng
        if rng.draws == draws:
            return  # the selection drew nothing (the cursor's walk)
        rng.setstate(self._base_state)
        rng.draws = self._base_draws
        rng.skip(draws - self._base_draws)

    def _move_base_forward(self) -> tuple[tuple[Any, ...], int] | None:
        """Keep exact rewinds short: once the oldest rewindable position is
        far past the base, move the base to it; return the old base."""
        rng = self._rng
        oldest = self._window[0].draws if self._window else rng.draws
        if oldest - self._base_draws <= _REBASE_DRAWS:
            return None
        old_base = (self._base_state, self._base_draws)
        if oldest == rng.draws:
            self._base_state = rng.getstate()
        else:
            live_state, live_draws = rng.getstate(), rng.draws
            rng.setstate(self._base_state)
            rng.skip(oldest - self._base_draws)
            self._base_state = rng.getstate()
            rng.setstate(live_state)
            rng.draws = live_draws
        self._base_draws = oldest
        return old_base

    def _forget_window_through(self, token: str) -> None:
        # The token went out, so it will never be rewound, and neither will
        # any selection before it (a rewind is LIFO): their saved states go.
        for depth, saved in enumerate(self._window):
            if saved.token == token:
                for _ in range(depth + 1):
                    self._window.popleft()
                return

    def _ev_discard(self, token: str) -> None:
        del self._pending[token]
        self._forget_window_through(token)

    def _ev_feedback(self, token: str, reward: float) -> None:
        pending = self._pending[token]
        pending.reward = reward
        self._stages[pending.stage].reward_sum += reward
        self._forget_window_through(token)

    def _ev_settle(self, token: str) -> None:
        del self._pending[token]
        self._forget_window_through(token)

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """Stages with their prior counts, cursor, sequence number, RNG state,
        pending tokens, and the saved states of the exact-rewind window."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "cursor": self._cursor,
            "seq": self._seq,
            "rng": rng_state_to_json(self._rng.getstate()),
            "draws": self._rng.draws,
            "base": _base_to_json((self._base_state, self._base_draws)),
            "rewind_depth": self._window.maxlen,
            "stages": [
                {"stage": stage.name, "pulls": stage.pulls, "reward_sum": stage.reward_sum}
                for stage in self._stages
            ],
            "pending": [
                {
                    "token": token,
                    "stage": self._stages[pending.stage].name,
                    "dispatch_id": pending.dispatch_id,
                    "seq": pending.seq,
                    "reward": pending.reward,
                }
                for token, pending in self._pending.items()
            ],
            "window": [
                {
                    "token": saved.token,
                    "cursor": saved.cursor,
                    "draws": saved.draws,
                    "base": None if saved.base is None else _base_to_json(saved.base),
                    "seq": saved.seq,
                }
                for saved in self._window
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the whole selector by a `snapshot()`."""
        expect_kind(state, _KIND, _VERSION)
        stages: list[_Stage] = []
        for item in get_list(state, "stages"):
            entry = as_object(item, "a stage")
            stages.append(
                _Stage(
                    get_str(entry, "stage"), get_int(entry, "pulls"), get_float(entry, "reward_sum")
                )
            )
        index_of = {stage.name: index for index, stage in enumerate(stages)}
        if not stages or len(index_of) != len(stages):
            raise SnapshotError("stages must be non-empty and distinct")
        pending: dict[str, _Pending] = {}
        for item in get_list(state, "pending"):
            entry = as_object(item, "a pending token")
            token, stage = get_str(entry, "token"), get_str(entry, "stage")
            if stage not in index_of or token in pending:
                raise SnapshotError(f"pending token {token!r}: unknown stage or duplicate")
            pending[token] = _Pending(
                index_of[stage],
                get_int(entry, "dispatch_id"),
                get_int(entry, "seq"),
                get_optional_float(entry, "reward"),
            )
        window: deque[_Rewind] = deque(maxlen=get_int(state, "rewind_depth", minimum=1))
        for item in get_list(state, "window"):
            entry = as_object(item, "a saved state")
            window.append(
                _Rewind(
                    get_str(entry, "token"),
                    get_int(entry, "cursor"),
                    get_int(entry, "draws"),
                    get_int(entry, "seq"),
                    None if entry.get("base") is None else _base_from_json(entry["base"]),
                )
            )
        cursor = get_int(state, "cursor")
        if cursor > len(stages):
            raise SnapshotError(f"cursor {cursor} is past the {len(stages)} stages")
        rng_state = rng_state_from_json(state.get("rng"))
        draws = get_int(state, "draws")
        base_state, base_draws = _base_from_json(state.get("base"))
        if any(not base_draws <= saved.draws <= draws for saved in window) or base_draws > draws:
            raise SnapshotError("the saved RNG positions must lie between the base and now")
        seq = get_int(state, "seq")
        # Everything is checked: only now does the state change.
        self._stages = stages
        self._cursor = cursor
        self._seq = seq
        self._rng.setstate(rng_state)
        self._rng.draws = draws
        self._base_state = base_state
        self._base_draws = base_draws
        self._pending = pending
        self._window = window


def _base_to_json(base: tuple[tuple[Any, ...], int]) -> JsonDict:
    """An RNG base, (state, position), as `{"rng": ..., "draws": ...}`."""
    return {"rng": rng_state_to_json(base[0]), "draws": base[1]}


def _base_from_json(obj: Any) -> tuple[tuple[Any, ...], int]:
    """The inverse of `_base_to_json`, checked."""
    base = as_object(obj, "an RNG base")
    return rng_state_from_json(base.get("rng")), get_int(base, "draws")
