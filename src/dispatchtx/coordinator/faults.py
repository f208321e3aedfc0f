"""The named fault points of docs/design.md and the plan that fires them.

One `FaultPlan` is consulted by the coordinator at every point (and by the
simulator and the campaign, which decide the rates), so that a test, the
simulator and the campaign name faults alike and count them alike.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum

from dispatchtx.errors import DispatchError

__all__ = ["CoordinatorKilled", "FaultPlan", "FaultPoint", "InjectedFault"]


class FaultPoint(StrEnum):
    """Every point where a fault can be injected."""

    # 1. send raises after each reservation
    SEND_AFTER_CLAIM = "send-after-claim"
    SEND_AFTER_JOURNAL = "send-after-journal"
    SEND_AFTER_RESERVATIONS = "send-after-reservations"
    MESSAGE_BUILD = "message-build"
    SEND = "send"
    # 2. delivered, but the coordinator sees an exception
    AMBIGUOUS_SEND = "ambiguous-send"
    # 3. a worker answers after its lease TTL, or twice
    STALE_RESULT = "stale-result"
    DUPLICATE_RESULT = "duplicate-result"
    # 4. the commit path fails or the coordinator dies between its steps
    BEGIN_COMMIT_EIO = "begin-commit-eio"
    TRIAGE_EIO = "triage-eio"
    COMPLETE_EIO = "complete-eio"
    KILL_AFTER_STORE_COMMIT = "kill-after-store-commit"
    KILL_MID_TRIAGE = "kill-mid-triage"
    KILL_AFTER_TRIAGE = "kill-after-triage"
    KILL_AFTER_COMPLETE = "kill-after-complete"
    # 5. the first transfer of an object's content fails
    OBJECT_TRANSFER = "object-transfer"
    # a worker stops answering (a hung rank; a crash in the simulator)
    WORKER_HUNG = "worker-hung"


class InjectedFault(DispatchError):
    """An exception the fault plan raised on purpose at a named point."""

    def __init__(self, point: FaultPoint) -> None:
        super().__init__(f"injected fault at {point.value}")
        self.point = point


class CoordinatorKilled(BaseException):
    """The coordinator was killed at a point (simulated: a BaseException, so
    that no `except Exception` in the code under test survives it)."""

    def __init__(self, point: FaultPoint) -> None:
        super().__init__(f"coordinator killed at {point.value}")
        self.point = point


class FaultPlan:
    """Which points fire, how often, and what fired.

    `rates` gives each point's probability per visit; `at_least_once` points
    fire at their first visit if they have not fired yet, so a short run
    still schedules every requested point. Seeded: the same seed and the same
    visits fire the same faults.
    """

    def __init__(
        self,
        rates: Mapping[FaultPoint, float] | None = None,
        *,
        seed: int = 0,
        at_least_once: Iterable[FaultPoint] = (),
        kill: Callable[[FaultPoint], None] | None = None,
    ) -> None:
        self.rates = dict(rates or {})
        for point, rate in self.rates.items():
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"rate of {point.value} must be in [0, 1], got {rate}")
        self._rng = random.Random(seed)
        self._pending = set(at_least_once)
        self.fired: Counter[FaultPoint] = Counter()
        # Counted while the plan can fire. One that cannot (no rates, nothing
        # pending: every run without faults) answers at once: the dispatch
        # path visits a dozen points per item.
        self.visits: Counter[FaultPoint] = Counter()
        self._kill = kill
        # Called just before a kill (e.g. to leave the counts behind).
        self.before_kill: Callable[[], None] | None = None

    @classmethod
    def none(cls) -> FaultPlan:
        return cls()

    def fires(self, point: FaultPoint) -> bool:
        """Visit `point`: True if the fault fires here (and count it)."""
        if not self.rates and not self._pending:
            return False
        self.visits[point] += 1
        if point in self._pending:
            self._pending.discard(point)
        else:
            rate = self.rates.get(point, 0.0)
            if rate <= 0.0 or self._rng.random() >= rate:
                return False
        self.fired[point] += 1
        return True

    def check(self, point: FaultPoint) -> None:
        """Raise `InjectedFault` if the point fires."""
        if self.fires(point):
            raise InjectedFault(point)

    def kill_point(self, point: FaultPoint) -> None:
        """Kill the coordinator here if the point fires: `kill(point)` (a real
        SIGKILL in a campaign), else `CoordinatorKilled`."""
        if self.fires(point):
            if self.before_kill is not None:
                self.before_kill()
            if self._kill is not None:
                self._kill(point)
            raise CoordinatorKilled(point)

    @property
    def unfired(self) -> set[FaultPoint]:
        """Requested points that have not fired yet."""
        return set(self._pending)
