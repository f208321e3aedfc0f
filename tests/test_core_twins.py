"""The compiled core and its pure twin, driven side by side in one process by
a Hypothesis state machine: they must agree step by step, and every
compensation must run exactly once unless its dispatch finished (then each
release runs once)."""

from __future__ import annotations

import os
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dispatchtx import _core_py
from dispatchtx.errors import DispatchError


def _load_compiled() -> ModuleType | None:
    try:
        from dispatchtx import _core
    except ImportError:
        if os.environ.get("DISPATCHTX_EXPECT_BUILD") == "compiled":
            raise
        return None
    return _core


compiled = _load_compiled()
pytestmark = pytest.mark.skipif(
    compiled is None, reason="the compiled core is not built in this leg (pure build)"
)

N_WORKERS = 3
RESOURCES = ("lease", "journal", "bandit")


class Twin:
    """One build's tables, with compensations that log every call."""

    def __init__(self, module: Any) -> None:
        self.tables = module.DispatchTables(N_WORKERS, max_in_flight=2, first_id=100)
        self.log: list[tuple[str, str, int]] = []
        self.comps = {
            name: self.tables.compensation(
                name,
                self._logger(name, "before"),
                self._logger(name, "after"),
                self._logger(name, "commit"),
            )
            for name in RESOURCES
        }

    def _logger(self, name: str, side: str) -> Any:
        def call(arg: int) -> None:
            self.log.append((name, side, arg))
            # One resource kind fails on some reservations: failures must be
            # recorded alike and must not stop the others.
            if name == "bandit" and arg % 3 == 0:
                raise RuntimeError(f"{name}.{side}({arg})")

        return call

    def do(self, method: str, *args: Any) -> object:
        try:
            result = getattr(self.tables, method)(*args)
        except DispatchError as error:  # ours: the same type and message
            return ("raised", type(error).__name__, str(error))
        except Exception as error:  # compared across builds, not hidden
            return ("raised", type(error).__name__)
        return normalize(result)

    def state(self) -> list[tuple[int, int, str, float | None, int]]:
        return [
            (txn.id, txn.worker, txn.phase.name, txn.sent_at, len(txn))
            for txn in self.tables.in_flight()
        ]


def normalize(result: object) -> object:
    if result is None or isinstance(result, list | int):
        return result
    if isinstance(result, tuple):
        return tuple(
            (f.dispatch_id, f.worker, f.resource, f.side.name, type(f.error).__name__)
            for f in result
        )
    if hasattr(result, "__next__"):
        return [normalize(txn) for txn in result]  # type: ignore[attr-defined]
    txn: Any = result
    return ("txn", txn.id, txn.worker, txn.phase.name, txn.sent_at, len(txn))


