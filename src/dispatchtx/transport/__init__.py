"""Moving Work to workers and Results back (docs/design.md), one module per part:

- `messages`: `Work`, `Result`, `Stop`, their wire encoding (raw bytes with
  checked lengths; results carry nothing pickled) and the transport's errors;
- `interface`: the `Transport` protocol the coordinator uses, `SendHandle`,
  the tags and the polling back-off;
- `mpi`: `MPITransport`, rank 0 of any `MPI.Comm` (`Send`/`Recv` of raw
  buffers, never blocking a send against a peer that is itself sending);
- `worker`: the worker's side, shared by MPI ranks and simulated workers
  (`run_worker`, `run_task` and the worker's `WorkerObjects`);
- `simulated`: `SimulatedTransport`, the same worker code in process on a
  virtual clock with seeded faults, and `TransportClock`.

The coordinator only ever sees `Transport`, so the simulator runs the very
coordinator code that drives real ranks. Nothing here imports dispatchtx
beyond the error leaf, and mpi4py only inside the MPI parts: it imports on a
machine without MPI. The self-test over real ranks is a job:
`mpiexec -n 3 python -m dispatchtx.jobs.transport_selftest`.
"""

from __future__ import annotations

from dispatchtx.transport.interface import (
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_RESULT_TAG,
    DEFAULT_SPIN,
    DEFAULT_STOP_TAG,
    DEFAULT_WORK_TAG,
    MAX_BACKOFF,
    MIN_BACKOFF,
    Backoff,
    SendHandle,
    Transport,
)
from dispatchtx.transport.messages import (
    MalformedMessage,
    Message,
    Result,
    SendFailed,
    SendTimeout,
    Stop,
    TaskFn,
    TransportClosed,
    TransportError,
    UnencodableMessage,
    UnknownWorker,
    Work,
    decode,
    decode_result,
    decode_work,
    encode,
)
from dispatchtx.transport.mpi import MPITransport
from dispatchtx.transport.simulated import (
    SIM_FAULTS,
    SimFaults,
    SimulatedTransport,
    TraceEntry,
    TransportClock,
)
from dispatchtx.transport.worker import (
    WorkerObjects,
    WorkerSummary,
    run_task,
    run_worker,
    stop_this_process,
)

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_RESULT_TAG",
    "DEFAULT_STOP_TAG",
    "DEFAULT_WORK_TAG",
    "Backoff",
    "DEFAULT_SPIN",
    "MAX_BACKOFF",
    "MIN_BACKOFF",
    "MPITransport",
    "MalformedMessage",
    "Message",
    "WorkerObjects",
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
