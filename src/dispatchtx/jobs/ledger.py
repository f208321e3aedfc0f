"""The compensation ledger: the simulator's independent record of what the
tables did, checked move by move (docs/design.md, D2-D8).

`LedgerTables` stands in front of a coordinator's `DispatchTables` (the
coordinator takes it through `wrap_tables`). It keeps its own phase history
of every dispatch and its acquisition order, and each compensation's
callables are wrapped to write `(compensation, side, reservation)` into the
ledger as they run. After every move the ledger compares what ran with
what the design says must run:

- `abort` runs the before-send side of a dispatch never sent, `fenced_out`
  the after-send side of one that was, `finished` the releases of one past
  its fence; each in reverse acquisition order, each reservation once;
- `lose_worker` and `shutdown` compensate EVERY dispatch of theirs that is
  PREPARING or ACTIVE (none left behind), newest dispatch first, each on the
  side its history says (sent or not);
- nothing else runs during a move, and nothing runs outside one.

A mismatch is a violation (a string), kept in `violations` for the run's
report: the check never raises into the code it watches. The core is not
touched: the hot path pays nothing outside the simulator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, cast

from dispatchtx import Compensation, DispatchTables, Failures, Side, Transaction

__all__ = ["CompensationLedger", "LedgerTables"]

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

PREPARING, ACTIVE, COMMITTING = "PREPARING", "ACTIVE", "COMMITTING"
SIDES = (Side.BEFORE_SEND, Side.AFTER_SEND, Side.ON_COMMIT)


@dataclass
class _Dispatch:
    worker: int
    history: list[str] = field(default_factory=lambda: [PREPARING])
    # (compensation key, reservation), in the order they were added
    acquired: list[tuple[int, Any]] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return self.history[-1]


@dataclass
class CompensationLedger:
    """What ran, what each dispatch went through, and what did not hold."""

    violations: list[str] = field(default_factory=list)
    ran: list[tuple[int, Side, Any]] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # compensation key -> name
    sides: dict[int, frozenset[Side]] = field(default_factory=dict)  # sides with a callable
    dispatches: dict[int, _Dispatch] = field(default_factory=dict)
    moves_checked: int = 0
    # Compensation name -> called with ("reserved" or a side's value, the
    # reservation) once a reservation is added or a compensation returned.
    observers: dict[str, Callable[[str, Any], None]] = field(default_factory=dict)
    _depth: int = 0  # moves in progress (a compensation may call into the tables)

    def expected(self, dispatch_id: int, side: Side) -> list[tuple[int, Side, Any]]:
        """The calls `side` must make for one dispatch: its reservations in
        reverse acquisition order, those whose compensation has that side."""
        record = self.dispatches[dispatch_id]
        return [
            (key, side, arg)
            for key, arg in reversed(record.acquired)
            if side in self.sides.get(key, frozenset())
        ]

    def side_for(self, dispatch_id: int) -> Side:
        """Before-send unless the history says the dispatch was sent."""
        history = self.dispatches[dispatch_id].history
        return Side.AFTER_SEND if ACTIVE in history else Side.BEFORE_SEND

    def compare(self, move: str, start: int, expected: list[tuple[int, Side, Any]]) -> None:
        self.moves_checked += 1
        got = self.ran[start:]
        if len(got) == len(expected) and all(
            g[0] == e[0] and g[1] is e[1] and g[2] is e[2]
            for g, e in zip(got, expected, strict=True)
        ):
            return
        self.violations.append(
            f"compensation ledger: {move} ran {self._describe(got)}, "
            f"the design says {self._describe(expected)}"
        )

    def observe(self, key: int, event: str, arg: Any) -> None:
        observer = self.observers.get(self.names.get(key, ""))
        if observer is not None:
            observer(event, arg)

    def _describe(self, calls: list[tuple[int, Side, Any]]) -> str:
        if not calls:
            return "nothing"
        return ", ".join(f"{self.names.get(k, '?')}.{s.value}({a!r})" for k, s, a in calls[:8])


class _LedgerTransaction(Generic[T]):
    """A transaction handle that writes each `add` into the ledger."""

    __slots__ = ("_ledger", "_txn")

    def __init__(self, txn: Transaction[T], ledger: CompensationLedger) -> None:
        self._txn = txn
        self._ledger = ledger

    @property
    def tag(self) -> T:
        return self._txn.tag

    @tag.setter
    def tag(self, value: T) -> None:
        self._txn.tag = value

    def add(self, comp: Compensation[A], arg: A) -> None:
        self._txn.add(comp, arg)
        record = self._ledger.dispatches.get(self._txn.id)
        if record is not None:
            record.acquired.append((id(comp), arg))
        self._ledger.observe(id(comp), "reserved", arg)

    def __len__(self) -> int:
        return len(self._txn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def __repr__(self) -> str:
        return repr(self._txn)


class _Boundary(Generic[T]):
    """`dispatch()` or `committing()` through the ledger: the real boundary
    does the work, the ledger checks what its exit ran."""

    def __init__(
        self, tables: LedgerTables[T], inner: AbstractContextManager[Transaction[T]]
    ) -> None:
        self._tables = tables
        self._inner = inner
        self._id: int | None = None

    def __enter__(self) -> Transaction[T]:
        tables = self._tables
        txn = self._inner.__enter__()
        self._id = txn.id
        if txn.id not in tables.ledger.dispatches:  # opened by dispatch()
            tables.ledger.dispatches[txn.id] = _Dispatch(txn.worker)
        record = tables.ledger.dispatches[txn.id]
        phase = txn.phase.name
        if record.phase != phase:
            record.history.append(phase)
        return tables._wrap(txn)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        assert self._id is not None
        dispatch_id = self._id
        tables = self._tables
        tables._checked(
            "boundary exit", [dispatch_id], lambda: self._inner.__exit__(exc_type, exc, tb)
        )
        return False  # the core's boundary never swallows an exception


class LedgerTables(Generic[T]):
    """`DispatchTables` with every move checked against the ledger."""

    def __init__(self, tables: DispatchTables[T], ledger: CompensationLedger) -> None:
        self._tables = tables
        self.ledger = ledger
        self._handles: dict[int, _LedgerTransaction[T]] = {}

    # -- what the ledger wraps -------------------------------------------------

    def compensation(
        self,
        name: str,
        before_send: Callable[[A], object] | None,
        after_send: Callable[[A], object] | None,
        on_commit: Callable[[A], object] | None = None,
    ) -> Compensation[A]:
        ledger = self.ledger
        key_box: list[int] = []

        def recorded(fn: Callable[[A], object] | None, side: Side) -> Callable[[A], object] | None:
            if fn is None:
                return None
            real = fn

            def run(arg: A) -> object:
                if ledger._depth == 0:
                    ledger.violations.append(
                        f"compensation ledger: {name}.{side.value}({arg!r}) ran outside any move"
                    )
                ledger.ran.append((key_box[0], side, arg))
                result = real(arg)
                ledger.observe(key_box[0], side.value, arg)
                return result

            return run

        comp = self._tables.compensation(
            name,
            recorded(before_send, Side.BEFORE_SEND),
            recorded(after_send, Side.AFTER_SEND),
            recorded(on_commit, Side.ON_COMMIT),
        )
        key_box.append(id(comp))
        ledger.names[id(comp)] = name
        ledger.sides[id(comp)] = frozenset(
            side
            for side, fn in zip(SIDES, (before_send, after_send, on_commit), strict=True)
            if fn is not None
        )
        return comp

    def _wrap(self, txn: Transaction[T]) -> Transaction[T]:
        handle = self._handles.get(txn.id)
        if handle is None or handle._txn is not txn:
            handle = _LedgerTransaction(txn, self.ledger)
            self._handles[txn.id] = handle
        return cast(Transaction[T], handle)

    def _checked(self, move: str, dispatch_ids: list[int], call: Callable[[], R]) -> R:
        """Run one move; then compare what ran with what the ledger expects
        for each of `dispatch_ids` that left the tables (newest first)."""
        ledger = self.ledger
        start = len(ledger.ran)
        ledger._depth += 1
        try:
            return call()
        finally:
            ledger._depth -= 1
            if ledger._depth == 0:
                self._settle(move, dispatch_ids, start)

    def _settle(self, move: str, dispatch_ids: list[int], start: int) -> None:
        ledger = self.ledger
        expected: list[tuple[int, Side, Any]] = []
        for dispatch_id in sorted(dispatch_ids, reverse=True):
            record = ledger.dispatches.get(dispatch_id)
            if record is None:
                continue
            phase = self._tables.phase_of(dispatch_id)
            if phase is not None:
                if phase.name != record.phase:
                    record.history.append(phase.name)
                continue  # still in the tables: nothing of it runs
            side = Side.ON_COMMIT if record.phase == COMMITTING else ledger.side_for(dispatch_id)
            expected.extend(ledger.expected(dispatch_id, side))
            del ledger.dispatches[dispatch_id]
            self._handles.pop(dispatch_id, None)
        ledger.compare(f"{move} of {sorted(dispatch_ids, reverse=True)[:6]}", start, expected)

    def _sweep(self, move: str, victims: list[int], call: Callable[[], Failures]) -> Failures:
        failures = self._checked(move, victims, call)
        for dispatch_id in victims:
            if self._tables.get(dispatch_id) is not None:
                phase = self._tables.phase_of(dispatch_id)
                self.ledger.violations.append(
                    f"compensation ledger: {move} left dispatch {dispatch_id} "
                    f"{'?' if phase is None else phase.name} in the tables"
                )
                self.ledger.dispatches.pop(dispatch_id, None)  # reported once
        return failures

    # -- moves -------------------------------------------------------------------

    def prepare(self, worker: int, tag: Any = None) -> Transaction[T]:
        txn = self._tables.prepare(worker, tag)
        self.ledger.dispatches[txn.id] = _Dispatch(txn.worker)
        return self._wrap(txn)

    def sent(self, dispatch_id: int, now: float) -> Transaction[T]:
        txn = self._tables.sent(dispatch_id, now)
        self.ledger.dispatches[dispatch_id].history.append(ACTIVE)
        return self._wrap(txn)

    def fence_passed(self, dispatch_id: int) -> Transaction[T]:
        txn = self._tables.fence_passed(dispatch_id)
        self.ledger.dispatches[dispatch_id].history.append(COMMITTING)
        return self._wrap(txn)

    def abort(self, dispatch_id: int) -> Failures:
        return self._checked("abort", [dispatch_id], lambda: self._tables.abort(dispatch_id))

    def fenced_out(self, dispatch_id: int) -> Failures:
        return self._checked(
            "fenced_out", [dispatch_id], lambda: self._tables.fenced_out(dispatch_id)
        )

    def finished(self, dispatch_id: int) -> Failures:
        return self._checked("finished", [dispatch_id], lambda: self._tables.finished(dispatch_id))

    def _open_ids(self, worker: int | None) -> list[int]:
        return [
            dispatch_id
            for dispatch_id, record in self.ledger.dispatches.items()
            if record.phase in (PREPARING, ACTIVE) and (worker is None or record.worker == worker)
        ]

    def lose_worker(self, worker: int) -> Failures:
        victims = self._open_ids(worker)
        return self._sweep(
            f"lose_worker({worker})", victims, lambda: self._tables.lose_worker(worker)
        )

    def shutdown(self) -> Failures:
        return self._sweep("shutdown", self._open_ids(None), self._tables.shutdown)

    def dispatch(self, worker: int, tag: Any = None) -> AbstractContextManager[Transaction[T]]:
        return _Boundary(self, self._tables.dispatch(worker, tag))

    def committing(self, dispatch_id: int) -> AbstractContextManager[Transaction[T]]:
        return _Boundary(self, self._tables.committing(dispatch_id))

    # -- looking ----------------------------------------------------------------

    def get(self, dispatch_id: int) -> Transaction[T] | None:
        txn = self._tables.get(dispatch_id)
        return None if txn is None else self._wrap(txn)

    def match(self, worker: int, dispatch_id: int) -> Transaction[T]:
        return self._wrap(self._tables.match(worker, dispatch_id))

    def in_flight(self, worker: int | None = None) -> Iterator[Transaction[T]]:
        return iter([self._wrap(txn) for txn in self._tables.in_flight(worker)])

    def sent_before(self, cutoff: float) -> Iterator[Transaction[T]]:
        return iter([self._wrap(txn) for txn in self._tables.sent_before(cutoff)])

    def __len__(self) -> int:
        return len(self._tables)

    def __repr__(self) -> str:
        return repr(self._tables)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tables, name)


def checked_tables(
    ledger: CompensationLedger,
) -> Callable[[DispatchTables[Any]], DispatchTables[Any]]:
    """A `wrap_tables` for `Coordinator` that checks every move in `ledger`."""

    def wrap(tables: DispatchTables[Any]) -> DispatchTables[Any]:
        return cast(DispatchTables[Any], LedgerTables(tables, ledger))

    return wrap
