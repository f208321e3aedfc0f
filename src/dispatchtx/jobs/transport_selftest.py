"""A self-test of the MPI transport over real ranks (a job, not part of the
library): pipelined round trips of every payload kind, large messages and
object transfers, every result checked, a JSON report.

    mpiexec -n 3 python -m dispatchtx.jobs.transport_selftest --report FILE
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from mpi4py import MPI

from dispatchtx.transport.interface import DEFAULT_RESULT_TAG, Backoff, SendHandle
from dispatchtx.transport.messages import SendFailed, SendTimeout, Work
from dispatchtx.transport.mpi import MPITransport
from dispatchtx.transport.worker import run_worker

__all__ = ["main"]


# --------------------------------------------------------------------------
# `mpiexec -n N python -m dispatchtx.jobs.transport_selftest`

_SUMMARY_TAG: Final = 74


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

    transport = MPITransport(
        comm, send_timeout=args.send_timeout, max_result_bytes=args.max_result_bytes
    )
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
    backoff = Backoff()
    while len(summaries) < n_workers - len(lost) and time.monotonic() < summary_deadline:
        summary = comm.improbe(MPI.ANY_SOURCE, _SUMMARY_TAG, status)
        if summary is None:
            backoff.sleep()
            continue
        summaries[status.Get_source() - 1] = summary.recv()
    transport.close()

    expected_malformed = 3 if args.garbage else 0  # the oversized one arrives as b""
    expected_lost = {args.hang_worker} if args.hang_worker >= 0 else set()
    passed = (
        counts["correct"] == args.round_trips
        and counts["wrong"] == 0
        and counts["unknown"] == 0
        and counts["malformed"] == expected_malformed
        and transport.stats["oversized"] == (1 if args.garbage else 0)
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
        # Messages no decoder accepts, one of them over the coordinator's
        # max_result_bytes: the coordinator must count, not crash or allocate.
        comm.Send(b"\x00 not a dispatchtx message", 0, DEFAULT_RESULT_TAG)
        comm.Send(b"", 0, DEFAULT_RESULT_TAG)
        comm.Send(bytes(args.max_result_bytes + 1), 0, DEFAULT_RESULT_TAG)
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
        prog="python -m dispatchtx.jobs.transport_selftest",
        description="self-test of MPITransport and run_worker over real MPI ranks",
    )
    parser.add_argument("--round-trips", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=4, help="outstanding Work per worker")
    parser.add_argument("--objects", type=int, default=8, help="distinct objects shipped")
    parser.add_argument("--large-object-kib", type=int, default=1024, help="object 0's size")
    parser.add_argument(
        "--large-result-every", type=int, default=10, help="every N-th result is 256 KiB (0: none)"
    )
    parser.add_argument(
        "--max-result-bytes", type=int, default=2 * 1024 * 1024, help="MPITransport's cap"
    )
    parser.add_argument("--idle-seconds", type=float, default=0.0, help="idle polling at the end")
    parser.add_argument(
        "--garbage", action="store_true", help="worker 0 sends 3 bad messages, one oversized"
    )
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
    sys.exit(main())
