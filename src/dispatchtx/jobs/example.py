"""A self-checking coordinator loop over mpi4py, with faults injected.

Rank 0 dispatches tasks to every other rank through `DispatchTables`; each
dispatch reserves three resources (a work lease, a pending bandit token and
an attempt count), every one with its undo, discard and release. Faults are
injected on purpose: a send that fails, a message build that throws, and
results that come back stale. At the end the coordinator checks that every
task was committed exactly once and that nothing leaked, prints a report and
exits non-zero if anything is off.

Run it with `python -m dispatchtx example` (which starts `mpiexec`), or
directly: `mpiexec -n 3 python -m dispatchtx.jobs.example`.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dispatchtx import COMPILED, DispatchTables, UnknownDispatch, WrongWorker
from dispatchtx.jobs.arguments import JobParser, int_at_least

TAG_WORK = 11
TAG_RESULT = 12
TAG_STOP = 13

# Idle ranks back off their Iprobe polling up to this, as mpi4py.futures does:
# on an oversubscribed machine a blocking recv busy-polls and starves others.
MAX_BACKOFF = 0.001


@dataclass
class Resources:
    """The coordinator's reservations, with their compensations declared once."""

    tables: DispatchTables
    leases: dict[int, int] = field(default_factory=dict)  # task -> dispatch id
    pending_tokens: set[int] = field(default_factory=set)
    attempts: Counter[int] = field(default_factory=Counter)
    pulls: Counter[str] = field(default_factory=Counter)
    rewards: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lease = self.tables.compensation(
            "lease", self._release_lease, self._release_lease, self._release_lease
        )
        self.token = self.tables.compensation(
            "bandit-token", self._take_back_pull, self._drop_token, self._drop_token
        )
        self.attempt = self.tables.compensation("attempt", self._take_back_attempt, None, None)

    def _release_lease(self, task: int) -> None:
        del self.leases[task]

    def _take_back_pull(self, token: int) -> None:
        self.pending_tokens.remove(token)
        self.pulls["arm"] -= 1  # an unsent task is never counted as a pull

    def _drop_token(self, token: int) -> None:
        self.pending_tokens.remove(token)

    def _take_back_attempt(self, task: int) -> None:
        self.attempts[task] -= 1

    def leaked(self) -> dict[str, int]:
        return {"leases": len(self.leases), "pending_tokens": len(self.pending_tokens)}


def coordinator(comm: Any, n_tasks: int, fault_every: int) -> int:
    from mpi4py import MPI

    size = comm.Get_size()
    tables = DispatchTables(size)  # worker index = rank; rank 0 holds none
    res = Resources(tables)
    queue = list(range(n_tasks))
    results: dict[int, int] = {}
    counts: Counter[str] = Counter()
    idle = list(range(1, size))
    dispatch_count = 0
    started = time.monotonic()
    status = MPI.Status()
    backoff = 0.0

    while queue or len(tables):
        while idle and queue:
            worker = idle.pop()
            task = queue.pop()
            dispatch_count += 1
            fault = dispatch_count % fault_every
            try:
                with tables.dispatch(worker, tag=task) as txn:
                    res.leases[task] = txn.id
                    txn.add(res.lease, task)
                    res.pending_tokens.add(txn.id)
                    res.pulls["arm"] += 1
                    txn.add(res.token, txn.id)
                    res.attempts[task] += 1
                    txn.add(res.attempt, task)
                    if fault == 1:
                        raise ValueError("injected: the message build threw")
                    message = (txn.id, task)
                    if fault == 2:
                        raise ConnectionError("injected: send failed")
                    comm.send(message, dest=worker, tag=TAG_WORK)
                    tables.sent(txn.id, time.monotonic())
            except (ValueError, ConnectionError) as error:
                counts["send faults" if isinstance(error, ConnectionError) else "build faults"] += 1
                queue.append(task)
                idle.append(worker)
        if not comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_RESULT, status=status):
            backoff = min(MAX_BACKOFF, backoff * 2 or 1e-6)
            time.sleep(backoff)
            continue
        backoff = 0.0
        source = status.Get_source()
        dispatch_id, task, value = comm.recv(source=source, tag=TAG_RESULT)
        idle.append(source)
        try:
            txn = tables.match(source, dispatch_id)
        except (UnknownDispatch, WrongWorker):
            counts["unknown results dropped"] += 1
            continue
        if dispatch_id % fault_every == 3:
            # The shared store's fence would refuse this one: a stale result.
            tables.fenced_out(txn.id)
            counts["stale results fenced out"] += 1
            queue.append(task)
            continue
        with tables.committing(txn.id):
            if task in results:
                counts["applied twice"] += 1
            results[task] = value
            res.rewards["arm"] = res.rewards.get("arm", 0.0) + 1.0
        counts["committed"] += 1

    for worker in range(1, size):
        comm.send(None, dest=worker, tag=TAG_STOP)
    failures = tables.shutdown()
    elapsed = time.monotonic() - started
    wrong = sum(1 for task, value in results.items() if value != task * task)
    leaked = res.leaked()
    passed = (
        len(results) == n_tasks
        and wrong == 0
        and counts["applied twice"] == 0
        and not any(leaked.values())
        and not failures
        and sum(res.attempts.values()) == counts["committed"] + counts["stale results fenced out"]
        and res.pulls["arm"] == counts["committed"] + counts["stale results fenced out"]
    )
    report = {
        "build": "compiled" if COMPILED else "pure",
        "ranks": size,
        "tasks": n_tasks,
        "dispatches": dispatch_count,
        "committed": counts["committed"],
        "send_faults": counts["send faults"],
        "build_faults": counts["build faults"],
        "stale_results_fenced_out": counts["stale results fenced out"],
        "unknown_results_dropped": counts["unknown results dropped"],
        "applied_twice": counts["applied twice"],
        "wrong_results": wrong,
        "attempts_counted": sum(res.attempts.values()),
        "bandit_pulls_counted": res.pulls["arm"],
        "leaked": leaked,
        "compensation_failures": len(failures),
        "seconds": round(elapsed, 3),
        "results_per_second": round(counts["committed"] / elapsed, 1) if elapsed else None,
        "passed": passed,
    }
    print(json.dumps(report, indent=2))
    print("PASSED: nothing leaked, every task committed once" if passed else "FAILED")
    return 0 if passed else 1


def worker(comm: Any) -> int:
    from mpi4py import MPI

    status = MPI.Status()
    backoff = 0.0
    while True:
        if not comm.Iprobe(source=0, tag=MPI.ANY_TAG, status=status):
            backoff = min(MAX_BACKOFF, backoff * 2 or 1e-6)
            time.sleep(backoff)
            continue
        backoff = 0.0
        message = comm.recv(source=0, tag=status.Get_tag())
        if status.Get_tag() == TAG_STOP:
            return 0
        dispatch_id, task = message
        comm.send((dispatch_id, task, task * task), dest=0, tag=TAG_RESULT)


def main(argv: list[str] | None = None) -> int:
    parser = JobParser(
        prog="python -m dispatchtx.jobs.example",
        description="a self-checking dispatchtx loop over MPI",
    )
    parser.add_argument("--tasks", type=int_at_least(1), default=500, help="tasks to dispatch")
    parser.add_argument(
        "--fault-every", type=int_at_least(1), default=7, help="every N-th send fails"
    )
    args = parser.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run under mpiexec with at least 2 ranks", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        return coordinator(comm, args.tasks, args.fault_every)
    return worker(comm)


if __name__ == "__main__":
    sys.exit(main())
