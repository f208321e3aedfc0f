"""The interface the coordinator uses (`Transport`, `SendHandle`), the MPI
tags of the three messages, and the bounded back-off of every poll.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

if TYPE_CHECKING:
    pass

from dispatchtx.transport.messages import Result, SendFailed, Work

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_RESULT_TAG",
    "DEFAULT_SPIN",
    "DEFAULT_STOP_TAG",
    "DEFAULT_WORK_TAG",
    "MAX_BACKOFF",
    "MIN_BACKOFF",
    "Backoff",
    "SendHandle",
    "Transport",
]


DEFAULT_WORK_TAG: Final = 71
DEFAULT_RESULT_TAG: Final = 72
DEFAULT_STOP_TAG: Final = 73
# A result message over this is dropped unread (MPITransport's max_result_bytes).
DEFAULT_MAX_RESULT_BYTES: Final = 256 * 1024 * 1024

# Idle ranks back off their Iprobe polling from 1 us up to 1 ms, as
# mpi4py.futures does: a tight poll (or MPICH's own blocking recv) takes a
# whole core, and with more ranks than cores it starves the ranks that work.
MIN_BACKOFF: Final = 1e-6
MAX_BACKOFF: Final = 1e-3
# For this long after its last message a rank only yields between polls: a
# reply to what it just sent is seen within microseconds, not after a sleep
# that the kernel rounds up to ~60 us and longer. Short enough that a rank
# idle for good soon sleeps.
DEFAULT_SPIN: Final = 5e-4


# --------------------------------------------------------------------------
# the interface the coordinator uses


class SendHandle:
    """A non-blocking send in progress; `Transport.test` says when it is done."""

    __slots__ = ("worker", "dispatch_id", "_owner", "_error", "_done")

    def __init__(self, owner: object, worker: int, dispatch_id: int) -> None:
        self.worker = worker
        self.dispatch_id = dispatch_id
        self._owner = owner
        self._error: SendFailed | None = None
        self._done = False

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self._done else "pending"
        return f"<SendHandle dispatch {self.dispatch_id} to worker {self.worker}: {state}>"


@runtime_checkable
class Transport(Protocol):
    """What the coordinator needs to move Work and Results; workers are
    indexed 0..n_workers-1.

    - `send` blocks until the message is handed off and raises on failure
      (the coordinator then treats it as not sent);
    - `isend` returns at once; `test(handle)` is True once the send
      completed, and raises `SendFailed` if it completed with an error (an
      ambiguous send: the dispatch is already ACTIVE);
    - `poll(timeout)` waits up to `timeout` seconds of the transport's clock
      without busy-spinning and returns what arrived, each with the worker it
      came from: a `Result`, or the raw bytes of an undecodable message for
      the coordinator to count and drop;
    - `now()` is the transport's clock (virtual in the simulator): the
      coordinator takes send times and deadlines from it;
    - `take_lost_workers()` returns the workers the transport knows to be
      gone since the last call (a crashed simulated worker; an MPI rank that
      hangs is found by the coordinator's deadline instead).
    """

    @property
    def n_workers(self) -> int: ...

    @property
    def stats(self) -> dict[str, int]: ...

    def now(self) -> float: ...

    def send(self, worker: int, work: Work) -> None: ...

    def isend(self, worker: int, work: Work) -> SendHandle: ...

    def test(self, handle: SendHandle) -> bool: ...

    def poll(self, timeout: float) -> list[tuple[int, Result | bytes]]: ...

    def take_lost_workers(self) -> list[int]: ...

    def stop_workers(self) -> None: ...

    def close(self) -> None: ...


def _check_timeout(timeout: float) -> None:
    if not (math.isfinite(timeout) and timeout >= 0.0):
        raise ValueError(f"timeout must be finite and >= 0, not {timeout!r}")


def _yield_cpu() -> None:
    if sys.platform == "win32":
        time.sleep(0)  # Windows has no sched_yield; sleep(0) gives up the slice
    else:
        os.sched_yield()


class Backoff:
    """How a polling loop waits between empty polls. For `spin` seconds
    after the last message (`reset()`, or its creation) it only yields the
    CPU (`os.sched_yield`: a runnable rank on an oversubscribed machine still
    gets the core); then it sleeps MIN_BACKOFF, doubling up to MAX_BACKOFF,
    so an idle rank burns no core. `spin=0` backs off at once;
    `spin=math.inf` never sleeps."""

    __slots__ = ("spin", "delay", "_spin_until")

    def __init__(self, spin: float = DEFAULT_SPIN) -> None:
        if not spin >= 0.0:  # NaN too
            raise ValueError(f"spin must be >= 0 seconds, not {spin!r}")
        self.spin = spin
        self.delay = 0.0
        self._spin_until = time.monotonic() + spin

    def reset(self) -> None:
        """A message arrived: spin again."""
        self.delay = 0.0
        self._spin_until = time.monotonic() + self.spin

    def sleep(self, limit: float = MAX_BACKOFF) -> None:
        """Wait before the next poll, at most `limit` seconds."""
        if not self.delay and time.monotonic() < self._spin_until:
            _yield_cpu()
            return
        self.delay = min(MAX_BACKOFF, self.delay * 2.0 or MIN_BACKOFF)
        time.sleep(min(self.delay, limit))
