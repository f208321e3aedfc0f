"""The baseline of `dispatchtx bench`: a raw mpi4py master/worker loop, with
nothing of dispatchtx in it but its polling constants.

    mpiexec -n N python -m dispatchtx.jobs.bench.raw_mpi --items 800 --max-in-flight 1 4 \\
        --repetitions 3 [--policy backoff|yield|block] [--spin S] --report FILE

What a user writes without dispatchtx: rank 0 keeps `--max-in-flight` tasks
at every worker rank, sends each task as a pickled tuple (`comm.isend`), and
takes results with a matched probe (`comm.improbe` + `recv`). How every
rank waits is `--policy`: `backoff` is dispatchtx's transport policy
(`dispatchtx.transport.Backoff`: yield for `--spin` seconds after the last
message, then sleep from 1 us to 1 ms); `yield` never sleeps; `block` waits
in MPI's blocking calls (`mprobe`, `Wait`), which MPICH busy-polls.
The messages carry what a dispatchtx Work and Result carry for
`HashWorkload` (dispatch id, item, token, the payload `[item, object id]`,
object contents the worker lacks; the 32-byte digest back), and the workers
run the same task (sha256 of the item and the object's content). There is no
store, no journal, no fence: this is the runtime's floor.

For each depth of `--max-in-flight`, rank 0 runs one warm-up round and then
`--repetitions` timed rounds in the same job, and writes a JSON report
(results/s of each round, message sizes, the mpi4py and MPI library
versions) to `--report`, or to stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pickle
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from dispatchtx.transport import DEFAULT_SPIN, Backoff

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["main"]

WORK_TAG: Final = 81
RESULT_TAG: Final = 82
STOP_TAG: Final = 83
N_OBJECTS: Final = 4  # as HashWorkload
POLICIES: Final = ("backoff", "yield", "block")

# (dispatch id, item, token, payload, {object id: content}); the result:
# (dispatch id, item, token, digest, cpu seconds).
WorkTuple = tuple[int, str, int, list[str], dict[str, bytes]]
ResultTuple = tuple[int, str, int, bytes, float]


class Waiting:
    """How a rank waits for a message: `block` in MPI's blocking calls, or
    between empty polls with a `Backoff` (`yield`: one that never sleeps)."""

    __slots__ = ("policy", "block", "backoff")

    def __init__(self, policy: str, spin: float) -> None:
        self.policy = policy
        self.block = policy == "block"
        self.backoff = Backoff(math.inf if policy == "yield" else spin)


def object_contents() -> dict[str, bytes]:
    """The shared objects of HashWorkload, by id (sha256 of the content)."""
    contents = [f"object {i}".encode() * 8 for i in range(N_OBJECTS)]
    return {hashlib.sha256(content).hexdigest(): content for content in contents}


def _complete(request: MPI.Request, waiting: Waiting) -> None:
    """Wait for a send as `MPITransport.send` does (Test, back off, retry),
    or in `Wait`."""
    if waiting.block:
        request.Wait()
        return
    while not request.Test():
        waiting.backoff.sleep()


class _Sender:
    """Rank 0's sends: a pickled tuple per task, object contents only the
    first time a worker needs them (as dispatchtx's object cache does)."""

    def __init__(self, comm: MPI.Comm, n_workers: int, waiting: Waiting) -> None:
        self.comm = comm
        self.waiting = waiting
        self.objects = object_contents()
        self.object_ids = list(self.objects)
        self.known: list[set[str]] = [set() for _ in range(n_workers + 1)]  # by rank
        self.dispatch_id = 0
        self.sizes: list[int] = []

    def send(self, rank: int, index: int, item: str) -> None:
        object_id = self.object_ids[index % N_OBJECTS]
        known = self.known[rank]
        shipped = {} if object_id in known else {object_id: self.objects[object_id]}
        known.add(object_id)
        self.dispatch_id += 1
        message: WorkTuple = (self.dispatch_id, item, index + 1, [item, object_id], shipped)
        if len(self.sizes) < 64:  # a sample of sizes, for the report
            self.sizes.append(len(pickle.dumps(message, pickle.HIGHEST_PROTOCOL)))
        _complete(self.comm.isend(message, rank, WORK_TAG), self.waiting)
        self.waiting.backoff.reset()  # as MPITransport: its answer is due soon


def _timed_round(
    comm: MPI.Comm, sender: _Sender, items: int, depth: int, tag: str, sizes: list[int]
) -> float:
    """Results/s of one round of `items` tasks, `depth` kept at each worker."""
    from mpi4py import MPI

    n_workers = comm.Get_size() - 1
    status = MPI.Status()
    waiting = sender.waiting
    backoff = waiting.backoff
    names = [f"{tag}-item-{i}" for i in range(items)]
    queue = deque(range(items))
    received = 0
    started = time.perf_counter()
    for _ in range(depth):
        for rank in range(1, n_workers + 1):
            if queue:
                index = queue.popleft()
                sender.send(rank, index, names[index])
    while received < items:
        probe: MPI.Message | None
        if waiting.block:
            probe = comm.mprobe(MPI.ANY_SOURCE, RESULT_TAG, status)
        else:
            probe = comm.improbe(MPI.ANY_SOURCE, RESULT_TAG, status)
            if probe is None:
                backoff.sleep()
                continue
            backoff.reset()
        result: ResultTuple = probe.recv()
        if len(sizes) < 64:  # a sample of sizes, for the report
            sizes.append(len(pickle.dumps(result, pickle.HIGHEST_PROTOCOL)))
        received += 1
        if queue:
            index = queue.popleft()
            sender.send(status.Get_source(), index, names[index])
    return items / (time.perf_counter() - started)


def master(
    comm: MPI.Comm, items: int, depths: list[int], repetitions: int, waiting: Waiting
) -> dict[str, Any]:
    """For each depth: a warm-up round, then `repetitions` timed rounds."""
    import mpi4py
    from mpi4py import MPI

    sender = _Sender(comm, comm.Get_size() - 1, waiting)
    result_sizes: list[int] = []
    by_depth: dict[str, Any] = {}
    for depth in depths:
        rates = [
            _timed_round(comm, sender, items, depth, f"d{depth}r{round_number}", result_sizes)
            for round_number in range(1 + repetitions)
        ]
        by_depth[str(depth)] = {
            "results_per_second": rates[1:],
            "warm_up_results_per_second": rates[0],
        }
    for rank in range(1, comm.Get_size()):
        comm.send(None, rank, STOP_TAG)
    return {
        "ranks": comm.Get_size(),
        "items": items,
        "policy": waiting.policy,
        "spin": waiting.backoff.spin if waiting.policy == "backoff" else None,
        "warm_up_rounds": 1,
        "by_max_in_flight": by_depth,
        "work_message_bytes": sum(sender.sizes) / max(1, len(sender.sizes)),
        "result_message_bytes": sum(result_sizes) / max(1, len(result_sizes)),
        "mpi4py": mpi4py.__version__,
        "mpi_library": " ".join(MPI.Get_library_version().split("\n", 1)[0].split()),
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
    }


def worker(comm: MPI.Comm, waiting: Waiting) -> None:
    from mpi4py import MPI

    status = MPI.Status()
    cache: dict[str, bytes] = {}
    outgoing: list[MPI.Request] = []
    backoff = waiting.backoff
    while True:
        if outgoing:
            outgoing = [request for request in outgoing if not request.Test()]
        probe: MPI.Message | None
        if waiting.block:
            probe = comm.mprobe(0, MPI.ANY_TAG, status)
            if status.Get_tag() == STOP_TAG:  # sent once every result is in
                probe.recv()
                break
        else:
            probe = comm.improbe(0, WORK_TAG, status)
            if probe is None:
                stop = comm.improbe(0, STOP_TAG, status)
                if stop is not None:
                    stop.recv()
                    break
                backoff.sleep()
                continue
            backoff.reset()
        work: WorkTuple = probe.recv()
        dispatch_id, item, token, (text, object_id), shipped = work
        cache.update(shipped)
        started = time.process_time()
        digest = hashlib.sha256(text.encode() + cache[object_id]).digest()
        answer: ResultTuple = (dispatch_id, item, token, digest, time.process_time() - started)
        outgoing.append(comm.isend(answer, 0, RESULT_TAG))
        backoff.reset()  # as run_worker: the next work follows its answer
    for request in outgoing:
        _complete(request, waiting)


def write_report(report: dict[str, Any], path: str | None) -> None:
    """To `path` atomically (the caller reads it whole or not at all), or stdout."""
    if path is None:
        print(json.dumps(report, indent=2))
        return
    temporary = f"{path}.tmp.{os.getpid()}"
    with open(temporary, "w") as out:
        json.dump(report, out, indent=2)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--items", type=int, default=800, help="tasks per round")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        nargs="+",
        default=[1],
        help="tasks kept at each worker; several depths run one after another in this job",
    )
    parser.add_argument("--repetitions", type=int, default=3, help="timed rounds after a warm-up")
    parser.add_argument("--policy", choices=POLICIES, default="backoff", help="how ranks wait")
    parser.add_argument(
        "--spin", type=float, default=DEFAULT_SPIN, help="backoff: seconds of yielding first"
    )
    parser.add_argument("--report", help="write the JSON report here (default: stdout)")
    args = parser.parse_args(argv)
    if args.items < 1 or min(args.max_in_flight) < 1 or args.repetitions < 1:
        parser.error("--items, --max-in-flight and --repetitions must be >= 1")
    if not 0.0 <= args.spin <= 1.0:
        parser.error("--spin must be between 0 and 1 second")
    waiting = Waiting(args.policy, args.spin)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        report = master(comm, args.items, args.max_in_flight, args.repetitions, waiting)
        write_report(report, args.report)
    else:
        worker(comm, waiting)
    return 0


if __name__ == "__main__":
    sys.exit(main())
