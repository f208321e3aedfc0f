"""Moving Work to workers and Results back: the messages, their wire encoding,
the `Transport` interface the coordinator uses, and its two implementations.

- `MPITransport` (rank 0 of any `MPI.Comm`) and `run_worker` (every other
  rank) exchange raw byte buffers (`Send`/`Recv`, never pickle), poll with a
  bounded exponential back-off so that idle or oversubscribed ranks do not
  burn CPU, and never block a send against a peer that is itself sending.
- `SimulatedTransport` runs the same worker code (`run_task` and its
  `ObjectCache`) in process on a virtual clock, with seeded faults: delay,
  loss, duplication, reordering, truncation and staleness of results, send
  failures, ambiguous sends, worker crashes and slow workers.

The coordinator only ever sees `Transport` (DESIGN.md §8), so the simulator
runs the very coordinator code that drives real ranks. This module imports
nothing of dispatchtx but the error leaf, and mpi4py only inside the MPI
parts: it imports on a machine without MPI.

Run `mpiexec -n 3 python -m dispatchtx.transport` for a self-test over real
ranks: pipelined round trips, every result checked, a JSON report.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import os
import pickle
import signal
import struct
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias, final, runtime_checkable

from dispatchtx.errors import DispatchError

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = [
    "DEFAULT_RESULT_TAG",
    "DEFAULT_STOP_TAG",
    "DEFAULT_WORK_TAG",
    "MAX_BACKOFF",
    "MIN_BACKOFF",
    "MPITransport",
    "MalformedMessage",
    "Message",
    "ObjectCache",
    "Result",
    "SendFailed",
    "SendHandle",
    "SendTimeout",
    "SIM_FAULTS",
    "SimFaults",
    "SimulatedTransport",
    "Stop",
    "TaskFn",
    "TraceEntry",
    "TransportClock",
    "Transport",
    "TransportClosed",
    "TransportError",
    "UnencodableMessage",
    "UnknownWorker",
    "Work",
    "WorkerSummary",
    "decode",
    "decode_result",
    "decode_work",
    "encode",
    "run_task",
    "run_worker",
    "stop_this_process",
]

DEFAULT_WORK_TAG: Final = 71
DEFAULT_RESULT_TAG: Final = 72
DEFAULT_STOP_TAG: Final = 73

# Idle ranks back off their Iprobe polling from 1 us up to 1 ms, as
# mpi4py.futures does: a tight poll (or MPICH's own blocking recv) takes a
# whole core, and with more ranks than cores it starves the ranks that work.
MIN_BACKOFF: Final = 1e-6
MAX_BACKOFF: Final = 1e-3

# A task's error text travels back in the Result; a traceback-sized message
# is plenty to say what went wrong.
_MAX_ERROR_CHARS: Final = 2000


# --------------------------------------------------------------------------
# errors


class TransportError(DispatchError):
    """Root of the transport's errors."""


