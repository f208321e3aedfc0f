"""The leaf of dispatchtx: phases, sides, failure records and every error.

Both builds of the core import these names from here, so that `Phase.ACTIVE`,
`IllegalMove` and `CompensationFailure` are the same objects whichever build
is loaded. This module imports nothing of dispatchtx.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum, IntEnum
from types import MappingProxyType
from typing import Final, NamedTuple, final

__all__ = [
    "CompensationError",
    "CompensationFailure",
    "DispatchError",
    "Failures",
    "IllegalMove",
    "MOVES",
    "Move",
    "NO_FAILURES",
    "Phase",
    "Side",
    "UnknownDispatch",
    "WorkerBusy",
    "WrongWorker",
    "raise_failures",
]


class Phase(IntEnum):
    """Where a dispatch is in its life (docs/design.md)."""

    PREPARING = 0
    ACTIVE = 1
    COMMITTING = 2
    COMMITTED = 3
    ROLLED_BACK = 4


class Move(NamedTuple):
    """One move of the core: legal only from `source`; it leaves the
    dispatch in `target`."""

    name: str
    source: Phase
    target: Phase


#: Which move is legal from which phase, and where it leaves the dispatch:
#: both builds take their checks from this table (a sweep, `lose_worker` or
#: `shutdown`, is `abort` of each PREPARING and `fenced_out` of each ACTIVE
#: dispatch; `committing()` is `fence_passed` on entry and `finished` on a
#: clean exit).
MOVES: Final[Mapping[str, Move]] = MappingProxyType(
    {
        move.name: move
        for move in (
            Move("sent", Phase.PREPARING, Phase.ACTIVE),
            Move("abort", Phase.PREPARING, Phase.ROLLED_BACK),
            Move("fence_passed", Phase.ACTIVE, Phase.COMMITTING),
            Move("finished", Phase.COMMITTING, Phase.COMMITTED),
            Move("fenced_out", Phase.ACTIVE, Phase.ROLLED_BACK),
        )
    }
)


class Side(Enum):
    """Which of a compensation's three callables ran."""

    BEFORE_SEND = "before_send"
    AFTER_SEND = "after_send"
    ON_COMMIT = "on_commit"


@final
@dataclass(frozen=True, slots=True)
class CompensationFailure:
    """One compensation (or release) that raised; the others still ran."""

    dispatch_id: int
    worker: int
    resource: str
    side: Side
    error: Exception

    def __str__(self) -> str:
        return (
            f"dispatch {self.dispatch_id} (worker {self.worker}): "
            f"{self.resource}.{self.side.value} raised {self.error!r}"
        )


Failures = tuple[CompensationFailure, ...]
NO_FAILURES: Final[Failures] = ()


class DispatchError(Exception):
    """Root of every error dispatchtx raises on purpose."""


class WorkerBusy(DispatchError):
    """`prepare` on a worker that already holds `max_in_flight` dispatches."""

    def __init__(self, worker: int, in_flight: int, max_in_flight: int) -> None:
        super().__init__(
            f"worker {worker} already holds {in_flight} PREPARING or ACTIVE "
            f"dispatches (max_in_flight={max_in_flight})"
        )
        self.worker = worker
        self.in_flight = in_flight
        self.max_in_flight = max_in_flight

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.worker, self.in_flight, self.max_in_flight))


class IllegalMove(DispatchError):
    """A move from the wrong phase; nothing was moved.

    `phase` is where the dispatch is (None: in no table, never known or
    already ended).
    """

    def __init__(self, dispatch_id: int, move: str, phase: Phase | None, detail: str = "") -> None:
        where = "in no table" if phase is None else f"is {phase.name}"
        message = f"{move}: dispatch {dispatch_id} {where}"
        if detail:
            message = f"{message}; {detail}"
        super().__init__(message)
        self.dispatch_id = dispatch_id
        self.move = move
        self.phase = phase
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.dispatch_id, self.move, self.phase, self.detail))


class UnknownDispatch(DispatchError):
    """A result whose dispatch is unknown, gone, or not ACTIVE: count, drop."""

    def __init__(self, dispatch_id: int, phase: Phase | None) -> None:
        if phase is None:
            message = f"no dispatch {dispatch_id} in flight (unknown or already ended)"
        else:
            message = (
                f"dispatch {dispatch_id} is {phase.name}, not ACTIVE: "
                "a duplicate or premature result"
            )
        super().__init__(message)
        self.dispatch_id = dispatch_id
        self.phase = phase

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.dispatch_id, self.phase))


class WrongWorker(DispatchError):
    """A result for a dispatch that another worker holds: count, drop."""

    def __init__(self, dispatch_id: int, expected: int, got: int) -> None:
        super().__init__(
            f"dispatch {dispatch_id} was sent to worker {expected}, "
            f"but the result came from worker {got}"
        )
        self.dispatch_id = dispatch_id
        self.expected = expected
        self.got = got

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.dispatch_id, self.expected, self.got))


class CompensationError(DispatchError, ExceptionGroup[Exception]):
    """Every compensation failure of one move, raised together.

    `except*` splits keep the failures that match (see `derive`).
    """

    failures: Failures

    def __new__(cls, message: str, failures: Sequence[CompensationFailure]) -> CompensationError:
        errors = [failure.error for failure in failures]
        self = super().__new__(cls, message, errors)
        self.failures = tuple(failures)
        return self

    def __init__(self, message: str, failures: Sequence[CompensationFailure]) -> None:
        super().__init__(message, [failure.error for failure in failures])

    def derive(  # type: ignore[override]
        self, excs: Sequence[Exception]
    ) -> CompensationError | ExceptionGroup[Exception]:
        # `except*` hands back the matching errors in their original order;
        # a failure whose error is itself a group comes back as a split of
        # that group, so pair them up in order rather than by identity.
        kept: list[CompensationFailure] = []
        failures = iter(self.failures)
        for error in excs:
            for failure in failures:
                if failure.error is error:
                    kept.append(failure)
                    break
                if isinstance(failure.error, BaseExceptionGroup) and isinstance(
                    error, BaseExceptionGroup
                ):
                    kept.append(replace(failure, error=error))
                    break
        if len(kept) != len(excs):  # cannot happen through except*; stay a valid group
            return ExceptionGroup(self.message, list(excs))
        return CompensationError(self.message, kept)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.failures))


def raise_failures(failures: Failures, message: str) -> None:
    """Raise `CompensationError` if `failures` is not empty."""
    if failures:
        raise CompensationError(f"{message}: {len(failures)} compensation(s) failed", failures)
