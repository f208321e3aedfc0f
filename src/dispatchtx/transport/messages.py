"""The messages between a coordinator and its workers, their wire encoding,
and the transport's errors.

Every message starts with a magic byte, a version and a kind, then a fixed
header, then its variable parts; a decoder checks every length against the
buffer. A Work payload is None, bytes or str as such, anything else
pickled; a Result has no pickled part at all.
"""

from __future__ import annotations

import math
import pickle
import pickletools
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeAlias, final

from dispatchtx.errors import DispatchError

if TYPE_CHECKING:
    pass


__all__ = [
    "MalformedMessage",
    "Message",
    "Result",
    "SendFailed",
    "SendTimeout",
    "Stop",
    "TaskFn",
    "TransportClosed",
    "TransportError",
    "UnencodableMessage",
    "UnknownWorker",
    "Work",
    "decode",
    "decode_result",
    "decode_work",
    "encode",
]


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
    """A send that raised. The coordinator treats it as not sent (docs/design.md
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
            kind, body = _PAYLOAD_PICKLE, _pickled(work.dispatch_id, payload)
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
    except UnencodableMessage:
        raise
    except (AttributeError, TypeError, ValueError, struct.error, pickle.PicklingError) as exc:
        raise UnencodableMessage(f"cannot encode {work!r:.200}: {exc}") from exc
    return b"".join(parts)


def _pickled(dispatch_id: object, payload: object) -> bytes:
    try:
        return pickle.dumps(payload, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # a __reduce__ that raises, nesting too deep to pickle, ...
        # Named by type only: the repr of what does not pickle may not work either.
        text = str(exc)[:200] if not isinstance(exc, RecursionError) else "nested too deep"
        raise UnencodableMessage(
            f"dispatch {dispatch_id!r}: its {type(payload).__name__} payload does not pickle "
            f"({type(exc).__name__}: {text})"
        ) from None


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    if type(data) is bytes:
        return data
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise MalformedMessage(f"expected bytes, got {type(data).__name__}")


def _as_view(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """A receive buffer as a flat byte view (no copy), other bytes as bytes."""
    if isinstance(data, bytearray | memoryview):
        view = memoryview(data)
        if view.c_contiguous:
            return view.cast("B")
    return _as_bytes(data)


def _check_prefix(data: bytes | memoryview, expected: int | None) -> int:
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
    """A Result from the wire, or `MalformedMessage` saying what is wrong.

    A bytearray or memoryview (a receive buffer) is read in place: the
    result's bytes are its one copy."""
    if type(data) is not bytes:
        data = _as_view(data)
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
        item = str(data[_RESULT_HEAD.size : item_end], "utf-8")
        error = str(data[result_end:], "utf-8") if error_len else ""
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"the item or error text is not valid UTF-8: {exc.reason}") from None
    # bytes() of a bytes slice is that slice; of a view, the one copy.
    return Result(dispatch_id, item, token, bytes(data[item_end:result_end]), cpu, error)


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
        _check_pickle(body)
        try:
            return pickle.loads(body)
        except Exception as exc:  # a bad pickle can raise nearly anything
            raise MalformedMessage(f"payload does not unpickle: {exc!r:.200}") from None
    raise MalformedMessage(f"unknown payload kind {kind}")


# The C unpickler allocates what a length field announces before it reads
# the bytes (one flipped byte of a 175-byte Work asked for 2.4 GB), and grows
# its memo to whatever index a PUT names. So a pickled payload is walked once
# first, opcode by opcode, without building any argument: every length is
# checked against the bytes that remain, a memo index put must lie below the
# payload's size and one got must have been put, a frame must fit, nothing
# may follow STOP. Then `pickle.loads` allocates a bounded multiple of the
# payload. (A payload format of our own with checked lengths would cost every
# user whose payload is an object of their own. What the walk leaves open is
# what pickle is by design, a payload naming callables the worker runs: so
# only workers unpickle, and only their coordinator's Work.)


def _argument_layouts() -> dict[int, tuple[int, int]]:
    """opcode byte -> (kind, size): kind 0 a fixed size, 1 a length prefix of
    `size` bytes (then that many bytes), 2 `size` newline-ended lines."""
    layouts = {}
    for opcode in pickletools.opcodes:
        code = ord(opcode.code.encode("latin-1"))
        arg = opcode.arg
        if arg is None:
            layouts[code] = (0, 0)
        elif arg.n >= 0:
            layouts[code] = (0, arg.n)
        elif arg.n == pickletools.UP_TO_NEWLINE:
            layouts[code] = (2, 2 if arg.name.endswith("_pair") else 1)
        else:
            prefix = {
                pickletools.TAKEN_FROM_ARGUMENT1: 1,
                pickletools.TAKEN_FROM_ARGUMENT4: 4,
                pickletools.TAKEN_FROM_ARGUMENT4U: 4,
                pickletools.TAKEN_FROM_ARGUMENT8U: 8,
            }[arg.n]
            layouts[code] = (1, prefix)
    return layouts


_LAYOUTS: Final = _argument_layouts()
_OP_STOP: Final = ord(".")
_OP_FRAME: Final = 0x95
_OP_MEMOIZE: Final = 0x94
_MEMO_PUTS: Final = frozenset(b"pqr")  # PUT, BINPUT, LONG_BINPUT
_MEMO_GETS: Final = frozenset(b"ghj")  # GET, BINGET, LONG_BINGET


def _unpicklable(reason: str) -> MalformedMessage:
    return MalformedMessage(f"payload does not unpickle: {reason}")


def _check_pickle(body: bytes) -> None:
    size = len(body)
    memo: set[int] = set()
    pos = 0
    layouts = _LAYOUTS
    while pos < size:
        code = body[pos]
        pos += 1
        layout = layouts.get(code)
        if layout is None:
            raise _unpicklable(f"unknown opcode 0x{code:02x} at {pos - 1}")
        kind, width = layout
        start = pos
        if kind == 0:
            pos += width
        elif kind == 1:
            length = int.from_bytes(body[pos : pos + width], "little", signed=width == 4)
            pos += width + length
            if length < 0:
                raise _unpicklable(f"a negative length at {start}")
        else:
            for _ in range(width):
                newline = body.find(b"\n", pos)
                if newline < 0:
                    raise _unpicklable(f"an unended line at {start}")
                pos = newline + 1
        if pos > size:
            raise _unpicklable(
                f"opcode 0x{code:02x} at {start - 1} needs {pos - size} "
                "byte(s) more than the payload has"
            )
        if code == _OP_STOP:
            if pos != size:
                raise _unpicklable(f"{size - pos} byte(s) after its STOP")
            return
        if code == _OP_MEMOIZE:  # both unpicklers put at the memo's length
            memo.add(len(memo))
        elif code == _OP_FRAME:
            if int.from_bytes(body[start:pos], "little") > size - pos:
                raise _unpicklable("a frame longer than the payload")
        elif code in _MEMO_PUTS or code in _MEMO_GETS:
            index = _memo_index(body, start, pos, line=kind == 2)
            if code in _MEMO_GETS:
                if index not in memo:
                    raise _unpicklable(f"memo index {index} never set")
            elif not 0 <= index < size:
                raise _unpicklable(f"memo index {index} out of range")
            else:
                memo.add(index)
    raise _unpicklable("no STOP")


def _memo_index(body: bytes, start: int, end: int, *, line: bool) -> int:
    if line:  # PUT and GET: a decimal line
        try:
            return int(body[start : end - 1])
        except ValueError:
            raise _unpicklable(f"a bad memo index at {start}") from None
    return int.from_bytes(body[start:end], "little")


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