class MalformedMessage(TransportError):
    """Bytes off the wire that are not a well-formed message of the expected
    kind. The receiver counts and drops them; it never crashes on them."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed dispatchtx message: {reason}")
        self.reason = reason


class UnencodableMessage(TransportError, ValueError):
    """A message whose fields cannot go on the wire (wrong type, an int out of
    the signed 64-bit range, a str that is not valid Unicode, a payload that
    does not pickle). Nothing was sent."""


class UnknownWorker(TransportError, ValueError):
    """A worker index outside 0..n_workers-1. Nothing was sent."""


class SendFailed(TransportError):
    """A send that raised. The coordinator treats it as not sent (DESIGN.md
    §5); when raised by `test` for a non-blocking send, it is an ambiguous
    send of an ACTIVE dispatch (the message may have been delivered)."""

    def __init__(self, worker: int, dispatch_id: int, reason: str) -> None:
        super().__init__(f"send of dispatch {dispatch_id} to worker {worker} failed: {reason}")
        self.worker = worker
        self.dispatch_id = dispatch_id
        self.reason = reason


class SendTimeout(SendFailed):
    """A blocking send that did not complete within `send_timeout` (the worker
    is not receiving: hung). The message may still be delivered later."""


class TransportClosed(TransportError):
    """An operation on a transport after `close()`."""


# --------------------------------------------------------------------------
# messages


@final
@dataclass(frozen=True, slots=True)
class Work:
    """One dispatch to a worker. `objects` carries object contents only for
    ids the worker is believed to lack; the worker keeps what it got by id."""

    dispatch_id: int
    item: str
    token: int
    payload: object
    objects: dict[str, bytes] = field(default_factory=dict)


@final
@dataclass(frozen=True, slots=True)
class Result:
    """A worker's answer to one Work. `error` is empty when the task ran
    clean; otherwise it says what the task raised and `result` is empty: a
    failed task is answered too, so that the coordinator never waits for a
    deadline to learn it."""

    dispatch_id: int
    item: str
    token: int
    result: bytes
    cpu_seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@final
@dataclass(frozen=True, slots=True)
class Stop:
    """Tells a worker to finish the Work it has received and return."""


Message: TypeAlias = Work | Result | Stop
TaskFn: TypeAlias = Callable[[Work, Mapping[str, bytes]], bytes]


# --------------------------------------------------------------------------
# wire encoding
#
# Every message starts with a magic byte, a version and a kind; then a fixed
# little-endian header of ints and lengths; then the variable parts back to
# back. A decoder checks every length against the buffer, so truncation,
# trailing bytes or garbage give a `MalformedMessage` naming what is wrong.
#
#   Work   = head(dispatch_id q, token q, item_len I, payload_kind B,
#                 payload_len I, n_objects I) item payload
#            n_objects * (id_len H, content_len I, id, content)
#   Result = head(dispatch_id q, token q, cpu_seconds d, item_len I,
#                 result_len I, error_len I) item result error
#   Stop   = the three prefix bytes
#
# A payload is None, bytes or str as such, anything else pickled. Results
# have no pickled part at all: the coordinator never unpickles what a worker
# sent (workers trust their coordinator; the reverse is not needed).

_MAGIC: Final = 0xD7
_VERSION: Final = 1
_KIND_WORK: Final = 1
_KIND_RESULT: Final = 2
_KIND_STOP: Final = 3
_KIND_NAMES: Final = {_KIND_WORK: "Work", _KIND_RESULT: "Result", _KIND_STOP: "Stop"}

_PAYLOAD_NONE: Final = 0
_PAYLOAD_BYTES: Final = 1
_PAYLOAD_STR: Final = 2
_PAYLOAD_PICKLE: Final = 3

_PREFIX: Final = struct.Struct("<BBB")
_WORK_HEAD: Final = struct.Struct("<BBBqqIBII")
_OBJECT_HEAD: Final = struct.Struct("<HI")
_RESULT_HEAD: Final = struct.Struct("<BBBqqdIII")
_STOP_BYTES: Final = _PREFIX.pack(_MAGIC, _VERSION, _KIND_STOP)


def encode(message: Message) -> bytes:
    """The wire form of any message; `UnencodableMessage` if it has none."""
    if type(message) is Result:
        return _encode_result(message)
    if type(message) is Work:
        return _encode_work(message)
    if type(message) is Stop:
        return _STOP_BYTES
    raise UnencodableMessage(f"not a dispatchtx message: {type(message).__name__}")


def _encode_result(result: Result) -> bytes:
    try:
        item = result.item.encode()
        error = result.error.encode()
        if type(result.result) is not bytes:
            raise TypeError(f"result must be bytes, not {type(result.result).__name__}")
        cpu = result.cpu_seconds
        if not (math.isfinite(cpu) and cpu >= 0.0):
            raise ValueError(f"cpu_seconds must be finite and >= 0, not {cpu!r}")
        head = _RESULT_HEAD.pack(
            _MAGIC,
            _VERSION,
            _KIND_RESULT,
            result.dispatch_id,
            result.token,
            cpu,
            len(item),
            len(result.result),
            len(error),
        )
    except (AttributeError, TypeError, ValueError, struct.error) as exc:
        raise UnencodableMessage(f"cannot encode {result!r:.200}: {exc}") from exc
    return b"".join((head, item, result.result, error))


def _encode_work(work: Work) -> bytes:
    try:
        item = work.item.encode()
        payload = work.payload
        if payload is None:
            kind, body = _PAYLOAD_NONE, b""
        elif type(payload) is bytes:
            kind, body = _PAYLOAD_BYTES, payload
        elif type(payload) is str:
            kind, body = _PAYLOAD_STR, payload.encode()
        else:
            kind, body = _PAYLOAD_PICKLE, pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
        parts = [b"", item, body]
        for object_id, content in work.objects.items():
            raw_id = object_id.encode()
            if type(content) is not bytes:
                raise TypeError(f"object {object_id!r} content must be bytes")
            parts += (_OBJECT_HEAD.pack(len(raw_id), len(content)), raw_id, content)
        parts[0] = _WORK_HEAD.pack(
            _MAGIC,
            _VERSION,
            _KIND_WORK,
            work.dispatch_id,
            work.token,
            len(item),
            kind,
            len(body),
            len(work.objects),
        )
    except (AttributeError, TypeError, ValueError, struct.error, pickle.PicklingError) as exc:
        raise UnencodableMessage(f"cannot encode {work!r:.200}: {exc}") from exc
    return b"".join(parts)


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    if type(data) is bytes:
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise MalformedMessage(f"expected bytes, got {type(data).__name__}")


def _check_prefix(data: bytes, expected: int | None) -> int:
    """The message kind, after checking magic, version and (if given) kind."""
    if len(data) < _PREFIX.size:
        raise MalformedMessage(
            f"truncated: {len(data)} byte(s), shorter than the {_PREFIX.size}-byte prefix"
        )
    magic, version, kind = _PREFIX.unpack_from(data)
    if magic != _MAGIC:
        raise MalformedMessage(f"bad magic byte 0x{magic:02x}: not a dispatchtx message")
    if version != _VERSION:
        raise MalformedMessage(f"wire version {version}, this build reads {_VERSION}")
    if kind not in _KIND_NAMES:
        raise MalformedMessage(f"unknown message kind {kind}")
    if expected is not None and kind != expected:
        raise MalformedMessage(
            f"expected a {_KIND_NAMES[expected]} message, got a {_KIND_NAMES[kind]} message"
        )
    return int(kind)


def _text(data: bytes, start: int, end: int, what: str) -> str:
    try:
        return data[start:end].decode()
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"{what} is not valid UTF-8: {exc.reason}") from None


def _truncated(what: str, needed: int, have: int) -> MalformedMessage:
    return MalformedMessage(f"truncated in {what}: needs {needed} bytes, has {have}")


def decode_result(data: bytes | bytearray | memoryview) -> Result:
    """A Result from the wire, or `MalformedMessage` saying what is wrong."""
    if type(data) is not bytes:
        data = _as_bytes(data)
    size = len(data)
    if size < _RESULT_HEAD.size:
        _check_prefix(data, _KIND_RESULT)
        raise _truncated("the Result header", _RESULT_HEAD.size, size)
    magic, version, kind, dispatch_id, token, cpu, item_len, result_len, error_len = (
        _RESULT_HEAD.unpack_from(data)
    )
    if magic != _MAGIC or version != _VERSION or kind != _KIND_RESULT:
        _check_prefix(data, _KIND_RESULT)  # raises, naming what is wrong
    item_end = _RESULT_HEAD.size + item_len
    result_end = item_end + result_len
    if result_end + error_len != size:
        raise MalformedMessage(
            f"Result lengths say {result_end + error_len} bytes, the message has {size}"
        )
    if not (math.isfinite(cpu) and cpu >= 0.0):
        raise MalformedMessage(f"cpu_seconds {cpu!r} is not a finite number >= 0")
    try:
        item = data[_RESULT_HEAD.size : item_end].decode()
        error = data[result_end:].decode() if error_len else ""
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"the item or error text is not valid UTF-8: {exc.reason}") from None
    return Result(dispatch_id, item, token, data[item_end:result_end], cpu, error)


def decode_work(data: bytes | bytearray | memoryview) -> Work:
    """A Work from the wire, or `MalformedMessage` saying what is wrong.

    A pickled payload is unpickled: only a worker decodes Work, from its own
    coordinator."""
    if type(data) is not bytes:
        data = _as_bytes(data)
    size = len(data)
    if size < _WORK_HEAD.size:
        _check_prefix(data, _KIND_WORK)
        raise _truncated("the Work header", _WORK_HEAD.size, size)
    (magic, version, kind, dispatch_id, token, item_len, payload_kind, payload_len, n_objects) = (
        _WORK_HEAD.unpack_from(data)
    )
    if magic != _MAGIC or version != _VERSION or kind != _KIND_WORK:
        _check_prefix(data, _KIND_WORK)  # raises, naming what is wrong
    pos = _WORK_HEAD.size
    if pos + item_len + payload_len > size:
        raise _truncated("the item and payload", pos + item_len + payload_len, size)
    item = _text(data, pos, pos + item_len, "the item")
    pos += item_len
    body = data[pos : pos + payload_len]
    pos += payload_len
    payload = _decode_payload(payload_kind, body)
    objects: dict[str, bytes] = {}
    for index in range(n_objects):
        if pos + _OBJECT_HEAD.size > size:
            raise _truncated(f"object header {index}", pos + _OBJECT_HEAD.size, size)
        id_len, content_len = _OBJECT_HEAD.unpack_from(data, pos)
        pos += _OBJECT_HEAD.size
        if pos + id_len + content_len > size:
            raise _truncated(f"object {index}", pos + id_len + content_len, size)
        object_id = _text(data, pos, pos + id_len, f"object id {index}")
        pos += id_len
        if object_id in objects:
            raise MalformedMessage(f"object id {object_id!r:.80} appears twice")
        objects[object_id] = data[pos : pos + content_len]
        pos += content_len
    if pos != size:
        raise MalformedMessage(f"{size - pos} trailing byte(s) after the Work message")
    return Work(dispatch_id, item, token, payload, objects)


def _decode_payload(kind: int, body: bytes) -> object:
    if kind == _PAYLOAD_BYTES:
        return body
    if kind == _PAYLOAD_STR:
        try:
            return body.decode()
        except UnicodeDecodeError as exc:
            raise MalformedMessage(f"str payload is not valid UTF-8: {exc.reason}") from None
    if kind == _PAYLOAD_NONE:
        if body:
            raise MalformedMessage(f"a None payload with {len(body)} byte(s)")
        return None
    if kind == _PAYLOAD_PICKLE:
        try:
            return pickle.loads(body)
        except Exception as exc:  # a bad pickle can raise nearly anything
            raise MalformedMessage(f"payload does not unpickle: {exc!r:.200}") from None
    raise MalformedMessage(f"unknown payload kind {kind}")


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Any message from the wire, or `MalformedMessage`."""
    data = _as_bytes(data)
    kind = _check_prefix(data, None)
    if kind == _KIND_RESULT:
        return decode_result(data)
    if kind == _KIND_WORK:
        return decode_work(data)
    if len(data) != _PREFIX.size:
        raise MalformedMessage(f"a Stop message has {len(data) - _PREFIX.size} extra byte(s)")
    return Stop()


