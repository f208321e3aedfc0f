"""The transport: wire encoding, the simulator's clock, faults and object
caches, and MPITransport with run_worker over real `mpiexec` jobs."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import random
import signal
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx.errors import DispatchError
from dispatchtx.launch import kill_job, run_job, start_job
from dispatchtx.transport import (
    SIM_FAULTS,
    MalformedMessage,
    Result,
    SendFailed,
    SendHandle,
    SimFaults,
    SimulatedTransport,
    Stop,
    Transport,
    TransportClosed,
    UnencodableMessage,
    UnknownWorker,
    Work,
    WorkerObjects,
    decode,
    decode_result,
    decode_work,
    encode,
    run_task,
)

from support import require_mpi

OBJECT_ID = "a" * 64
OTHER_ID = "b" * 64


# ---------------------------------------------------------------- encoding


RESULTS = [
    Result(0, "", 0, b"", 0.0),
    Result(1 << 40 | 7, "item-7", 12345, b"\x00\xff" * 100, 0.25),
    Result(-5, "ünïcode ✓", -(2**63), b"r", 1e-9, "KeyError: 'x'"),
    Result(2**63 - 1, "i" * 5000, 2**63 - 1, bytes(range(256)) * 300, 3600.0),
]

WORKS = [
    Work(0, "", 0, None, {}),
    Work(1, "item-1", 3, b"raw payload", {OBJECT_ID: b"content " * 100}),
    Work(2, "item-2", 5, "text payload ✓", {OBJECT_ID: b"", OTHER_ID: b"\x00" * 70000}),
    Work(3, "item-3", 7, ("tuple", 1, [2.5, None], {"k": b"v"}), {}),
    Work(4, "item-4", 9, bytearray(b"kept as bytearray"), {}),
    Work(5, "item-5", 11, "", {}),
    Work(6, "item-6", 13, b"", {}),
]


@pytest.mark.parametrize("result", RESULTS)
def test_result_round_trip(result: Result) -> None:
    data = encode(result)
    assert decode_result(data) == result
    assert decode(data) == result
    assert decode_result(bytearray(data)) == result
    assert decode_result(memoryview(data)) == result


@pytest.mark.parametrize("work", WORKS)
def test_work_round_trip_keeps_payload_type(work: Work) -> None:
    data = encode(work)
    decoded = decode_work(data)
    assert decoded == work
    assert type(decoded.payload) is type(work.payload)
    assert decode(bytearray(data)) == work


def test_stop_round_trip() -> None:
    assert decode(encode(Stop())) == Stop()


def test_result_ok_says_whether_the_task_ran_clean() -> None:
    assert Result(1, "i", 1, b"x", 0.0).ok
    assert not Result(1, "i", 1, b"", 0.0, "ValueError: no").ok


@pytest.mark.parametrize("message", [*RESULTS[1:3], *WORKS[1:4], Stop()])
def test_every_truncation_is_a_clear_malformed_message(message: Work | Result | Stop) -> None:
    data = encode(message)
    for cut in range(len(data)):
        with pytest.raises(MalformedMessage) as caught:
            decode(data[:cut])
        assert isinstance(caught.value, DispatchError)
        assert str(caught.value).startswith("malformed dispatchtx message: ")


def test_trailing_bytes_are_malformed() -> None:
    for message in (RESULTS[1], WORKS[1], Stop()):
        with pytest.raises(MalformedMessage, match=r"trailing|lengths say|extra byte"):
            decode(encode(message) + b"\x00")


def test_a_message_of_the_wrong_kind_is_malformed() -> None:
    with pytest.raises(MalformedMessage, match="expected a Result message, got a Work message"):
        decode_result(encode(WORKS[1]))
    with pytest.raises(MalformedMessage, match="expected a Work message, got a Result message"):
        decode_work(encode(RESULTS[1]))
    with pytest.raises(MalformedMessage, match="expected a Result message, got a Stop message"):
        decode_result(encode(Stop()))


@pytest.mark.parametrize("value", ["a str", 12, None, 3.5, [1, 2], Result(1, "i", 1, b"", 0)])
def test_a_non_bytes_value_is_malformed(value: object) -> None:
    with pytest.raises(MalformedMessage, match="expected bytes, got"):
        decode(value)  # type: ignore[arg-type]
    with pytest.raises(MalformedMessage, match="expected bytes, got"):
        decode_result(value)  # type: ignore[arg-type]


def _with_byte(data: bytes, index: int, value: int) -> bytes:
    return data[:index] + bytes([value]) + data[index + 1 :]


def test_header_damage_is_named() -> None:
    result = encode(RESULTS[1])
    with pytest.raises(MalformedMessage, match="bad magic byte 0x00"):
        decode_result(_with_byte(result, 0, 0))
    with pytest.raises(MalformedMessage, match="wire version 9"):
        decode_result(_with_byte(result, 1, 9))
    with pytest.raises(MalformedMessage, match="unknown message kind 77"):
        decode(_with_byte(result, 2, 77))
    with pytest.raises(MalformedMessage, match="bad magic"):
        decode(b"garbage that is long enough to hold any header at all...")
    with pytest.raises(MalformedMessage, match="shorter than the 3-byte prefix"):
        decode(b"")


def _result_bytes(cpu: float = 0.5, item: bytes = b"item", error: bytes = b"") -> bytes:
    head = struct.pack("<BBBqqdIII", 0xD7, 1, 2, 1, 2, cpu, len(item), 1, len(error))
    return head + item + b"r" + error


def test_result_field_damage_is_named() -> None:
    assert decode_result(_result_bytes()) == Result(1, "item", 2, b"r", 0.5)
    for cpu in (math.nan, math.inf, -1.0):
        with pytest.raises(MalformedMessage, match="cpu_seconds"):
            decode_result(_result_bytes(cpu=cpu))
    with pytest.raises(MalformedMessage, match="not valid UTF-8"):
        decode_result(_result_bytes(item=b"\xff\xfe"))
    with pytest.raises(MalformedMessage, match="not valid UTF-8"):
        decode_result(_result_bytes(error=b"\xc3"))


def _work_bytes(
    payload_kind: int = 1,
    payload: bytes = b"p",
    objects: list[tuple[bytes, bytes]] | None = None,
    item: bytes = b"item",
) -> bytes:
    objects = objects or []
    head = struct.pack(
        "<BBBqqIBII", 0xD7, 1, 1, 1, 2, len(item), payload_kind, len(payload), len(objects)
    )
    body = b"".join(struct.pack("<HI", len(i), len(c)) + i + c for i, c in objects)
    return head + item + payload + body


def test_work_field_damage_is_named() -> None:
    assert decode_work(_work_bytes()) == Work(1, "item", 2, b"p", {})
    with pytest.raises(MalformedMessage, match="unknown payload kind 9"):
        decode_work(_work_bytes(payload_kind=9))
    with pytest.raises(MalformedMessage, match="does not unpickle"):
        decode_work(_work_bytes(payload_kind=3, payload=b"\x80\x05not a pickle"))
    with pytest.raises(MalformedMessage, match="str payload is not valid UTF-8"):
        decode_work(_work_bytes(payload_kind=2, payload=b"\xff"))
    with pytest.raises(MalformedMessage, match="a None payload with 1 byte"):
        decode_work(_work_bytes(payload_kind=0, payload=b"x"))
    with pytest.raises(MalformedMessage, match="appears twice"):
        decode_work(_work_bytes(objects=[(b"id", b"1"), (b"id", b"2")]))
    with pytest.raises(MalformedMessage, match="object id 0 is not valid UTF-8"):
        decode_work(_work_bytes(objects=[(b"\xff", b"1")]))
    with pytest.raises(MalformedMessage, match="the item is not valid UTF-8"):
        decode_work(_work_bytes(item=b"\xc3("))


def test_seeded_garbage_never_escapes_as_another_error() -> None:
    rng = random.Random(7)
    messages: list[Work | Result | Stop] = [*RESULTS, *WORKS, Stop()]
    valid = [encode(message) for message in messages]
    for _ in range(3000):
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(80)))
        else:
            # Keep a valid prefix, so the decoder gets past the header checks.
            base = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(1, 4)):
                if base:
                    base[rng.randrange(len(base))] = rng.randrange(256)
            data = bytes(base)
        try:
            decoded = decode(data)
        except MalformedMessage:
            continue
        assert isinstance(decoded, Work | Result | Stop)  # damage that still parses


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_malformed(data: bytes) -> None:
    for decoder in (decode, decode_result, decode_work):
        with contextlib.suppress(MalformedMessage):
            decoder(data)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=40),
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=300),
    st.floats(min_value=0.0, allow_infinity=False, allow_nan=False),
    st.text(max_size=40),
)
def test_result_round_trips_for_any_fields(
    dispatch_id: int, item: str, token: int, output: bytes, cpu: float, error: str
) -> None:
    result = Result(dispatch_id, item, token, output, cpu, error)
    assert decode_result(encode(result)) == result


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=30),
    st.one_of(st.none(), st.binary(max_size=50), st.text(max_size=50), st.integers()),
    st.dictionaries(st.text(max_size=70), st.binary(max_size=100), max_size=4),
)
def test_work_round_trips_for_any_fields(
    item: str, payload: object, objects: dict[str, bytes]
) -> None:
    work = Work(3, item, 4, payload, objects)
    assert decode_work(encode(work)) == work


@pytest.mark.parametrize(
    "message",
    [
        Result(1, "i", 2**63, b"", 0.0),
        Result(1, "i", 1, "not bytes", 0.0),  # type: ignore[arg-type]
        Result(1, "i", 1, b"", math.nan),
        Result(1, "i", 1, b"", -0.5),
        Result(1, "\udcff", 1, b"", 0.0),
        Work(-(2**63) - 1, "i", 1, None, {}),
        Work(1, "i", 1, lambda: None, {}),
        Work(1, "i", 1, None, {"id": "not bytes"}),  # type: ignore[dict-item]
        Work(1, "i", 1, None, {"x" * 70000: b""}),
        Work(1, 5, 1, None, {}),  # type: ignore[arg-type]
        "not a message",
    ],
)
def test_unencodable_messages_raise_a_clear_error(message: object) -> None:
    with pytest.raises(UnencodableMessage) as caught:
        encode(message)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError | DispatchError)


class RefusesToPickle:
    def __reduce__(self) -> str:
        raise RuntimeError("injected: this object cannot be pickled")


def nested(depth: int) -> list[object]:
    outer: list[object] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return outer


@pytest.mark.parametrize("payload", [RefusesToPickle(), nested(100_000)], ids=["reduce", "deep"])
def test_a_payload_that_does_not_pickle_is_unencodable_not_a_bare_error(payload: object) -> None:
    with pytest.raises(UnencodableMessage, match=r"dispatch 7: its \w+ payload does not pickle"):
        encode(Work(7, "i", 1, payload, {}))


def test_a_dispatch_whose_payload_does_not_pickle_is_compensated_and_the_run_goes_on() -> None:
    from dispatchtx.coordinator import Coordinator, CoordinatorConfig
    from dispatchtx.fs import SimulatedClock, SimulatedFS
    from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
    from dispatchtx.store import WorkStore

    class OnePoisonedPayload(HashWorkload):
        poisoned = False

        def reserve(self, txn: Any, worker: int, work_id: str) -> tuple[object, list[str]]:
            payload, objects = super().reserve(txn, worker, work_id)
            if not self.poisoned:
                self.poisoned = True
                return RefusesToPickle(), objects
            return payload, objects

    workload = OnePoisonedPayload(6)
    store = WorkStore(SimulatedFS(), "/store", SimulatedClock(), ttl=5.0)
    coordinator = Coordinator(
        CoordinatorConfig("coord-a"), SimulatedTransport(2, hash_task), store, workload
    )
    coordinator.run(max_steps=10_000)
    assert coordinator.stats["dispatch failures"] == 1
    assert coordinator.stats["committed"] == 6 and workload.remaining() == 0
    coordinator.shutdown()
    assert coordinator.leaks() == []


def test_the_coordinator_side_decoder_never_unpickles() -> None:
    # A pickled payload is a Work feature only; a Result has no pickled part,
    # so a hostile worker's bytes cannot run code on the coordinator.
    evil = pickle.dumps(Result(1, "i", 1, b"", 0.0))
    with pytest.raises(MalformedMessage):
        decode_result(evil)


# ------------------------------------------------------- the worker's code


def _object_task(work: Work, objects: Mapping[str, bytes]) -> bytes:
    """Reads the object the payload names: fails on a cache miss."""
    assert isinstance(work.payload, str)
    return objects[work.payload][::-1] + work.item.encode()


def test_run_task_keeps_objects_and_answers_with_cpu_time() -> None:
    cache = WorkerObjects()
    ticks = iter([10.0, 10.75, 20.0, 20.5])
    first = run_task(
        Work(1, "i1", 7, OBJECT_ID, {OBJECT_ID: b"abc"}),
        cache,
        _object_task,
        cpu_clock=ticks.__next__,
    )
    assert first == Result(1, "i1", 7, b"cbai1", 0.75)
    # The second Work names the object only: the cache answers.
    second = run_task(
        Work(2, "i2", 8, OBJECT_ID, {}), cache, _object_task, cpu_clock=ticks.__next__
    )
    assert second == Result(2, "i2", 8, b"cbai2", 0.5)
    assert cache.received == 1 and OBJECT_ID in cache and len(cache) == 1


def test_run_task_answers_a_failing_task_with_its_error() -> None:
    cache = WorkerObjects()
    missing = run_task(Work(1, "i", 2, OBJECT_ID, {}), cache, _object_task)
    assert missing.result == b"" and missing.error.startswith("KeyError")
    assert not missing.ok and missing.cpu_seconds >= 0.0

    def wrong_type(work: Work, objects: Mapping[str, bytes]) -> bytes:
        return "text"  # type: ignore[return-value]

    bad = run_task(Work(2, "i", 2, None, {}), cache, wrong_type)
    assert bad.error == "TypeError: task_fn returned str, not bytes"
    assert decode_result(encode(bad)) == bad


def test_the_task_sees_a_read_only_cache() -> None:
    def vandal(work: Work, objects: Mapping[str, bytes]) -> bytes:
        objects[OBJECT_ID] = b"overwritten"  # type: ignore[index]
        return b""

    cache = WorkerObjects()
    result = run_task(Work(1, "i", 1, None, {OBJECT_ID: b"kept"}), cache, vandal)
    assert result.error.startswith("TypeError")
    assert cache.view[OBJECT_ID] == b"kept"


# ------------------------------------------------------------ the simulator


def _echo_task(work: Work, objects: Mapping[str, bytes]) -> bytes:
    return f"{work.item}:{work.payload}".encode()


def _work(
    dispatch_id: int, payload: object = None, objects: dict[str, bytes] | None = None
) -> Work:
    return Work(dispatch_id, f"item-{dispatch_id}", 100 + dispatch_id, payload, objects or {})


def _drain(
    sim: SimulatedTransport, step: float = 1.0, limit: int = 10_000
) -> list[tuple[int, Result | bytes]]:
    """Everything that will ever arrive."""
    arrived: list[tuple[int, Result | bytes]] = []
    for _ in range(limit):
        if not sim.pending_events():
            break
        arrived += sim.poll(step)
    assert not sim.pending_events()
    return arrived


def _results(arrived: list[tuple[int, Result | bytes]]) -> list[Result]:
    return [message for _, message in arrived if isinstance(message, Result)]


def test_the_simulator_is_a_transport() -> None:
    sim = SimulatedTransport(2, _echo_task)
    assert isinstance(sim, Transport)
    assert sim.n_workers == 2


def test_virtual_time_moves_only_in_poll() -> None:
    sim = SimulatedTransport(1, _echo_task, latency=0.01, task_seconds=0.5)
    sim.send(0, _work(1, "x"))
    assert sim.now() == 0.0
    assert sim.poll(0.2) == [] and sim.now() == pytest.approx(0.2)
    # The next poll stops at the delivery, not at its timeout.
    started = time.monotonic()
    arrived = sim.poll(3600.0)
    assert time.monotonic() - started < 1.0  # virtual hours take no wall time
    assert sim.now() == pytest.approx(0.52)
    assert arrived == [(0, Result(1, "item-1", 101, b"item-1:x", 0.5))]
    assert sim.poll(5.0) == [] and sim.now() == pytest.approx(5.52)
    with pytest.raises(ValueError, match="timeout"):
        sim.poll(-1.0)
    with pytest.raises(ValueError, match="timeout"):
        sim.poll(math.inf)


def test_workers_run_their_queue_in_order_one_at_a_time() -> None:
    sim = SimulatedTransport(2, _echo_task, latency=0.0, task_seconds=1.0)
    for dispatch_id in range(3):
        sim.send(0, _work(dispatch_id))
    sim.send(1, _work(9))
    arrivals = []
    while sim.pending_events():
        for worker, message in sim.poll(10.0):
            assert isinstance(message, Result)
            arrivals.append((sim.now(), worker, message.dispatch_id))
    assert arrivals == [(1.0, 0, 0), (1.0, 1, 9), (2.0, 0, 1), (3.0, 0, 2)]


def _workload(seed: int, faults: SimFaults, n: int = 400) -> tuple[object, ...]:
    sim = SimulatedTransport(
        4,
        _echo_task,
        seed=seed,
        faults=faults,
        jitter=0.002,
        slow_workers={3: 4.0},
        record_trace=True,
    )
    arrived: list[tuple[float, int, object]] = []
    failures = 0
    handles: list[SendHandle] = []
    for dispatch_id in range(n):
        try:
            if dispatch_id % 2:
                handles.append(sim.isend(dispatch_id % 4, _work(dispatch_id, dispatch_id)))
            else:
                sim.send(dispatch_id % 4, _work(dispatch_id, dispatch_id))
        except SendFailed:
            failures += 1
        for worker, message in sim.poll(0.0005):
            arrived.append((sim.now(), worker, message))
        for handle in list(handles):
            try:
                if sim.test(handle):
                    handles.remove(handle)
            except SendFailed:
                failures += 1
                handles.remove(handle)
        for worker in sim.take_lost_workers():
            sim.revive(worker)
    while sim.pending_events():
        for worker, message in sim.poll(1.0):
            arrived.append((sim.now(), worker, message))
    return tuple(sim.trace or ()), tuple(arrived), failures, dict(sim.stats)


EVERY_FAULT = SimFaults(
    send_failure=0.03,
    ambiguous_send=0.03,
    delay=0.03,
    loss=0.03,
    duplicate=0.03,
    reorder=0.03,
    stale=0.03,
    garble=0.03,
    crash=0.01,
    stale_seconds=2.0,
)


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    first = _workload(11, EVERY_FAULT)
    assert first == _workload(11, EVERY_FAULT)
    assert first[0] != _workload(12, EVERY_FAULT)[0]
    # With every fault on, every fault fired (the seed is fixed: no flakes).
    stats = first[3]
    assert isinstance(stats, dict)
    assert all(stats[fault] > 0 for fault in SIM_FAULTS), stats


def test_fault_counts_add_up() -> None:
    *_, stats = _workload(5, EVERY_FAULT, n=1000)
    assert isinstance(stats, dict)
    # Every finished task is delivered once, unless lost, plus its duplicate.
    assert stats["delivered"] == stats["tasks_run"] - stats["loss"] + stats["duplicate"]
    # A garbled result that is also duplicated arrives garbled twice.
    assert stats["garble"] <= stats["malformed_delivered"] <= stats["garble"] + stats["duplicate"]
    # Every send was decided once: sent, failed, or failed after delivery.
    assert stats["sent"] + stats["isent"] == 1000


def test_no_fault_fires_unless_enabled() -> None:
    *_, stats = _workload(3, SimFaults())
    assert isinstance(stats, dict)
    assert {fault: stats[fault] for fault in SIM_FAULTS} == {
        **dict.fromkeys(SIM_FAULTS, 0),
        "slow": stats["slow"],
    }
    assert stats["slow"] == 100  # worker 3 got every fourth of the 400 tasks


def _one_round_trip(
    sim: SimulatedTransport, dispatch_id: int = 1
) -> list[tuple[int, Result | bytes]]:
    sim.send(0, _work(dispatch_id, "p"))
    return _drain(sim)


def test_send_failure_raises_and_delivers_nothing() -> None:
    sim = SimulatedTransport(1, _echo_task)
    sim.force("send_failure")
    with pytest.raises(SendFailed, match="not delivered"):
        sim.send(0, _work(1))
    assert _drain(sim) == [] and sim.stats["send_failure"] == 1 and sim.stats["tasks_run"] == 0


def test_ambiguous_send_raises_but_the_worker_answers() -> None:
    sim = SimulatedTransport(1, _echo_task)
    sim.force("ambiguous_send")
    with pytest.raises(SendFailed, match="ambiguous"):
        sim.send(0, _work(1))
    assert [m.dispatch_id for m in _results(_drain(sim))] == [1]
    assert sim.stats["ambiguous_send"] == 1


def test_isend_failures_show_at_test() -> None:
    sim = SimulatedTransport(1, _echo_task, latency=0.01)
    clean = sim.isend(0, _work(1))
    sim.force("send_failure")
    lost = sim.isend(0, _work(2))
    sim.force("ambiguous_send")
    ambiguous = sim.isend(0, _work(3))
    assert not sim.test(clean) and not sim.test(lost) and not sim.test(ambiguous)
    arrived = _drain(sim)
    assert sim.test(clean) and sim.test(clean)
    for handle in (lost, ambiguous):
        for _ in range(2):  # the outcome stays what it was
            with pytest.raises(SendFailed):
                sim.test(handle)
    # The failed one never arrived; the ambiguous one did.
    assert sorted(m.dispatch_id for m in _results(arrived)) == [1, 3]
    other = SimulatedTransport(1, _echo_task)
    with pytest.raises(ValueError, match="not a send of this transport"):
        other.test(clean)


def test_delay_makes_a_message_late() -> None:
    def arrival(force: bool) -> float:
        sim = SimulatedTransport(
            1, _echo_task, latency=0.001, task_seconds=0.01, faults=SimFaults(delay_seconds=0.3)
        )
        if force:
            sim.force("delay")
        _one_round_trip(sim)
        assert sim.stats["delay"] == int(force)
        return sim.now()

    assert arrival(True) == pytest.approx(arrival(False) + 0.3)


def test_loss_delivers_nothing() -> None:
    sim = SimulatedTransport(1, _echo_task)
    sim.force("loss")
    assert _one_round_trip(sim) == []
    assert sim.stats["loss"] == 1 and sim.stats["tasks_run"] == 1


def test_duplicate_delivers_twice() -> None:
    sim = SimulatedTransport(1, _echo_task)
    sim.force("duplicate")
    results = _results(_one_round_trip(sim))
    assert len(results) == 2 and results[0] == results[1]
    assert sim.stats["duplicate"] == 1


def test_reorder_lets_a_later_result_overtake() -> None:
    sim = SimulatedTransport(2, _echo_task, latency=0.0, task_seconds=0.001)
    sim.force("reorder")
    sim.send(0, _work(1))
    sim.send(1, _work(2))  # finishes at the same instant, is decided second
    order = [m.dispatch_id for m in _results(_drain(sim, step=0.0001))]
    assert order == [2, 1]
    assert sim.stats["reorder"] == 1


def test_stale_answer_arrives_long_after() -> None:
    sim = SimulatedTransport(1, _echo_task, faults=SimFaults(stale_seconds=120.0))
    sim.force("stale")
    sim.send(0, _work(1))
    assert sim.poll(60.0) == []
    arrived = _results(sim.poll(100.0))
    assert [m.dispatch_id for m in arrived] == [1] and sim.now() > 120.0
    assert sim.stats["stale"] == 1


def test_garbled_result_arrives_as_raw_bytes() -> None:
    sim = SimulatedTransport(1, _echo_task)
    sim.force("garble")
    ((worker, message),) = _one_round_trip(sim)
    assert worker == 0 and isinstance(message, bytes)
    with pytest.raises(MalformedMessage):
        decode_result(message)
    assert sim.stats["garble"] == 1 and sim.stats["malformed_delivered"] == 1


def test_slow_worker_takes_its_factor_longer() -> None:
    sim = SimulatedTransport(2, _echo_task, latency=0.0, task_seconds=0.1, slow_workers={1: 5.0})
    sim.send(0, _work(1))
    sim.send(1, _work(2))
    times = {}
    while sim.pending_events():
        for _, message in sim.poll(1.0):
            assert isinstance(message, Result)
            times[message.dispatch_id] = (sim.now(), message.cpu_seconds)
    assert times[1] == pytest.approx((0.1, 0.1))
    assert times[2] == pytest.approx((0.5, 0.5))
    assert sim.stats["slow"] == 1


def test_crash_stops_answering_drops_the_cache_and_is_reported() -> None:
    sim = SimulatedTransport(2, _object_task, latency=0.0, task_seconds=1.0)
    sim.send(0, Work(1, "i1", 1, OBJECT_ID, {OBJECT_ID: b"xyz"}))
    sim.send(0, Work(2, "i2", 2, OBJECT_ID, {}))  # queued behind the first
    assert [m.dispatch_id for m in _results(sim.poll(1.0))] == [1]
    assert sim.cached_objects(0) == {OBJECT_ID}
    sim.force("crash")
    sim.send(1, Work(3, "i3", 3, OBJECT_ID, {OBJECT_ID: b"xyz"}))  # worker 1 crashes on it
    assert sim.poll(0.0) == [] and sim.is_crashed(1)
    sim.crash(0)  # worker 0 crashes while running dispatch 2
    assert sim.stats["crash"] == 2
    assert sorted(sim.take_lost_workers()) == [0, 1]
    assert sim.take_lost_workers() == []  # reported once
    assert sim.cached_objects(0) == frozenset() and sim.is_crashed(0)
    sim.send(0, Work(4, "i4", 4, OBJECT_ID, {}))  # into the void, as to a hung rank
    assert _drain(sim) == []
    assert sim.stats["dropped_by_crashed"] == 1
    # Revived, it is empty: a Work that only names the object now misses.
    sim.revive(0)
    assert not sim.is_crashed(0)
    sim.send(0, Work(5, "i5", 5, OBJECT_ID, {}))
    (missed,) = _results(_drain(sim))
    assert missed.dispatch_id == 5 and missed.error.startswith("KeyError")
    sim.send(0, Work(6, "i6", 6, OBJECT_ID, {OBJECT_ID: b"xyz"}))
    (fixed,) = _results(_drain(sim))
    assert fixed.ok and fixed.result == b"zyxi6"


def test_crash_can_go_unreported_like_a_hang() -> None:
    sim = SimulatedTransport(1, _echo_task, report_crashes=False)
    sim.force("crash")
    assert _one_round_trip(sim) == []
    assert sim.stats["crash"] == 1 and sim.take_lost_workers() == []


def test_object_content_is_sent_once_and_reused_by_id() -> None:
    sim = SimulatedTransport(2, _object_task)
    sim.send(0, Work(1, "i1", 1, OBJECT_ID, {OBJECT_ID: b"abc", OTHER_ID: b"def"}))
    for dispatch_id in range(2, 6):
        sim.send(0, Work(dispatch_id, f"i{dispatch_id}", 1, OBJECT_ID, {}))
    sim.send(1, Work(9, "i9", 1, OBJECT_ID, {}))  # the other worker never got it
    results = {m.dispatch_id: m for m in _results(_drain(sim))}
    assert all(results[i].result == b"cba" + f"i{i}".encode() for i in range(1, 6))
    assert results[9].error.startswith("KeyError")
    assert sim.objects_received(0) == 2 and sim.objects_received(1) == 0
    assert sim.cached_objects(0) == {OBJECT_ID, OTHER_ID}


def test_a_failed_first_transfer_leaves_the_content_to_send_again() -> None:
    # docs/design.md point 5: the worker never got the content, so the next
    # dispatch must carry it (the coordinator marks it held only after send).
    sim = SimulatedTransport(1, _object_task)
    sim.force("send_failure")
    with pytest.raises(SendFailed):
        sim.send(0, Work(1, "i1", 1, OBJECT_ID, {OBJECT_ID: b"abc"}))
    assert _drain(sim) == [] and sim.cached_objects(0) == frozenset()
    sim.send(0, Work(2, "i2", 1, OBJECT_ID, {OBJECT_ID: b"abc"}))
    (result,) = _results(_drain(sim))
    assert result.ok and sim.cached_objects(0) == {OBJECT_ID}


def test_stop_lets_queued_work_finish_and_refuses_later_work() -> None:
    sim = SimulatedTransport(1, _echo_task, latency=0.001, task_seconds=0.1)
    sim.send(0, _work(1))
    sim.send(0, _work(2))
    sim.stop_workers()
    sim.stop_workers()  # once is enough
    sim.send(0, _work(3))
    assert sorted(m.dispatch_id for m in _results(_drain(sim))) == [1, 2]
    assert sim.stats["dropped_after_stop"] == 1 and sim.stats["stop_sent"] == 1


def test_closed_and_misused_simulator_raise_clear_errors() -> None:
    sim = SimulatedTransport(2, _echo_task)
    with pytest.raises(UnknownWorker, match=r"worker 2 is not in 0\.\.1"):
        sim.send(2, _work(1))
    with pytest.raises(UnencodableMessage):
        sim.send(0, Work(1, "i", 1, lambda: None, {}))
    with pytest.raises(ValueError, match="unknown fault"):
        sim.force("meteor")
    with pytest.raises(ValueError, match="probability"):
        SimFaults(loss=1.5)
    with pytest.raises(ValueError, match="slow_workers"):
        SimulatedTransport(2, _echo_task, slow_workers={5: 2.0})
    assert sim.stats["sent"] == 0  # nothing that raised before sending counts as sent
    with sim:
        pass
    with pytest.raises(SendFailed, match="closed"):
        sim.send(0, _work(1))
    with pytest.raises(TransportClosed):
        sim.poll(0.0)


# ------------------------------------------------------------- real MPI


def _run_self_test(ranks: int, report: Path, *args: str) -> dict[str, object]:
    code = run_job(
        ranks, "dispatchtx.jobs.transport_selftest", ["--report", str(report), *args], timeout=60.0
    )
    assert code != 124, "the MPI job hung and was killed"
    assert report.exists(), f"the job exited {code} without a report"
    loaded: dict[str, object] = json.loads(report.read_text())
    assert code == 0 and loaded["passed"] is True, loaded
    return loaded


def _kill_leftovers(marker: str) -> None:
    """SIGKILL, by pid, any rank of our own job that outlived its group."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


