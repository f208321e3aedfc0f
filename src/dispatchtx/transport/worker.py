"""The worker's side, shared by MPI ranks and simulated workers: `run_task`
runs one `Work` with the objects the worker keeps (`WorkerObjects`), and
`run_worker` is the whole loop of a worker rank.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from mpi4py import MPI

from dispatchtx.transport.interface import (
    DEFAULT_RESULT_TAG,
    DEFAULT_SPIN,
    DEFAULT_STOP_TAG,
    DEFAULT_WORK_TAG,
    Backoff,
)
from dispatchtx.transport.messages import (
    MalformedMessage,
    Result,
    TaskFn,
    Work,
    _encode_result,
    decode_work,
)

__all__ = ["WorkerObjects", "WorkerSummary", "run_task", "run_worker", "stop_this_process"]


# A task's error text travels back in the Result; a traceback-sized message
# is plenty to say what went wrong.
_MAX_ERROR_CHARS: Final = 2000


# --------------------------------------------------------------------------
# the worker's side, shared by MPI ranks and simulated workers


@final
class WorkerObjects:
    """A worker's object contents by id: a Work carries the content of an
    object only the first time; later ones name it and find it here."""

    __slots__ = ("_contents", "_view", "received")

    def __init__(self) -> None:
        self._contents: dict[str, bytes] = {}
        self._view: Mapping[str, bytes] = MappingProxyType(self._contents)
        self.received = 0  # object contents that arrived with a Work

    def absorb(self, objects: Mapping[str, bytes]) -> None:
        if objects:
            self._contents.update(objects)
            self.received += len(objects)

    @property
    def view(self) -> Mapping[str, bytes]:
        """A read-only view for `task_fn`: a task cannot corrupt the cache."""
        return self._view

    def clear(self) -> None:
        self._contents.clear()

    def __contains__(self, object_id: object) -> bool:
        return object_id in self._contents

    def __len__(self) -> int:
        return len(self._contents)

    def ids(self) -> frozenset[str]:
        return frozenset(self._contents)


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 3] + "..."
    # Lone surrogates in an exception message would not encode.
    return text.encode("utf-8", "backslashreplace").decode()


def run_task(
    work: Work,
    cache: WorkerObjects,
    task_fn: TaskFn,
    *,
    cpu_clock: Callable[[], float] = time.process_time,
) -> Result:
    """Run one Work as every worker does: keep the objects it carries, run
    `task_fn(work, objects)` (objects: every content the worker holds, by
    id), and answer with the dispatch id, item and token and the CPU seconds
    spent. A task that raises is answered with its error, not a crash."""
    cache.absorb(work.objects)
    started = cpu_clock()
    try:
        output = task_fn(work, cache.view)
        if type(output) is not bytes:
            raise TypeError(f"task_fn returned {type(output).__name__}, not bytes")
        error = ""
    except Exception as exc:
        output, error = b"", _describe(exc)
    spent = max(0.0, cpu_clock() - started)
    return Result(work.dispatch_id, work.item, work.token, output, spent, error)


@final
@dataclass(frozen=True, slots=True)
class WorkerSummary:
    """What one `run_worker` did, for its caller's report."""

    tasks_run: int
    task_errors: int
    malformed_dropped: int
    objects_received: int
    objects_cached: int
    cpu_seconds: float  # the whole loop, idle polling included
    wall_seconds: float


def stop_this_process() -> None:
    """Stop answering, as a hung worker does: SIGSTOP this process (SIGCONT
    resumes it, and it then answers late)."""
    os.kill(os.getpid(), signal.SIGSTOP)


def run_worker(
    comm: MPI.Comm,
    task_fn: TaskFn,
    *,
    work_tag: int = DEFAULT_WORK_TAG,
    result_tag: int = DEFAULT_RESULT_TAG,
    stop_tag: int = DEFAULT_STOP_TAG,
    coordinator: int = 0,
    hang_when: Callable[[Work], bool] | None = None,
    hang: Callable[[], None] = stop_this_process,
    spin: float = DEFAULT_SPIN,
) -> WorkerSummary:
    """The loop of a worker rank: receive Work, keep its object cache, run
    `task_fn(work, objects) -> bytes`, answer with a Result; return on Stop
    (after the Work that arrived before it). Writes no shared state.

    Results leave with `Isend` and the loop keeps receiving, so a worker
    never blocks against a coordinator that is itself sending. A malformed
    Work is dropped with one line on stderr (it names no dispatch to answer;
    the coordinator's deadline finds it). Fault hook: when `hang_when(work)`
    is true the worker calls `hang()` before running that work, by default
    SIGSTOP on itself: under MPICH a worker that dies after talking takes the
    job down, so a lost worker in real runs is a hung one (docs/design.md).
    Between empty polls it yields for `spin` seconds after its last message
    (received or sent), then backs off from 1 us to 1 ms (`Backoff`)."""
    from mpi4py import MPI

    started_wall, started_cpu = time.monotonic(), time.process_time()
    cache = WorkerObjects()
    status = MPI.Status()
    rank = comm.Get_rank()
    outgoing: list[tuple[MPI.Request, bytes]] = []
    backoff = Backoff(spin)
    tasks_run = task_errors = malformed = 0
    while True:
        if outgoing:
            outgoing = [pair for pair in outgoing if not pair[0].Test()]
        message = comm.Improbe(coordinator, work_tag, status)
        if message is None:
            # Stop only once no Work is waiting: what was sent before Stop runs.
            stop = comm.Improbe(coordinator, stop_tag, status)
            if stop is not None:
                stop.Recv(bytearray(status.Get_count(MPI.BYTE)))
                break
            backoff.sleep()
            continue
        backoff.reset()
        buffer = bytearray(status.Get_count(MPI.BYTE))
        message.Recv(buffer)
        try:
            work = decode_work(buffer)
        except MalformedMessage as exc:
            malformed += 1
            print(f"dispatchtx worker rank {rank}: dropped a Work message: {exc}", file=sys.stderr)
            continue
        if hang_when is not None and hang_when(work):
            hang()
        result = run_task(work, cache, task_fn)
        tasks_run += 1
        task_errors += bool(result.error)
        data = _encode_result(result)
        outgoing.append((comm.Isend(data, coordinator, result_tag), data))
        backoff.reset()  # the next work follows its answer
    while outgoing:
        outgoing = [pair for pair in outgoing if not pair[0].Test()]
        if outgoing:
            backoff.sleep()
    return WorkerSummary(
        tasks_run=tasks_run,
        task_errors=task_errors,
        malformed_dropped=malformed,
        objects_received=cache.received,
        objects_cached=len(cache),
        cpu_seconds=time.process_time() - started_cpu,
        wall_seconds=time.monotonic() - started_wall,
    )
