"""One fault vocabulary for the simulated disk, the fault-injecting wrapper,
the tests and the campaign: `Op` names an FS call, `Fault` (a `FaultKind`
plus `keep`) says what goes wrong, a `FaultHook` (such as a scripted
`DiskFaultPlan` of `FaultRule`s) picks the fault for each call, and a kill
raises `SimulatedCrash`, a BaseException. `_FaultPoints` is the part both
`SimulatedFS` and `FaultyFS` share: consult the hook, record what fired,
kill before or after a call.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import (
    Final,
    Literal,
    NamedTuple,
    NoReturn,
    TypeGuard,
)

__all__ = [
    "Call",
    "Fault",
    "FaultHook",
    "FaultKind",
    "FaultNotApplicable",
    "DiskFaultPlan",
    "FaultRule",
    "FiredFault",
    "Op",
    "SimulatedCrash",
]


# ---------------------------------------------------------------------------
# Fault descriptions: one vocabulary for SimulatedFS, FaultyFS, tests and the
# campaign (docs/design.md, fault point 6)
# ---------------------------------------------------------------------------


class Op(StrEnum):
    """The name of every call at which a fault can be injected. The handle
    operations (`APPEND` ... `CLOSE`) are the methods of an `AppendHandle`."""

    READ = "read"
    WRITE_TEMP = "write_temp"
    LINK = "link"
    RENAME = "rename"
    UNLINK = "unlink"
    MKDIR = "mkdir"
    FSYNC_DIR = "fsync_dir"
    LISTDIR = "listdir"
    EXISTS = "exists"
    OPEN_APPEND = "open_append"
    PWRITE = "pwrite"
    APPEND = "append"
    FSYNC = "fsync"
    TRUNCATE = "truncate"
    SIZE = "size"
    CLOSE = "close"


class FaultKind(Enum):
    """What goes wrong at one call.

    - `EIO`: the call raises `OSError(EIO)` without effect, except that in
      `SimulatedFS` an fsync that fails (`AppendHandle.fsync`, and the
      fsync inside `pwrite`) first drops the file's dirty pages: its content
      reverts to the durable one, as Linux does after a writeback error.
      A failed `fsync_dir` makes nothing durable.
    - `ENOSPC`: `OSError(ENOSPC)`. On `write_temp`, `append` and `pwrite`
      a prefix of the data lands first (`Fault.keep` bytes; by default half):
      `write_temp` leaves an orphan temp file holding that prefix, unsynced.
      Other calls that allocate fail without effect.
    - `SHORT_WRITE`: `append` writes only a prefix and returns its length,
      without an error (what a single `os.write` may do).
    - `ESTALE`: `OSError(ESTALE)` without effect (a peer's file deleted
      under an NFS handle).
    - `LOST_LINK_REPLY`: `link` succeeds, then raises `FileExistsError`
      (an NFS retransmission answered by the first attempt's effect).
    - `STALE_ABSENT`: `read` raises `FileNotFoundError` and `exists`
      returns False, although the file may be there (a cached negative
      look-up).
    - `KILL_BEFORE` / `KILL_AFTER`: the process dies before the call takes
      effect, or after it took effect but before its caller learns the
      outcome. `SimulatedFS` raises `SimulatedCrash`; `FaultyFS` runs its
      kill action (SIGKILL by default).
    """

    EIO = "eio"
    ENOSPC = "enospc"
    SHORT_WRITE = "short_write"
    ESTALE = "estale"
    LOST_LINK_REPLY = "lost_link_reply"
    STALE_ABSENT = "stale_absent"
    KILL_BEFORE = "kill_before"
    KILL_AFTER = "kill_after"


_ALL_OPS: Final = frozenset(Op)
# The calls whose data can land in part before ENOSPC (or a short write).
_PARTIAL_WRITE_OPS: Final = frozenset({Op.WRITE_TEMP, Op.APPEND, Op.PWRITE})
_APPLICABLE_OPS: Final[Mapping[FaultKind, frozenset[Op]]] = {
    FaultKind.EIO: _ALL_OPS,
    FaultKind.ESTALE: _ALL_OPS,
    FaultKind.KILL_BEFORE: _ALL_OPS,
    FaultKind.KILL_AFTER: _ALL_OPS,
    FaultKind.ENOSPC: _PARTIAL_WRITE_OPS | {Op.LINK, Op.RENAME, Op.MKDIR, Op.OPEN_APPEND},
    FaultKind.SHORT_WRITE: frozenset({Op.APPEND}),
    FaultKind.LOST_LINK_REPLY: frozenset({Op.LINK}),
    FaultKind.STALE_ABSENT: frozenset({Op.READ, Op.EXISTS}),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault to inject at one call. `keep` is how many bytes of the data
    land for `ENOSPC` and `SHORT_WRITE` (None: half of them)."""

    kind: FaultKind
    keep: int | None = None

    def __post_init__(self) -> None:
        if self.keep is not None:
            if self.kind not in (FaultKind.ENOSPC, FaultKind.SHORT_WRITE):
                raise ValueError(f"keep= only applies to ENOSPC and SHORT_WRITE, not {self.kind}")
            if self.keep < 0:
                raise ValueError(f"keep must be >= 0, got {self.keep}")

    def applies_to(self, op: Op) -> bool:
        """Whether this fault can happen at a call of `op`."""
        return op in _APPLICABLE_OPS[self.kind]

    def kept(self, size: int) -> int:
        """How many bytes of a `size`-byte write land before the fault."""
        return size // 2 if self.keep is None else min(self.keep, size)


class FaultNotApplicable(ValueError):
    """A fault hook returned a fault that cannot happen at that call (a
    bug in the test or plan, e.g. a lost link reply for a read)."""


#: Decides, for each call, whether a fault happens: called with the
#: operation and its path (for `link` and `rename`: the destination; for
#: `write_temp`: the directory; for handle operations: the handle's path).
FaultHook = Callable[[Op, str], Fault | None]


class Call(NamedTuple):
    """One call, as `fs.log` records it."""

    op: Op
    path: str


class FiredFault(NamedTuple):
    """A fault a `DiskFaultPlan` handed out."""

    op: Op
    path: str
    fault: Fault


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Inject `fault` at the calls this rule matches: calls of `op` (None:
    any operation) whose path contains `path_contains`, and at which the
    fault can happen. With `nth` set, only at the nth such call (0-based,
    counted by the plan); else at every one."""

    fault: Fault
    op: Op | None = None
    nth: int | None = None
    path_contains: str = ""

    def __post_init__(self) -> None:
        if self.op is not None and not self.fault.applies_to(self.op):
            raise FaultNotApplicable(f"{self.fault.kind} cannot happen at {self.op}")
        if self.nth is not None and self.nth < 0:
            raise ValueError(f"nth must be >= 0, got {self.nth}")

    def matches(self, op: Op, path: str) -> bool:
        """Whether a call counts toward this rule. Counting the matches of
        a fault-free run (`sum(rule.matches(*call) for call in fs.log)`)
        gives the range of `nth` to enumerate."""
        return (
            (self.op is None or op == self.op)
            and self.path_contains in path
            and self.fault.applies_to(op)
        )


class DiskFaultPlan:
    """A scripted `FaultHook`: "fail the nth call of X", "fail every call
    matching X". Each rule counts its own matches; at each call the first
    rule that fires decides the fault. `fired` lists what was injected."""

    def __init__(self, *rules: FaultRule) -> None:
        self.rules: tuple[FaultRule, ...] = rules
        self.seen: list[int] = [0] * len(rules)
        self.fired: list[FiredFault] = []

    def __call__(self, op: Op, path: str) -> Fault | None:
        chosen: Fault | None = None
        for index, rule in enumerate(self.rules):
            if not rule.matches(op, path):
                continue
            position = self.seen[index]
            self.seen[index] = position + 1
            if chosen is None and (rule.nth is None or rule.nth == position):
                chosen = rule.fault
        if chosen is not None:
            self.fired.append(FiredFault(op, path, chosen))
        return chosen

    def __repr__(self) -> str:
        return f"DiskFaultPlan{self.rules!r}"


KillWhen = Literal["before", "after", "dead"]


class SimulatedCrash(BaseException):
    """The process was killed at an FS call (a `KILL_BEFORE`/`KILL_AFTER`
    fault). A BaseException, so that `except Exception` in store or journal
    code does not swallow it. Until the test calls `crash()` (SimulatedFS)
    or `revive()` (FaultyFS), every further call raises it again
    (`when == "dead"`): a killed process touches nothing more."""

    def __init__(self, op: Op, path: str, when: KillWhen) -> None:
        super().__init__(f"simulated kill {when} {op} {path!r}")
        self.op = op
        self.path = path
        self.when: KillWhen = when


def _error(code: int, path: str, other_path: str | None = None) -> OSError:
    """The OSError subclass `os` raises for `code` (FileNotFoundError, ...)."""
    if other_path is None:
        return OSError(code, os.strerror(code), path)
    return OSError(code, os.strerror(code), path, None, other_path)


class _KillAfter:
    """Context manager that kills on exit, whether the call raised or not.
    `__exit__` returns None so that type checkers know it swallows nothing."""

    __slots__ = ("_op", "_path", "_points")

    def __init__(self, points: _FaultPoints | None, op: Op, path: str) -> None:
        self._points = points
        self._op = op
        self._path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        if self._points is not None:
            self._points._kill(self._op, self._path, "after")


_NO_KILL: Final = _KillAfter(None, Op.READ, "")


class _FaultPoints:
    """Call counting, fault look-up and the killed state, shared by
    `SimulatedFS` and `FaultyFS` so that both read a fault the same way."""

    def __init__(self, fault: FaultHook | None) -> None:
        self.fault: FaultHook | None = fault
        #: Calls made per operation (calls refused after a kill not counted).
        self.calls: Counter[Op] = Counter()
        #: Set to a list to record every call in order (off by default, so
        #: that long simulations do not grow it without bound).
        self.log: list[Call] | None = None
        self._killed = False
        # Handles opened before a crash or revive belong to a dead process.
        self._generation = 0

    @property
    def killed(self) -> bool:
        """Whether a kill fault fired and the process was not yet restarted."""
        return self._killed

    @property
    def total_calls(self) -> int:
        return self.calls.total()

    def reset_calls(self) -> None:
        """Forget the call counts (and the log, if one is kept)."""
        self.calls.clear()
        if self.log is not None:
            self.log.clear()

    def _on_kill(self, op: Op, path: str) -> None:
        """What a kill does besides raising `SimulatedCrash`."""

    def _kill(self, op: Op, path: str, when: KillWhen) -> NoReturn:
        self._killed = True
        self._on_kill(op, path)
        raise SimulatedCrash(op, path, when)

    def _begin(self, op: Op, path: str, *, eio_drops_dirty: bool = False) -> Fault | None:
        """Count the call and look its fault up. Raises the faults that act
        before the call takes effect; returns the others for the caller."""
        if self._killed:
            raise SimulatedCrash(op, path, "dead")
        self.calls[op] += 1
        if self.log is not None:
            self.log.append(Call(op, path))
        hook = self.fault
        fault = None if hook is None else hook(op, path)
        if fault is None:
            return None
        if not fault.applies_to(op):
            raise FaultNotApplicable(f"{fault.kind} cannot happen at {op} {path!r}")
        kind = fault.kind
        if kind is FaultKind.KILL_BEFORE:
            self._kill(op, path, "before")
        if kind is FaultKind.ESTALE:
            raise _error(errno.ESTALE, path)
        if kind is FaultKind.EIO and not eio_drops_dirty:
            raise _error(errno.EIO, path)
        if kind is FaultKind.ENOSPC and op not in _PARTIAL_WRITE_OPS:
            raise _error(errno.ENOSPC, path)
        return fault

    def _after(self, fault: Fault | None, op: Op, path: str) -> _KillAfter:
        """Wrap the call's effect: a `KILL_AFTER` fault fires on the way out."""
        if fault is not None and fault.kind is FaultKind.KILL_AFTER:
            return _KillAfter(self, op, path)
        return _NO_KILL

    def _begin_handle(
        self, op: Op, path: str, generation: int, closed: bool, *, eio_drops_dirty: bool = False
    ) -> Fault | None:
        if self._killed:
            raise SimulatedCrash(op, path, "dead")
        if closed or generation != self._generation:
            raise _error(errno.EBADF, path)
        return self._begin(op, path, eio_drops_dirty=eio_drops_dirty)


def _is(fault: Fault | None, kind: FaultKind) -> TypeGuard[Fault]:
    return fault is not None and fault.kind is kind