@pytest.fixture
def job_report(tmp_path: Path) -> Iterator[Path]:
    """Where the job writes its report; its path also marks the job's ranks."""
    report = tmp_path / "mpi-report.json"
    yield report
    _kill_leftovers(str(report))


@pytest.mark.parametrize("ranks", [3, 5])
def test_mpi_pipelined_round_trips_all_come_back_correct(ranks: int, job_report: Path) -> None:
    require_mpi()
    report = _run_self_test(
        ranks,
        job_report,
        "--round-trips",
        "400",
        "--in-flight",
        "4",
        "--garbage",
        "--idle-seconds",
        "1.0",
    )
    assert report["correct"] == 400 and report["wrong"] == 0 and report["unknown"] == 0
    # Several Work were outstanding per worker at once.
    seen = report["most_in_flight_seen"]
    assert isinstance(seen, list) and len(seen) == ranks - 1 and min(seen) >= 2, seen
    # Worker 0's undecodable messages were counted and dropped, not fatal; the
    # one over max_result_bytes was never received into a buffer of its size.
    assert report["malformed"] == 3
    stats = report["transport_stats"]
    assert isinstance(stats, dict) and stats["oversized"] == 1
    # Idle ranks back off instead of spinning: a spinning rank would use all
    # of its share of the 2 cores.
    assert isinstance(report["coordinator_idle_cpu_seconds"], float)
    assert report["coordinator_idle_cpu_seconds"] < 0.3
    workers = report["workers"]
    assert isinstance(workers, dict) and len(workers) == ranks - 1
    for summary in workers.values():
        assert summary["task_errors"] == 0
        assert summary["objects_received"] <= 8  # each object shipped once per worker
        assert summary["cpu_seconds"] < 0.3 * summary["wall_seconds"], summary


def test_mpi_hung_worker_is_found_by_deadline_and_its_work_redone(job_report: Path) -> None:
    require_mpi()
    # Worker 1 SIGSTOPs itself on its third Work. The job can never end by
    # itself (the stopped rank never finalizes): read the report, then kill
    # the job's process group.
    job = start_job(
        3,
        "dispatchtx.jobs.transport_selftest",
        [
            "--round-trips",
            "120",
            "--hang-worker",
            "1",
            "--hang-after",
            "3",
            "--deadline",
            "1.5",
            "--send-timeout",
            "0.5",
            "--report",
            str(job_report),
        ],
    )
    try:
        deadline = time.monotonic() + 60.0
        while not job_report.exists() and time.monotonic() < deadline:
            assert job.poll() is None or job_report.exists(), "the job ended without a report"
            time.sleep(0.05)
        assert job_report.exists(), "no report within 60 s"
    finally:
        kill_job(job)
        job.wait(timeout=30)
    report = json.loads(job_report.read_text())
    assert report["passed"] is True, report
    assert report["lost_workers"] == [1]
    assert report["correct"] == 120
    assert report["redispatched"] >= 1  # what the hung worker held was redone
    assert report["hung_send_timed_out"] is True  # a big send to it did not block forever