# --------------------------------------------------------------------------
# the worker's side, shared by MPI ranks and simulated workers


@final
class ObjectCache:
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
    cache: ObjectCache,
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


class _Backoff:
    """Sleeps between empty polls: 1 us, doubling up to 1 ms; reset on work."""

    __slots__ = ("delay",)

    def __init__(self) -> None:
        self.delay = 0.0

    def reset(self) -> None:
        self.delay = 0.0

    def sleep(self, limit: float = MAX_BACKOFF) -> None:
        self.delay = min(MAX_BACKOFF, self.delay * 2.0 or MIN_BACKOFF)
        time.sleep(min(self.delay, limit))


# --------------------------------------------------------------------------
# MPI


@final
class _MPISend(SendHandle):
    # The buffer stays referenced until the request completes: MPI reads it
    # in the background.
    __slots__ = ("request", "buffer")

    def __init__(
        self, owner: object, worker: int, dispatch_id: int, request: MPI.Request, buffer: bytes
    ) -> None:
        super().__init__(owner, worker, dispatch_id)
        self.request = request
        self.buffer = buffer


# Sends still in progress when their transport was closed (a hung worker
# never receives): their buffers must outlive the transport object.
_ABANDONED_SENDS: list[tuple[MPI.Request, bytes]] = []