class CoreTwins(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert compiled is not None
        self.pure = Twin(_core_py)
        self.fast = Twin(compiled)
        self.ids: list[int] = []
        self.next_arg = 0
        self.added: Counter[int] = Counter()  # reservations per dispatch
        self.arg_owner: dict[int, int] = {}
        self.finished: set[int] = set()

    def both(self, method: str, *args: Any) -> object:
        a = self.pure.do(method, *args)
        b = self.fast.do(method, *args)
        assert a == b, f"{method}{args}: pure {a!r} != compiled {b!r}"
        return a

    @rule(worker=st.one_of(st.integers(-1, N_WORKERS), st.booleans()))
    def prepare(self, worker: int) -> None:
        result = self.both("prepare", worker)
        if isinstance(result, tuple) and result[0] == "txn":
            self.ids.append(result[1])

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), resource=st.sampled_from(RESOURCES))
    def add(self, data: st.DataObject, resource: str) -> None:
        dispatch_id = data.draw(st.sampled_from(self.ids))
        arg = self.next_arg
        self.next_arg += 1
        outcomes = []
        for twin in (self.pure, self.fast):
            txn = twin.tables.get(dispatch_id)
            if txn is None:
                outcomes.append("gone")
                continue
            try:
                txn.add(twin.comps[resource], arg)
                outcomes.append("added")
            except Exception as error:
                outcomes.append(type(error).__name__)
        assert outcomes[0] == outcomes[1]
        if outcomes[0] == "added":
            self.arg_owner[arg] = dispatch_id

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), objects=st.lists(st.sampled_from("xyz"), max_size=3))
    def ship(self, data: st.DataObject, objects: list[str]) -> None:
        dispatch_id = data.draw(st.sampled_from(self.ids))
        outcomes = []
        for twin in (self.pure, self.fast):
            txn = twin.tables.get(dispatch_id)
            try:
                outcomes.append("gone" if txn is None else txn.ship(objects))
            except Exception as error:
                outcomes.append(type(error).__name__)
        assert outcomes[0] == outcomes[1]

    @precondition(lambda self: bool(self.ids))
    @rule(
        data=st.data(),
        now=st.one_of(st.floats(0.0, 50.0), st.integers(0, 50), st.just(float("nan"))),
    )
    def sent(self, data: st.DataObject, now: float) -> None:
        self.both("sent", data.draw(st.sampled_from(self.ids)), now)

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), tag=st.integers())
    def set_tag(self, data: st.DataObject, tag: int) -> None:
        dispatch_id = data.draw(st.sampled_from(self.ids))
        outcomes = []
        for twin in (self.pure, self.fast):
            txn = twin.tables.get(dispatch_id)
            try:
                if txn is not None:
                    txn.tag = tag
                outcomes.append("gone" if txn is None else txn.tag)
            except DispatchError as error:
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1]

    @rule(worker=st.integers(0, N_WORKERS - 1), send=st.booleans())
    def dispatch_block_that_raises(self, worker: int, send: bool) -> None:
        outcomes = []
        for twin in (self.pure, self.fast):
            try:
                with twin.tables.dispatch(worker) as txn:
                    txn.add(twin.comps["lease"], -1)
                    if send:
                        twin.tables.sent(txn.id, 60.0)
                    raise LookupError("build failed")
            except LookupError:
                outcomes.append("compensated")
            except DispatchError as error:
                outcomes.append(str(error))
        assert outcomes[0] == outcomes[1]

    @precondition(lambda self: bool(self.ids))
    @rule(
        data=st.data(),
        move=st.sampled_from(["abort", "fence_passed", "finished", "fenced_out"]),
    )
    def move(self, data: st.DataObject, move: str) -> None:
        dispatch_id = data.draw(st.sampled_from(self.ids))
        result = self.both(move, dispatch_id)
        if move == "finished" and not (isinstance(result, tuple) and result[:1] == ("raised",)):
            self.finished.add(dispatch_id)

    @rule(worker=st.integers(0, N_WORKERS - 1))
    def lose_worker(self, worker: int) -> None:
        self.both("lose_worker", worker)

    @rule()
    def shutdown(self) -> None:
        self.both("shutdown")

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), worker=st.integers(0, N_WORKERS - 1))
    def match(self, data: st.DataObject, worker: int) -> None:
        self.both("match", worker, data.draw(st.sampled_from(self.ids)))

    @rule(cutoff=st.floats(-1.0, 50.0))
    def sent_before(self, cutoff: float) -> None:
        self.both("sent_before", cutoff)

    @rule(worker=st.integers(0, N_WORKERS - 1))
    def missing(self, worker: int) -> None:
        self.both("missing", worker, ["x", "y", "z"])

    @invariant()
    def builds_agree(self) -> None:
        assert self.pure.state() == self.fast.state()
        assert self.pure.log == self.fast.log
        assert len(self.pure.tables) == len(self.fast.tables)

    @invariant()
    def each_compensation_runs_once_unless_finished(self) -> None:
        # (negative args belong to the dispatch blocks, which end inside their rule)
        calls = Counter(arg for _, side, arg in self.pure.log if side != "commit" and arg >= 0)
        releases = Counter(arg for _, side, arg in self.pure.log if side == "commit")
        for arg, count in calls.items():
            assert count == 1, f"reservation {arg} compensated {count} times"
            assert self.arg_owner[arg] not in self.finished
        for arg, count in releases.items():
            assert count == 1, f"reservation {arg} released {count} times"
            assert self.arg_owner[arg] in self.finished
        for arg, owner in self.arg_owner.items():
            if owner in self.finished:
                assert releases[arg] == 1

    def teardown(self) -> None:
        if compiled is None:
            return
        self.both("shutdown")
        self.builds_agree()
        # Every reservation of a dispatch that did not finish and is not
        # parked COMMITTING was compensated exactly once.
        committing = {
            txn.id for txn in self.pure.tables.in_flight() if txn.phase.name == "COMMITTING"
        }
        calls = Counter(arg for _, side, arg in self.pure.log if side != "commit")
        for arg, owner in self.arg_owner.items():
            if owner not in self.finished and owner not in committing:
                assert calls[arg] == 1


CoreTwins.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCoreTwins = CoreTwins.TestCase
