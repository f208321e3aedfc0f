"""`MPITransport`: the coordinator's side over rank 0 of any `MPI.Comm`.

Raw byte buffers (`Send`/`Recv`, never pickle), polls that yield for a short
spin and then back off exponentially (results flowing in are seen at once,
an idle rank burns no CPU), and never blocks a send against a peer that is
itself sending.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Final, final

if TYPE_CHECKING:
    from mpi4py import MPI

from dispatchtx.transport.interface import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_RESULT_TAG,
    DEFAULT_SPIN,
    DEFAULT_STOP_TAG,
    DEFAULT_WORK_TAG,
    Backoff,
    SendHandle,
    _check_timeout,
)
from dispatchtx.transport.messages import (
    _STOP_BYTES,
    MalformedMessage,
    Result,
    SendFailed,
    SendTimeout,
    TransportClosed,
    TransportError,
    UnknownWorker,
    Work,
    _encode_work,
    decode_result,
)

__all__ = ["MPITransport"]

log = logging.getLogger("dispatchtx.transport")


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
    "oversized",
    "foreign_source",
    "drained_during_send",
    "stop_sent",
    "stop_failed",
)


#: Empty probes in a row after which a poll that took a result stops draining.
QUIET_PROBES: Final = 16


@final
class MPITransport:
    """The coordinator's end over MPI, on rank 0 of `comm` (any communicator).

    Worker i is rank i+1. Messages are raw byte buffers (`Isend`/`Improbe`/
    `Mrecv`), so no pickle runs on received data. `send` is an `Isend`
    completed with back-off while results keep being drained: a worker
    blocked sending a large result never deadlocks against it; with
    `send_timeout` set, a send that a hung worker never receives raises
    `SendTimeout` instead of blocking forever. A result message over
    `max_result_bytes` is dropped unread (counted as "oversized"): what a
    worker sends cannot make the coordinator allocate more than that.

    Between empty polls it yields for `spin` seconds after the last message
    sent or received, then backs off from 1 us to 1 ms (one `Backoff` for
    every `poll` and `send`, so an idle coordinator stays backed off from
    one poll to the next): 0 sleeps at once, as mpi4py.futures does."""

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
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        spin: float = DEFAULT_SPIN,
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
        if type(max_result_bytes) is not int or max_result_bytes < 1:
            raise ValueError(f"max_result_bytes must be an int >= 1, not {max_result_bytes!r}")
        backoff = Backoff(spin)  # checks `spin` before any MPI call
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
        self._max_result_bytes = max_result_bytes
        # One policy across calls: an idle coordinator that polls again and
        # again stays backed off; a message sent or received spins it again.
        self._backoff = backoff
        self._truncate_error: int = MPI.ERR_TRUNCATE
        self._mpi_error: type[MPI.Exception] = MPI.Exception
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
        backoff = self._backoff
        backoff.reset()  # its answer is due soon
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
        self._backoff.reset()
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
                count = status.Get_count(byte)
                worker = status.Get_source() - 1
                if count > self._max_result_bytes:
                    self._drop_oversized(message, worker, count)
                    continue
                buffer = bytearray(count)
                message.Recv(buffer)
            except self._mpi_error as exc:
                raise TransportError(f"receiving a result: {exc}") from exc
            self._stats["received"] += 1
            if worker < 0:
                self._stats["foreign_source"] += 1  # rank 0 sent to itself
                continue
            try:  # decoded from the receive buffer: the result is its one copy
                self._inbox.append((worker, decode_result(buffer)))
            except MalformedMessage:
                self._stats["malformed"] += 1
                self._inbox.append((worker, bytes(buffer)))

    def _drain_until_quiet(self) -> None:
        """Once a result is in: drain again until `QUIET_PROBES` probes in a
        row bring nothing (or `max_batch` are in). Under MPICH's ch4 devices a
        probe makes progress for about one message, so the results already
        on their way show up over the next calls: measured here, a poll
        otherwise took one result at a time with eight in flight, and the
        coordinator's group commits were groups of one."""
        quiet = 0
        while quiet < QUIET_PROBES and len(self._inbox) < self._max_batch:
            before = len(self._inbox)
            self._drain()
            quiet = 0 if len(self._inbox) > before else quiet + 1

    def _drop_oversized(self, message: MPI.Message, worker: int, count: int) -> None:
        """Receive a message over `max_result_bytes` into an empty buffer:
        MPI truncates it (ERR_TRUNCATE, the message consumed), so a worker
        cannot make the coordinator allocate what it likes. The worker's
        answer counts as an undecodable one (an empty buffer)."""
        try:
            message.Recv([bytearray(0), 0, self._byte])
        except self._mpi_error as exc:
            if exc.Get_error_class() != self._truncate_error:
                raise
        self._stats["received"] += 1
        self._stats["oversized"] += 1
        log.warning(
            "worker %d sent a %d-byte message, over max_result_bytes (%d): dropped",
            worker,
            count,
            self._max_result_bytes,
        )
        if worker >= 0:
            self._inbox.append((worker, b""))

    def poll(self, timeout: float) -> list[tuple[int, Result | bytes]]:
        if self._closed:
            raise TransportClosed("poll on a closed MPITransport")
        _check_timeout(timeout)
        if self._orphans:
            self._orphans = [pair for pair in self._orphans if not _finished(pair[0])]
        deadline = time.monotonic() + timeout
        backoff = self._backoff
        while True:
            self._drain()
            if self._inbox:
                self._drain_until_quiet()
                backoff.reset()
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
        backoff = Backoff(self._backoff.spin)
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