_MPI_STATS: Final = (
    "sent",
    "send_failed",
    "send_timeout",
    "isent",
    "isend_failed",
    "received",
    "malformed",
    "foreign_source",
    "drained_during_send",
    "stop_sent",
    "stop_failed",
)


@final
class MPITransport:
    """The coordinator's end over MPI, on rank 0 of `comm` (any communicator).

    Worker i is rank i+1. Messages are raw byte buffers (`Isend`/`Improbe`/
    `Mrecv`), so no pickle runs on received data. `send` is an `Isend`
    completed with back-off while results keep being drained: a worker
    blocked sending a large result never deadlocks against it; with
    `send_timeout` set, a send that a hung worker never receives raises
    `SendTimeout` instead of blocking forever."""

    def __init__(
        self,
        comm: MPI.Comm,
        *,
        work_tag: int = DEFAULT_WORK_TAG,
        result_tag: int = DEFAULT_RESULT_TAG,
        stop_tag: int = DEFAULT_STOP_TAG,
        send_timeout: float | None = None,
        stop_timeout: float = 1.0,
        max_batch: int = 4096,
    ) -> None:
        from mpi4py import MPI

        if len({work_tag, result_tag, stop_tag}) != 3 or min(work_tag, result_tag, stop_tag) < 0:
            raise ValueError(
                f"tags must be distinct and >= 0: work={work_tag}, "
                f"result={result_tag}, stop={stop_tag}"
            )
        if send_timeout is not None:
            _check_timeout(send_timeout)
        _check_timeout(stop_timeout)
        if comm.Get_rank() != 0:
            raise ValueError("MPITransport runs on rank 0, the coordinator; workers run run_worker")
        if comm.Get_size() < 2:
            raise ValueError("the communicator has no worker rank (size 1)")
        self._comm = comm
        self._n_workers = comm.Get_size() - 1
        self._work_tag = work_tag
        self._result_tag = result_tag
        self._stop_tag = stop_tag
        self._send_timeout = send_timeout
        self._stop_timeout = stop_timeout
        self._max_batch = max_batch
        self._mpi_error: type[Exception] = MPI.Exception
        self._byte = MPI.BYTE
        self._any_source = MPI.ANY_SOURCE
        self._status = MPI.Status()
        self._inbox: deque[tuple[int, Result | bytes]] = deque()
        self._orphans: list[tuple[MPI.Request, bytes]] = []
        self._stopped = False
        self._closed = False
        self._stats: dict[str, int] = dict.fromkeys(_MPI_STATS, 0)

    @property
    def n_workers(self) -> int:
        return self._n_workers

    @property
    def stats(self) -> dict[str, int]:
        return self._stats

    def now(self) -> float:
        return time.monotonic()

    def take_lost_workers(self) -> list[int]:
        # A rank that dies takes the job down under MPICH; one that hangs is
        # indistinguishable from a slow one here: the coordinator's deadline
        # decides.
        return []

    def _rank(self, worker: int, dispatch_id: int) -> int:
        if self._closed:
            raise SendFailed(worker, dispatch_id, "the transport is closed")
        if not 0 <= worker < self._n_workers:
            raise UnknownWorker(f"worker {worker} is not in 0..{self._n_workers - 1}")
        return worker + 1

    def _start_send(self, worker: int, work: Work) -> tuple[MPI.Request, bytes]:
        rank = self._rank(worker, work.dispatch_id)
        data = _encode_work(work)
        try:
            return self._comm.Isend(data, rank, self._work_tag), data
        except self._mpi_error as exc:
            raise SendFailed(worker, work.dispatch_id, f"Isend: {exc}") from exc

    def send(self, worker: int, work: Work) -> None:
        try:
            request, data = self._start_send(worker, work)
        except SendFailed:
            self._stats["send_failed"] += 1
            raise
        deadline = None if self._send_timeout is None else time.monotonic() + self._send_timeout
        backoff = _Backoff()
        while True:
            try:
                if request.Test():
                    self._stats["sent"] += 1
                    return
            except self._mpi_error as exc:
                self._stats["send_failed"] += 1
                raise SendFailed(worker, work.dispatch_id, f"completing the send: {exc}") from exc
            # A large message waits for the worker to post its receive;
            # meanwhile take in results, so a worker blocked sending one
            # cannot deadlock against this send.
            before = len(self._inbox)
            self._drain()
            if len(self._inbox) > before:
                self._stats["drained_during_send"] += len(self._inbox) - before
                backoff.reset()
            if deadline is not None and time.monotonic() >= deadline:
                self._orphans.append((request, data))
                self._stats["send_timeout"] += 1
                raise SendTimeout(
                    worker,
                    work.dispatch_id,
                    f"not received within {self._send_timeout} s (the worker may be hung)",
                )
            backoff.sleep()

    def isend(self, worker: int, work: Work) -> SendHandle:
        try:
            request, data = self._start_send(worker, work)
        except SendFailed:
            self._stats["isend_failed"] += 1
            raise
        self._stats["isent"] += 1
        return _MPISend(self, worker, work.dispatch_id, request, data)

    def test(self, handle: SendHandle) -> bool:
        if not isinstance(handle, _MPISend) or handle._owner is not self:
            raise ValueError(f"{handle!r} is not a send of this transport")
        if handle._error is not None:
            raise handle._error
        if handle._done:
            return True
        try:
            done = handle.request.Test()
        except self._mpi_error as exc:
            handle._error = SendFailed(
                handle.worker, handle.dispatch_id, f"completing the send: {exc}"
            )
            handle.buffer = b""
            self._stats["isend_failed"] += 1
            raise handle._error from exc
        if done:
            handle._done = True
            handle.buffer = b""
        return done

    def _drain(self) -> None:
        """Receive every result waiting now (up to `max_batch`) into the inbox."""
        comm, status, byte = self._comm, self._status, self._byte
        for _ in range(self._max_batch):
            try:
                message = comm.Improbe(self._any_source, self._result_tag, status)
                if message is None:
                    return
                buffer = bytearray(status.Get_count(byte))
                message.Recv(buffer)
            except self._mpi_error as exc:
                raise TransportError(f"receiving a result: {exc}") from exc
            self._stats["received"] += 1
            worker = status.Get_source() - 1
            if worker < 0:
                self._stats["foreign_source"] += 1  # rank 0 sent to itself
                continue
            data = bytes(buffer)
            try:
                self._inbox.append((worker, decode_result(data)))
            except MalformedMessage:
                self._stats["malformed"] += 1
                self._inbox.append((worker, data))

    def poll(self, timeout: float) -> list[tuple[int, Result | bytes]]:
        if self._closed:
            raise TransportClosed("poll on a closed MPITransport")
        _check_timeout(timeout)
        if self._orphans:
            self._orphans = [pair for pair in self._orphans if not _finished(pair[0])]
        deadline = time.monotonic() + timeout
        backoff = _Backoff()
        while True:
            self._drain()
            if self._inbox:
                arrived = list(self._inbox)
                self._inbox.clear()
                return arrived
            remaining = deadline - time.monotonic()
            if remaining <= 0.0:
                return []
            backoff.sleep(remaining)

    def stop_workers(self) -> None:
        """Send Stop to every worker (once); waits up to `stop_timeout` for the
        sends to leave, and leaves behind the ones a hung worker never takes."""
        if self._stopped or self._closed:
            return
        self._stopped = True
        pending: list[tuple[MPI.Request, bytes]] = []
        for rank in range(1, self._n_workers + 1):
            try:
                pending.append((self._comm.Isend(_STOP_BYTES, rank, self._stop_tag), _STOP_BYTES))
                self._stats["stop_sent"] += 1
            except self._mpi_error:
                self._stats["stop_failed"] += 1
        deadline = time.monotonic() + self._stop_timeout
        backoff = _Backoff()
        while pending and time.monotonic() < deadline:
            pending = [pair for pair in pending if not _finished(pair[0])]
            if pending:
                backoff.sleep()
        self._orphans += pending

    def close(self) -> None:
        """Forget the transport; the communicator stays the caller's."""
        if self._closed:
            return
        self._closed = True
        _ABANDONED_SENDS.extend(pair for pair in self._orphans if not _finished(pair[0]))
        self._orphans = []
        self._inbox.clear()

    def __enter__(self) -> MPITransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _finished(request: MPI.Request) -> bool:
    """Done, or failed: either way nothing more will happen to it."""
    try:
        return request.Test()
    except Exception:
        return True


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
    job down, so a lost worker in real runs is a hung one (DESIGN.md §6)."""
    from mpi4py import MPI

    started_wall, started_cpu = time.monotonic(), time.process_time()
    cache = ObjectCache()
    status = MPI.Status()
    rank = comm.Get_rank()
    outgoing: list[tuple[MPI.Request, bytes]] = []
    backoff = _Backoff()
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
    cache: ObjectCache = field(default_factory=ObjectCache)
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
    `ObjectCache`, as MPI workers do; every message goes through the same
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


# --------------------------------------------------------------------------
# `mpiexec -n N python -m dispatchtx.transport`: a self-test over real ranks

_SUMMARY_TAG: Final = 74


class TransportClock:
    """A host's clock: its transport's virtual time."""

    def __init__(self, transport: SimulatedTransport, wall_offset: float) -> None:
        self._transport = transport
        self.wall_offset = wall_offset

    def monotonic(self) -> float:
        return self._transport.now()

    def wall(self) -> float:
        return self.wall_offset + self._transport.now()


def _selftest_payload(number: int, object_id: str, large: bool) -> object:
    """Each payload kind of the wire format in turn; `large` asks for a large
    result."""
    form = number % 3
    if form == 0:
        return f"{object_id}:{number}:{int(large)}".encode()
    if form == 1:
        return f"{object_id}:{number}:{int(large)}"
    return (object_id, number, large)


def _selftest_task(work: Work, objects: Mapping[str, bytes]) -> bytes:
    payload = work.payload
    if isinstance(payload, bytes):
        payload = payload.decode()
    if isinstance(payload, str):
        object_id, number_text, large_text = payload.split(":")
        number, large = int(number_text), large_text == "1"
    elif isinstance(payload, tuple):
        object_id, number, large = payload
    else:
        raise TypeError(f"unexpected payload {payload!r:.80}")
    return _selftest_expected(objects[object_id], number, large)


def _selftest_expected(content: bytes, number: int, large: bool) -> bytes:
    digest = hashlib.sha256(content + number.to_bytes(8, "little")).digest()
    # A large result is 256 KiB, past MPICH's eager limit: large results then
    # meet large sends, the case where two blocking sends deadlock.
    return digest * 8192 if large else digest


def _selftest_large(number: int, every: int) -> bool:
    return every > 0 and number % every == every - 1


def _selftest_coordinator(comm: MPI.Comm, args: argparse.Namespace) -> int:
    from mpi4py import MPI

    transport = MPITransport(comm, send_timeout=args.send_timeout)
    n_workers = transport.n_workers
    contents = [f"object {k} ".encode() * 64 for k in range(args.objects)]
    contents[0] *= max(1, (args.large_object_kib << 10) // len(contents[0]))
    object_ids = [hashlib.sha256(content).hexdigest() for content in contents]
    by_id = dict(zip(object_ids, contents, strict=True))
    held: list[set[str]] = [set() for _ in range(n_workers)]
    outstanding: dict[int, tuple[int, Work, float]] = {}
    per_worker = [0] * n_workers
    most_in_flight = [0] * n_workers
    handles: list[SendHandle] = []
    lost: set[int] = set()
    counts: Counter[str] = Counter()
    problems: list[str] = []
    todo = deque(range(args.round_trips))
    next_id = 0
    started = transport.now()
    give_up = started + args.timeout

    while (todo or outstanding) and transport.now() < give_up:
        for worker in range(n_workers):
            while todo and worker not in lost and per_worker[worker] < args.in_flight:
                number = todo.popleft()
                object_id = object_ids[number % len(object_ids)]
                ship = {} if object_id in held[worker] else {object_id: by_id[object_id]}
                work = Work(
                    next_id,
                    f"item-{number}",
                    2 * number + 1,
                    _selftest_payload(
                        number, object_id, _selftest_large(number, args.large_result_every)
                    ),
                    ship,
                )
                next_id += 1
                try:
                    if work.dispatch_id % 2:
                        handles.append(transport.isend(worker, work))
                    else:
                        transport.send(worker, work)
                except SendFailed as exc:
                    counts["send_failed"] += 1
                    problems.append(str(exc))
                    todo.appendleft(number)
                    break
                held[worker].add(object_id)  # only once the send returned (D7)
                outstanding[work.dispatch_id] = (worker, work, transport.now())
                per_worker[worker] += 1
                most_in_flight[worker] = max(most_in_flight[worker], per_worker[worker])
        still = []
        for handle in handles:
            try:
                if not transport.test(handle):
                    still.append(handle)
            except SendFailed as exc:
                counts["ambiguous_sends"] += 1
                problems.append(str(exc))
        handles = still
        for worker, message in transport.poll(0.01):
            if isinstance(message, bytes):
                counts["malformed"] += 1
                continue
            entry = outstanding.pop(message.dispatch_id, None)
            if entry is None:
                counts["unknown"] += 1
                continue
            sent_to, work, _ = entry
            per_worker[sent_to] -= 1
            number = int(work.item.split("-")[1])
            content = by_id[object_ids[number % len(object_ids)]]
            if (
                worker == sent_to
                and message.item == work.item
                and message.token == work.token
                and message.ok
                and message.result
                == _selftest_expected(
                    content, number, _selftest_large(number, args.large_result_every)
                )
            ):
                counts["correct"] += 1
            else:
                counts["wrong"] += 1
                problems.append(f"wrong answer from worker {worker}: {message!r:.300}")
        now = transport.now()
        for worker, _, sent_at in list(outstanding.values()):
            if now - sent_at > args.deadline and worker not in lost:
                # A hung worker: everything it holds goes to the others.
                lost.add(worker)
                held[worker].clear()
                for other_id, (other_worker, other_work, _) in list(outstanding.items()):
                    if other_worker == worker:
                        del outstanding[other_id]
                        todo.append(int(other_work.item.split("-")[1]))
                        counts["redispatched"] += 1
                per_worker[worker] = 0
        if len(lost) == n_workers:
            problems.append("every worker is lost")
            break
    elapsed = transport.now() - started

    # A large send to a hung worker cannot complete: it must time out, not
    # block the coordinator forever.
    hung_send_timed_out = False
    for worker in sorted(lost):
        big = Work(next_id, "big", 0, None, {"big": bytes(args.big_send_mib << 20)})
        next_id += 1
        try:
            transport.send(worker, big)
            problems.append(f"a {args.big_send_mib} MiB send to hung worker {worker} completed")
        except SendTimeout:
            hung_send_timed_out = True

    idle_cpu = 0.0
    if args.idle_seconds > 0:
        cpu_before, idle_until = time.process_time(), transport.now() + args.idle_seconds
        while transport.now() < idle_until:
            counts["unexpected_while_idle"] += len(transport.poll(idle_until - transport.now()))
        idle_cpu = time.process_time() - cpu_before

    transport.stop_workers()
    summaries: dict[int, dict[str, Any]] = {}
    status = MPI.Status()
    summary_deadline = time.monotonic() + 10.0
    backoff = _Backoff()
    while len(summaries) < n_workers - len(lost) and time.monotonic() < summary_deadline:
        summary = comm.improbe(MPI.ANY_SOURCE, _SUMMARY_TAG, status)
        if summary is None:
            backoff.sleep()
            continue
        summaries[status.Get_source() - 1] = summary.recv()
    transport.close()

    expected_malformed = 2 if args.garbage else 0
    expected_lost = {args.hang_worker} if args.hang_worker >= 0 else set()
    passed = (
        counts["correct"] == args.round_trips
        and counts["wrong"] == 0
        and counts["unknown"] == 0
        and counts["malformed"] == expected_malformed
        and counts["unexpected_while_idle"] == 0
        and lost == expected_lost
        and hung_send_timed_out == bool(lost)
        and len(summaries) == n_workers - len(lost)
    )
    report = {
        "ranks": comm.Get_size(),
        "round_trips": args.round_trips,
        "in_flight_per_worker": args.in_flight,
        "large_object_kib": args.large_object_kib,
        "large_result_every": args.large_result_every,
        "most_in_flight_seen": most_in_flight,
        "correct": counts["correct"],
        "wrong": counts["wrong"],
        "unknown": counts["unknown"],
        "malformed": counts["malformed"],
        "send_failed": counts["send_failed"],
        "ambiguous_sends": counts["ambiguous_sends"],
        "redispatched": counts["redispatched"],
        "lost_workers": sorted(lost),
        "hung_send_timed_out": hung_send_timed_out,
        "seconds": round(elapsed, 4),
        "round_trips_per_second": round(counts["correct"] / elapsed, 1) if elapsed else None,
        "idle_seconds": args.idle_seconds,
        "coordinator_idle_cpu_seconds": round(idle_cpu, 4),
        "workers": {str(worker): summaries[worker] for worker in sorted(summaries)},
        "transport_stats": transport.stats,
        "problems": problems[:20],
        "passed": passed,
    }
    text = json.dumps(report, indent=2)
    print(text, flush=True)
    if args.report:
        temporary = f"{args.report}.tmp"
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, args.report)  # readers never see half a report
    return 0 if passed else 1


def _selftest_worker(comm: MPI.Comm, args: argparse.Namespace) -> int:
    worker = comm.Get_rank() - 1
    if args.garbage and worker == 0:
        # Two messages no decoder accepts: the coordinator must count, not crash.
        comm.Send(b"\x00 not a dispatchtx message", 0, DEFAULT_RESULT_TAG)
        comm.Send(b"", 0, DEFAULT_RESULT_TAG)
    received = 0
    hang_after: int = args.hang_after

    def hang_when(work: Work) -> bool:
        nonlocal received
        received += 1
        return received == hang_after

    summary = run_worker(
        comm, _selftest_task, hang_when=hang_when if worker == args.hang_worker else None
    )
    comm.send(
        {
            "tasks_run": summary.tasks_run,
            "task_errors": summary.task_errors,
            "objects_received": summary.objects_received,
            "objects_cached": summary.objects_cached,
            "cpu_seconds": round(summary.cpu_seconds, 4),
            "wall_seconds": round(summary.wall_seconds, 4),
        },
        0,
        _SUMMARY_TAG,
    )
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatchtx.transport",
        description="self-test of MPITransport and run_worker over real MPI ranks",
    )
    parser.add_argument("--round-trips", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=4, help="outstanding Work per worker")
    parser.add_argument("--objects", type=int, default=8, help="distinct objects shipped")
    parser.add_argument("--large-object-kib", type=int, default=1024, help="object 0's size")
    parser.add_argument(
        "--large-result-every", type=int, default=10, help="every N-th result is 256 KiB (0: none)"
    )
    parser.add_argument("--idle-seconds", type=float, default=0.0, help="idle polling at the end")
    parser.add_argument("--garbage", action="store_true", help="worker 0 sends 2 bad messages")
    parser.add_argument("--hang-worker", type=int, default=-1, help="this worker hangs (SIGSTOP)")
    parser.add_argument("--hang-after", type=int, default=3, help="on its N-th Work")
    parser.add_argument("--deadline", type=float, default=30.0, help="a result later is lost")
    parser.add_argument("--send-timeout", type=float, default=10.0, help="MPITransport's")
    parser.add_argument("--big-send-mib", type=int, default=16, help="sent to a hung worker")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after this")
    parser.add_argument("--report", default="", help="also write the JSON report here")
    args = parser.parse_args(None if argv is None else list(argv))
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        return _selftest_coordinator(comm, args)
    return _selftest_worker(comm, args)


if __name__ == "__main__":
    # Run the imported module's main, so that one set of message classes
    # exists in this process, not a second one under `__main__`.
    from dispatchtx.transport import main as _main

    sys.exit(_main())
