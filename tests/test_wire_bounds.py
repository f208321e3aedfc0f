"""Decoding a Work is bounded: whatever the bytes, the decoder allocates at
most a bounded multiple of the message's size and raises `MalformedMessage`,
never another error (the C unpickler, left alone, allocates what a length
field announces before it reads a byte)."""

from __future__ import annotations

import contextlib
import functools
import pickle
import struct
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx.transport import MalformedMessage, Work, decode_work, encode

# Bounded: a decoded object may well be larger than its pickle (a list of
# small ints), but by a factor, never by what a corrupt length announces.
FACTOR = 64
SLACK = 256 * 1024


def peak_of(decode: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        with contextlib.suppress(MalformedMessage):
            decode()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def work_with(payload_pickle: bytes) -> bytes:
    """A Work on the wire whose pickled payload is `payload_pickle`, as is."""
    template = encode(Work(1, "item", 2, ["a list", "to be pickled"], {}))
    head = struct.Struct("<BBBqqIBII")
    fields = list(head.unpack_from(template))
    fields[7] = len(payload_pickle)  # payload_len
    return head.pack(*fields) + b"item" + payload_pickle


PAYLOADS = [
    {"seed": 12345, "params": [1.5, 2.5, "x" * 20], "name": ("a", b"bb")},
    list(range(300)),
    [list(range(5))] * 40,
    {f"key-{i}": (i, float(i)) for i in range(30)},
    bytearray(b"mutable"),
    {1, 2, 3},
    frozenset({"a"}),
    2**200,
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: type(p).__name__)
def test_pickles_of_every_protocol_still_decode(payload: object, protocol: int) -> None:
    work = decode_work(work_with(pickle.dumps(payload, protocol)))
    assert work.payload == payload


@pytest.mark.parametrize("payload", PAYLOADS[:4], ids=lambda p: type(p).__name__)
def test_one_corrupted_byte_never_allocates_beyond_a_bound(payload: object) -> None:
    data = encode(Work(7, "item-1", 3, payload, {"obj-1": b"content" * 4}))
    worst = 0
    for index in range(len(data)):
        for value in {0x00, 0x7F, 0x80, 0xFF, data[index] ^ 0x01, data[index] ^ 0x40}:
            damaged = bytearray(data)
            damaged[index] = value
            worst = max(worst, peak_of(functools.partial(decode_work, bytes(damaged))))
    assert worst <= FACTOR * len(data) + SLACK


@pytest.mark.parametrize(
    "payload_pickle",
    [
        b"\x80\x05\x8e" + (2**40).to_bytes(8, "little") + b"xx.",  # BINBYTES8
        b"\x80\x05\x8d" + (2**28).to_bytes(8, "little") + b"xx.",  # BINUNICODE8
        b"\x80\x05\x96" + (2**33).to_bytes(8, "little") + b".",  # BYTEARRAY8
        b"\x80\x04B" + (2**31 - 1).to_bytes(4, "little") + b".",  # BINBYTES
        b"\x80\x02\x8b" + (2**31 - 1).to_bytes(4, "little") + b".",  # LONG4
        b"\x80\x04N" + b"r" + (2**31).to_bytes(4, "little") + b".",  # LONG_BINPUT
        b"\x80\x02Np99999999999\n.",  # PUT, a decimal index
        b"\x80\x04\x95" + (2**40).to_bytes(8, "little") + b"N.",  # FRAME
        b"\x80\x04j" + (5).to_bytes(4, "little") + b".",  # LONG_BINGET, never put
        b"\x80\x04N.trailing",
        b"\x80\x04N",  # no STOP
        b"\x80\x04\xff.",  # no such opcode
    ],
    ids=[
        "binbytes8",
        "binunicode8",
        "bytearray8",
        "binbytes",
        "long4",
        "long-binput",
        "put",
        "frame",
        "get-unset",
        "after-stop",
        "no-stop",
        "unknown-opcode",
    ],
)
def test_a_crafted_pickle_is_malformed_before_anything_is_allocated(payload_pickle: bytes) -> None:
    data = work_with(payload_pickle)
    assert len(data) < 64
    with pytest.raises(MalformedMessage, match="payload does not unpickle"):
        decode_work(data)
    assert peak_of(lambda: decode_work(data)) <= SLACK


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=120))
def test_any_pickled_payload_decodes_or_is_malformed_within_the_bound(body: bytes) -> None:
    data = work_with(b"\x80\x05" + body)
    assert peak_of(lambda: decode_work(data)) <= FACTOR * len(data) + SLACK


def test_a_result_decodes_in_place_from_a_receive_buffer() -> None:
    from dispatchtx.transport import Result, decode_result

    result = Result(9, "item-ü", 4, b"\x00result bytes" * 100, 0.25, "")
    data = encode(result)
    for buffer in (bytearray(data), memoryview(bytearray(data)), memoryview(data)):
        decoded = decode_result(buffer)
        assert decoded == result and type(decoded.result) is bytes
    strided = memoryview(bytearray(data * 2))[::2]  # not contiguous: copied, then read
    with pytest.raises(MalformedMessage):
        decode_result(strided)
    damaged = bytearray(data)
    damaged[0] = 0
    with pytest.raises(MalformedMessage, match="bad magic byte"):
        decode_result(damaged)
    with pytest.raises(MalformedMessage, match="expected bytes"):
        decode_result("a str")  # type: ignore[arg-type]


def test_memoize_after_a_put_takes_the_memos_length_as_the_unpicklers_do() -> None:
    # PUT 5, then MEMOIZE: both unpicklers put the second value at 1 (the
    # memo's length), so GET 1 is good and gets that value.
    body = b"\x80\x04K\x07p5\nK\x08\x94\x86\x94h\x01\x86."
    assert pickle.loads(body) == ((7, 8), 8)
    assert decode_work(work_with(body)).payload == ((7, 8), 8)
