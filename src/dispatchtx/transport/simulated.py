"""`SimulatedTransport`: the worker code of `worker` run in process on a
virtual clock, with seeded faults (delay, loss, duplication, reordering,
truncation and staleness of results, send failures, ambiguous sends,
worker crashes, slow workers); `TransportClock` reads a host's time from it.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

if TYPE_CHECKING:
    pass

from dispatchtx.transport.interface import SendHandle, _check_timeout
from dispatchtx.transport.messages import (
    MalformedMessage,
    Result,
    SendFailed,
    TaskFn,
    TransportClosed,
    UnknownWorker,
    Work,
    _encode_result,
    _encode_work,
    decode_result,
    decode_work,
)
from dispatchtx.transport.worker import WorkerObjects, run_task

__all__ = ["SIM_FAULTS", "SimFaults", "SimulatedTransport", "TraceEntry", "TransportClock"]


# --------------------------------------------------------------------------
# the simulator

SIM_FAULTS: Final = (
    "send_failure",
    "ambiguous_send",
    "delay",
    "loss",
    "duplicate",
    "reorder",
    "stale",
    "garble",
    "crash",
    "slow",
)


@final
@dataclass(frozen=True, slots=True)
class SimFaults:
    """How often each simulated fault fires (a probability per decision
    point), and how large the timing faults are, in virtual seconds."""

    send_failure: float = 0.0  # per send: raises, nothing delivered
    ambiguous_send: float = 0.0  # per send: delivered, but the send raises
    delay: float = 0.0  # per message (Work or Result): `delay_seconds` late
    loss: float = 0.0  # per Result: never arrives
    duplicate: float = 0.0  # per Result: arrives twice
    reorder: float = 0.0  # per Result: held back, later ones overtake it
    stale: float = 0.0  # per Result: arrives after `stale_seconds`
    garble: float = 0.0  # per Result: arrives truncated (undecodable bytes)
    crash: float = 0.0  # per Work received: the worker crashes
    delay_seconds: float = 0.05
    reorder_seconds: float = 0.005
    stale_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in SIM_FAULTS:
            if name == "slow":
                continue
            probability = getattr(self, name)
            if not 0.0 <= probability <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], not {probability!r}")
        for name in ("delay_seconds", "reorder_seconds", "stale_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, not {value!r}")


@final
class _SimSend(SendHandle):
    __slots__ = ("completes_at", "failure")

    def __init__(
        self, owner: object, worker: int, dispatch_id: int, completes_at: float, failure: str
    ) -> None:
        super().__init__(owner, worker, dispatch_id)
        self.completes_at = completes_at
        self.failure = failure


@dataclass(slots=True)
class _SimWorker:
    index: int
    slowness: float
    cache: WorkerObjects = field(default_factory=WorkerObjects)
    queue: deque[Work] = field(default_factory=deque)
    busy: bool = False
    crashed: bool = False
    stopped: bool = False
    incarnation: int = 0  # bumped by a crash: older messages and tasks are void
    last_arrival: float = 0.0  # Work to one worker arrives in order, as under MPI
    tasks_run: int = 0


# Events of the simulation, ordered by (virtual time, sequence number).
_ARRIVE: Final = 0  # (worker, incarnation, Work bytes | None for Stop)
_FINISH: Final = 1  # (worker, incarnation, Work, virtual cpu seconds)
_DELIVER: Final = 2  # (worker, Result bytes)

TraceEntry: TypeAlias = tuple[float, str, int, int]


@final
class SimulatedTransport:
    """A deterministic in-process stand-in for MPI ranks.

    Workers are in-process objects running `run_task` with their own
    `WorkerObjects`, as MPI workers do; every message goes through the same
    wire encoding. Time is virtual: it moves only in `poll`, to the next
    delivery or by `timeout`, so a run takes no wall time and the same seed
    gives the same trace. A task takes `task_seconds` (a number, or a
    function of the Work) times its worker's `slow_workers` factor.

    Faults fire with the probabilities of `faults`, drawn from one seeded
    `random.Random`, or on demand with `force(fault)`; each firing is counted
    in `stats`. A crashed worker stops answering, loses its queue and its
    object cache, and (with `report_crashes`) is returned once by
    `take_lost_workers()`; `revive` starts it again, empty."""

    def __init__(
        self,
        n_workers: int,
        task_fn: TaskFn,
        *,
        seed: int = 0,
        faults: SimFaults | None = None,
        latency: float = 1e-4,
        jitter: float = 0.0,
        task_seconds: float | Callable[[Work], float] = 1e-3,
        slow_workers: Mapping[int, float] | None = None,
        report_crashes: bool = True,
        record_trace: bool = False,
    ) -> None:
        import random

        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, not {n_workers}")
        for name, value in (("latency", latency), ("jitter", jitter)):
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, not {value!r}")
        slow = dict(slow_workers or {})
        for worker, factor in slow.items():
            if not 0 <= worker < n_workers or not (math.isfinite(factor) and factor > 0.0):
                raise ValueError(f"slow_workers[{worker}] = {factor!r}: bad worker or factor")
        self._task_fn = task_fn
        self._faults = faults or SimFaults()
        self._rng = random.Random(seed)
        self._latency = latency
        self._jitter = jitter
        self._task_seconds = task_seconds
        self._report_crashes = report_crashes
        self._workers = [_SimWorker(i, slow.get(i, 1.0)) for i in range(n_workers)]
        self._now = 0.0
        self._sequence = 0
        self._events: list[tuple[float, int, int, tuple[Any, ...]]] = []
        self._inbox: list[tuple[int, Result | bytes]] = []
        self._lost: list[int] = []
        self._forced: Counter[str] = Counter()
        self._closed = False
        self._stopping = False
        self._stats: dict[str, int] = dict.fromkeys(SIM_FAULTS, 0)
        for name in (
            "sent",
            "isent",
            "delivered",
            "malformed_delivered",
            "tasks_run",
            "dropped_by_crashed",
            "dropped_after_stop",
            "revived",
            "stop_sent",
        ):
            self._stats[name] = 0
        self.trace: list[TraceEntry] | None = [] if record_trace else None
        # Called as a send begins, before anything is posted: the simulator
        # uses it to run a stop signal's handler mid-dispatch.
        self.on_send: Callable[[int, Work], None] | None = None

    # -- the Transport interface

    @property
    def n_workers(self) -> int:
        return len(self._workers)

    @property
    def stats(self) -> dict[str, int]:
        return self._stats

    def now(self) -> float:
        return self._now

    def send(self, worker: int, work: Work) -> None:
        if self.on_send is not None:
            self.on_send(worker, work)
        target = self._target(worker, work)
        data = _encode_work(work)
        self._stats["sent"] += 1
        if self._fires("send_failure"):
            self._record("send_failure", worker, work.dispatch_id)
            raise SendFailed(worker, work.dispatch_id, "simulated failure (not delivered)")
        self._record("send", worker, work.dispatch_id)
        self._post_work(target, data)
        if self._fires("ambiguous_send"):
            self._record("ambiguous_send", worker, work.dispatch_id)
            raise SendFailed(worker, work.dispatch_id, "simulated ambiguous send (delivered)")

    def isend(self, worker: int, work: Work) -> SendHandle:
        """Posts the send now; its outcome shows at `test` one latency later.
        A simulated failure is then reported whether or not the message went
        out, as an MPI request's error would be."""
        if self.on_send is not None:
            self.on_send(worker, work)
        target = self._target(worker, work)
        data = _encode_work(work)
        self._stats["isent"] += 1
        failure = ""
        if self._fires("send_failure"):
            self._record("send_failure", worker, work.dispatch_id)
            failure = "simulated failure (not delivered)"
        else:
            self._record("send", worker, work.dispatch_id)
            self._post_work(target, data)
            if self._fires("ambiguous_send"):
                self._record("ambiguous_send", worker, work.dispatch_id)
                failure = "simulated ambiguous send (delivered)"
        return _SimSend(self, worker, work.dispatch_id, self._now + self._latency, failure)

    def test(self, handle: SendHandle) -> bool:
        if not isinstance(handle, _SimSend) or handle._owner is not self:
            raise ValueError(f"{handle!r} is not a send of this transport")
        if handle._error is not None:
            raise handle._error
        if handle._done:
            return True
        if self._now < handle.completes_at:
            return False
        handle._done = True
        if handle.failure:
            handle._error = SendFailed(handle.worker, handle.dispatch_id, handle.failure)
            raise handle._error
        return True

    def poll(self, timeout: float) -> list[tuple[int, Result | bytes]]:
        if self._closed:
            raise TransportClosed("poll on a closed SimulatedTransport")
        _check_timeout(timeout)
        deadline = self._now + timeout
        events = self._events
        while not self._inbox and events and events[0][0] <= deadline:
            self._step()
        # What else arrives at the very same instant comes along.
        while events and events[0][0] <= self._now:
            self._step()
        if not self._inbox:
            self._now = deadline
            return []
        arrived, self._inbox = self._inbox, []
        return arrived

    def take_lost_workers(self) -> list[int]:
        lost, self._lost = self._lost, []
        return lost

    def stop_workers(self) -> None:
        """Each live worker gets a Stop: it finishes the Work it received
        before, then takes no more."""
        if self._stopping:
            return
        self._stopping = True
        for worker in self._workers:
            if not worker.crashed:
                self._stats["stop_sent"] += 1
                at = max(self._now + self._latency, worker.last_arrival)
                self._push(at, _ARRIVE, (worker.index, worker.incarnation, None))

    def close(self) -> None:
        self._closed = True
        self._events.clear()
        self._inbox.clear()

    def __enter__(self) -> SimulatedTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- control and inspection, for tests and the simulator's driver

    def force(self, fault: str, times: int = 1) -> None:
        """Make the next `times` decision points of `fault` fire, whatever its
        probability ("slow" is not a decision: use `slow_workers`)."""
        if fault not in SIM_FAULTS or fault == "slow":
            raise ValueError(f"unknown fault {fault!r}; one of {SIM_FAULTS[:-1]}")
        self._forced[fault] += times

    def crash(self, worker: int) -> None:
        """Crash a worker now (counted as a crash)."""
        self._stats["crash"] += 1
        self._crash(self._workers[self._check_worker(worker)])

    def revive(self, worker: int) -> None:
        """Restart a crashed worker, with an empty object cache."""
        target = self._workers[self._check_worker(worker)]
        if target.crashed:
            target.crashed = False
            self._stats["revived"] += 1
            self._record("revive", worker, -1)

    def is_crashed(self, worker: int) -> bool:
        return self._workers[self._check_worker(worker)].crashed

    def cached_objects(self, worker: int) -> frozenset[str]:
        """The object ids a worker holds now."""
        return self._workers[self._check_worker(worker)].cache.ids()

    def objects_received(self, worker: int) -> int:
        """How many object contents reached this worker with a Work."""
        return self._workers[self._check_worker(worker)].cache.received

    def pending_events(self) -> int:
        return len(self._events)

    # -- the machinery

    def _check_worker(self, worker: int) -> int:
        if not 0 <= worker < len(self._workers):
            raise UnknownWorker(f"worker {worker} is not in 0..{len(self._workers) - 1}")
        return worker

    def _target(self, worker: int, work: Work) -> _SimWorker:
        if self._closed:
            raise SendFailed(worker, work.dispatch_id, "the transport is closed")
        return self._workers[self._check_worker(worker)]

    def _fires(self, fault: str) -> bool:
        if self._forced[fault] > 0:
            self._forced[fault] -= 1
        else:
            probability: float = getattr(self._faults, fault)
            # No draw for a fault that is off, so that a run's random stream
            # depends only on the faults it enables.
            if probability <= 0.0 or self._rng.random() >= probability:
                return False
        self._stats[fault] += 1
        return True

    def _record(self, what: str, worker: int, dispatch_id: int) -> None:
        if self.trace is not None:
            self.trace.append((self._now, what, worker, dispatch_id))

    def _push(self, at: float, kind: int, event: tuple[Any, ...]) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (at, self._sequence, kind, event))

    def _transit(self) -> float:
        extra = self._jitter * self._rng.random() if self._jitter else 0.0
        if self._fires("delay"):
            extra += self._faults.delay_seconds
        return self._latency + extra

    def _post_work(self, worker: _SimWorker, data: bytes) -> None:
        at = max(self._now + self._transit(), worker.last_arrival)
        worker.last_arrival = at
        self._push(at, _ARRIVE, (worker.index, worker.incarnation, data))

    def _crash(self, worker: _SimWorker) -> None:
        worker.crashed = True
        worker.incarnation += 1
        worker.busy = False
        worker.queue.clear()
        worker.cache.clear()
        self._record("crash", worker.index, -1)
        if self._report_crashes:
            self._lost.append(worker.index)

    def _step(self) -> None:
        at, _, kind, event = heapq.heappop(self._events)
        self._now = max(self._now, at)
        if kind == _DELIVER:
            self._deliver(*event)
        elif kind == _ARRIVE:
            self._arrive(*event)
        else:
            self._finish(*event)

    def _arrive(self, index: int, incarnation: int, data: bytes | None) -> None:
        worker = self._workers[index]
        if worker.crashed or incarnation != worker.incarnation:
            self._stats["dropped_by_crashed"] += 1
            return
        if data is None:
            worker.stopped = True
            return
        if worker.stopped:
            self._stats["dropped_after_stop"] += 1
            return
        work = decode_work(data)  # it came from our own encoder
        self._record("arrive", index, work.dispatch_id)
        if self._fires("crash"):
            self._crash(worker)
            return
        worker.queue.append(work)
        if not worker.busy:
            self._start(worker)

    def _start(self, worker: _SimWorker) -> None:
        work = worker.queue.popleft()
        worker.busy = True
        base = self._task_seconds
        seconds = base(work) if callable(base) else base
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"task_seconds gave {seconds!r} for dispatch {work.dispatch_id}")
        if worker.slowness != 1.0:
            self._stats["slow"] += 1
            seconds *= worker.slowness
        self._push(self._now + seconds, _FINISH, (worker.index, worker.incarnation, work, seconds))

    def _finish(self, index: int, incarnation: int, work: Work, seconds: float) -> None:
        worker = self._workers[index]
        if worker.crashed or incarnation != worker.incarnation:
            return
        # The same code as an MPI rank; the CPU time is the virtual one, so
        # that a trace does not depend on the host.
        result = replace(run_task(work, worker.cache, self._task_fn), cpu_seconds=seconds)
        worker.tasks_run += 1
        self._stats["tasks_run"] += 1
        self._record("finish", index, work.dispatch_id)
        self._send_result(index, work.dispatch_id, _encode_result(result))
        worker.busy = False
        if worker.queue:
            self._start(worker)

    def _send_result(self, index: int, dispatch_id: int, data: bytes) -> None:
        if self._fires("loss"):
            self._record("loss", index, dispatch_id)
            return
        at = self._now + self._transit()
        if self._fires("reorder"):
            at += self._faults.reorder_seconds
            self._record("reorder", index, dispatch_id)
        if self._fires("stale"):
            at += self._faults.stale_seconds
            self._record("stale", index, dispatch_id)
        if self._fires("garble"):
            data = data[: self._rng.randrange(len(data))]
            self._record("garble", index, dispatch_id)
        self._push(at, _DELIVER, (index, data))
        if self._fires("duplicate"):
            self._record("duplicate", index, dispatch_id)
            gap = self._faults.reorder_seconds * self._rng.random()
            self._push(at + gap, _DELIVER, (index, data))

    def _deliver(self, index: int, data: bytes) -> None:
        self._stats["delivered"] += 1
        try:
            result = decode_result(data)
        except MalformedMessage:
            self._stats["malformed_delivered"] += 1
            self._record("deliver_malformed", index, -1)
            self._inbox.append((index, data))
            return
        self._record("deliver", index, result.dispatch_id)
        self._inbox.append((index, result))


class TransportClock:
    """A host's clock: its transport's virtual time."""

    def __init__(self, transport: SimulatedTransport, wall_offset: float) -> None:
        self._transport = transport
        self.wall_offset = wall_offset

    def monotonic(self) -> float:
        return self._transport.now()

    def wall(self) -> float:
        return self.wall_offset + self._transport.now()
