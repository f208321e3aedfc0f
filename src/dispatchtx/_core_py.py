"""The pure-Python build of the dispatch core (docs/design.md).

`_core.pyx` is its compiled twin; the two must behave identically, and the
test suite runs every case against both. The core does no I/O and reads no
clock: the caller reports what happened (`sent`, `fence_passed`, ...) and
passes the time.

Layout, chosen so that every operation is O(1) in workers and dispatches:
- one dict of every dispatch in flight, keyed by dispatch id: the phase in
  the transaction says which of the three tables (preparing, active,
  committing) it is in, so that a move is one look-up and no dict write;
- per worker, an intrusive doubly linked list of its dispatches (any phase)
  and a count of the PREPARING or ACTIVE ones (D1);
- one intrusive list of ACTIVE dispatches in send order, so that
  `sent_before` walks only the expired ones;
- per worker, the set of object ids it is known to hold (D7).
A transaction's compensation stack is one flat list: comp, arg, comp, arg...
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, final

from dispatchtx.errors import (
    MOVES,
    NO_FAILURES,
    CompensationFailure,
    Failures,
    IllegalMove,
    Phase,
    Side,
    UnknownDispatch,
    WorkerBusy,
    WrongWorker,
    raise_failures,
)

__all__ = ["Compensation", "DispatchTables", "Transaction"]

A = TypeVar("A")
if TYPE_CHECKING:  # a tag type's default (PEP 696) for type checkers only
    from typing_extensions import TypeVar as TypeVarWithDefault

    T = TypeVarWithDefault("T", default=object)
else:
    T = TypeVar("T")

_PREPARING = Phase.PREPARING
_ACTIVE = Phase.ACTIVE
_COMMITTING = Phase.COMMITTING
_COMMITTED = Phase.COMMITTED
_ROLLED_BACK = Phase.ROLLED_BACK

# Which move is legal from which phase, and where it leaves the dispatch:
# taken from the one table in dispatchtx.errors, as the compiled twin does.
_SENT_FROM, _SENT_TO = MOVES["sent"].source, MOVES["sent"].target
_ABORT_FROM = MOVES["abort"].source
_FENCE_PASSED_FROM, _FENCE_PASSED_TO = MOVES["fence_passed"][1:]
_FINISHED_FROM, _FINISHED_TO = MOVES["finished"][1:]
_FENCED_OUT_FROM = MOVES["fenced_out"].source
# abort, fenced_out and the sweeps share one roll-back: one target.
_ROLLED_BACK_TO = MOVES["abort"].target
if MOVES["fenced_out"].target is not _ROLLED_BACK_TO:
    raise ImportError("dispatchtx.errors.MOVES: abort and fenced_out must end alike")

# Dispatch ids are C `long long` in the compiled twin: both builds keep them
# below 2**63.
MAX_DISPATCH_ID = 2**63 - 1

# Index of each side's callable in Compensation._callables.
_BEFORE, _AFTER, _ON_COMMIT = 0, 1, 2
_SIDES = (Side.BEFORE_SEND, Side.AFTER_SEND, Side.ON_COMMIT)


@final
class Compensation(Generic[A]):
    """One resource kind's undo, discard and release, declared once.

    Made by `DispatchTables.compensation`; per dispatch, an adapter adds
    `(compensation, reservation)` to the transaction, so no closure is
    created per dispatch.
    """

    __slots__ = ("_callables", "_name")

    def __init__(
        self,
        name: str,
        before_send: Callable[[A], object] | None,
        after_send: Callable[[A], object] | None,
        on_commit: Callable[[A], object] | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"compensation name must be str, not {type(name).__name__}")
        for side, fn in zip(_SIDES, (before_send, after_send, on_commit), strict=True):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}.{side.value} must be callable or None")
        self._name = name
        self._callables = (before_send, after_send, on_commit)

    @property
    def name(self) -> str:
        return self._name

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Compensation is bound to its adapter: it cannot be pickled")

    def __repr__(self) -> str:
        return f"<Compensation {self._name!r}>"


@final
class Transaction(Generic[T]):
    """A read-only handle on one dispatch. Only the tables move it."""

    __slots__ = (
        "_id",
        "_worker",
        "_phase",
        "_sent_at",
        "_tag",
        "_stack",
        "_objects",
        "_w_prev",
        "_w_next",
        "_s_prev",
        "_s_next",
    )

    _id: int
    _worker: int
    _phase: Phase
    _sent_at: float | None
    _tag: Any
    _stack: list[Any] | None
    _objects: list[str] | None
    _w_prev: Transaction | None
    _w_next: Transaction | None
    _s_prev: Transaction | None
    _s_next: Transaction | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("transactions are made by DispatchTables.prepare")

    @property
    def id(self) -> int:
        return self._id

    @property
    def worker(self) -> int:
        return self._worker

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def sent_at(self) -> float | None:
        return self._sent_at

    @property
    def tag(self) -> T:
        return self._tag  # type: ignore[no-any-return]

    @tag.setter
    def tag(self, value: T) -> None:
        if self._phase is not _PREPARING:
            raise IllegalMove(self._id, "set tag", self._phase)
        self._tag = value

    def add(self, comp: Compensation[A], arg: A) -> None:
        """Register one reservation's compensation (PREPARING only, D2)."""
        if type(comp) is not Compensation:
            raise TypeError(f"expected a Compensation, got {type(comp).__name__}")
        if self._phase is not _PREPARING:
            raise IllegalMove(self._id, "add", self._phase)
        stack = self._stack
        assert stack is not None  # a PREPARING transaction always has its stack
        stack.append(comp)
        stack.append(arg)

    def ship(self, object_ids: Iterable[str]) -> None:
        """Objects this message carries; cached for the worker at `sent` (D7)."""
        if self._phase is not _PREPARING:
            raise IllegalMove(self._id, "ship", self._phase)
        if isinstance(object_ids, str):
            raise TypeError("ship() takes an iterable of object ids, not one str")
        ids = list(object_ids)
        for object_id in ids:
            if type(object_id) is not str:
                raise TypeError(f"object ids must be str, not {type(object_id).__name__}")
        if self._objects is None:
            self._objects = ids
        else:
            self._objects.extend(ids)

    def __len__(self) -> int:
        stack = self._stack
        return 0 if stack is None else len(stack) >> 1

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Transaction is a handle on live tables: it cannot be pickled")

    def __repr__(self) -> str:
        return (
            f"<Transaction {self._id} worker={self._worker} "
            f"{self._phase.name} compensations={len(self)}>"
        )


def _new_transaction(dispatch_id: int, worker: int, tag: object) -> Transaction[Any]:
    txn = object.__new__(Transaction)
    txn._id = dispatch_id
    txn._worker = worker
    txn._phase = _PREPARING
    txn._sent_at = None
    txn._tag = tag
    txn._stack = []
    txn._objects = None
    txn._w_prev = txn._w_next = txn._s_prev = txn._s_next = None
    return txn


def _run(txn: Transaction, stack: list[Any], which: int) -> tuple[Failures, BaseException | None]:
    """Run one side of a detached stack in reverse; keep every failure.

    An interrupt (KeyboardInterrupt, SystemExit) lets the rest run; it is
    handed back for the caller to raise once everything has run.
    """
    failures: list[CompensationFailure] | None = None
    interrupt: BaseException | None = None
    i = len(stack) - 2
    while i >= 0:
        comp: Compensation[Any] = stack[i]
        fn = comp._callables[which]
        if fn is not None:
            try:
                fn(stack[i + 1])
            except Exception as error:
                if failures is None:
                    failures = []
                failures.append(
                    CompensationFailure(txn._id, txn._worker, comp.name, _SIDES[which], error)
                )
            except BaseException as error:
                if interrupt is None:
                    interrupt = error
                else:
                    interrupt.add_note(f"dispatchtx: a further interrupt: {error!r}")
        i -= 2
    return (NO_FAILURES if failures is None else tuple(failures)), interrupt


def _as_time(now: object) -> float:
    """A send time or cutoff: a real number (not a str), never NaN."""
    if isinstance(now, str | bytes | bytearray):
        raise TypeError(f"a time must be a real number, not {type(now).__name__}")
    value = float(now)  # type: ignore[arg-type]
    if math.isnan(value):
        raise ValueError("a time must not be NaN")
    return value


def _reraise(
    interrupt: BaseException, failures: Failures, others: Iterable[BaseException] = ()
) -> None:
    for other in others:
        interrupt.add_note(f"dispatchtx: a further interrupt in this rollback: {other!r}")
    for failure in failures:
        interrupt.add_note(f"dispatchtx: also failed during this rollback: {failure}")
    raise interrupt


class _DispatchBoundary:
    """`with tables.dispatch(worker) as txn:` (D8). A class, not a generator:
    it is on the hot path."""

    __slots__ = ("_tables", "_worker", "_tag", "_txn")

    def __init__(self, tables: DispatchTables[Any], worker: int, tag: object) -> None:
        self._tables = tables
        self._worker = worker
        self._tag = tag
        self._txn: Transaction | None = None

    def __enter__(self) -> Transaction:
        if self._txn is not None:
            raise RuntimeError("a dispatch() boundary can be entered only once")
        txn = self._tables.prepare(self._worker, self._tag)
        self._txn = txn
        return txn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        txn = self._txn
        if txn is None:
            raise RuntimeError("a dispatch() boundary left without being entered")
        phase = txn._phase
        if exc is None:
            if phase is _PREPARING:
                failures = self._tables.abort(txn._id)
                error = IllegalMove(
                    txn._id,
                    "dispatch() exit",
                    _PREPARING,
                    "the block ended neither sent nor aborted; the before-send undo ran",
                )
                for failure in failures:
                    error.add_note(f"dispatchtx: while compensating: {failure}")
                raise error
            return False
        if phase is _PREPARING:
            failures = self._tables.abort(txn._id)
        elif phase is _ACTIVE:
            failures = self._tables.fenced_out(txn._id)
        else:
            failures = NO_FAILURES
        for failure in failures:
            exc.add_note(f"dispatchtx: while compensating: {failure}")
        return False


class _CommittingBoundary:
    """`with tables.committing(dispatch_id) as txn:` the triage boundary."""

    __slots__ = ("_tables", "_id")

    def __init__(self, tables: DispatchTables[Any], dispatch_id: int) -> None:
        self._tables = tables
        self._id = dispatch_id

    def __enter__(self) -> Transaction:
        tables = self._tables
        txn = tables._txns.get(self._id)
        if txn is not None and txn._phase is _COMMITTING:
            return txn  # a retry of a triage that failed before
        return tables.fence_passed(self._id)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if exc is None:
            raise_failures(
                self._tables.finished(self._id),
                f"dispatch {self._id} is COMMITTED, but releasing it",
            )
        # On an exception the dispatch stays COMMITTING, parked for a retry:
        # past the fence nothing is discarded.
        return False


@final
class DispatchTables(Generic[T]):
    """The three tables of in-flight dispatches and the moves between them."""

    __slots__ = (
        "_n_workers",
        "_max_in_flight",
        "_next_id",
        "_txns",
        "_planted",
        "_heads",
        "_occupied",
        "_caches",
        "_sent_head",
        "_sent_tail",
        "_last_now",
    )

    def __init__(self, n_workers: int, *, max_in_flight: int = 1, first_id: int = 0) -> None:
        n_workers = operator.index(n_workers)
        max_in_flight = operator.index(max_in_flight)
        first_id = operator.index(first_id)
        if n_workers < 0:
            raise ValueError(f"n_workers must be >= 0, got {n_workers}")
        if not 1 <= max_in_flight < 2**31:
            raise ValueError(f"max_in_flight must be in 1..2**31-1, got {max_in_flight}")
        if not 0 <= first_id <= MAX_DISPATCH_ID:
            raise ValueError(f"first_id must be in 0..2**63-1, got {first_id}")
        self._n_workers = n_workers
        self._max_in_flight = max_in_flight
        self._next_id = first_id
        self._txns: dict[int, Transaction] = {}
        # (phase, txn) put in a second table by _debug_plant
        self._planted: list[tuple[Phase, Transaction]] = []
        self._heads: list[Transaction | None] = [None] * self._n_workers
        self._occupied: list[int] = [0] * self._n_workers
        self._caches: list[set[str] | None] = [None] * self._n_workers
        self._sent_head: Transaction | None = None
        self._sent_tail: Transaction | None = None
        self._last_now = float("-inf")

    # -- configuration ---------------------------------------------------

    @property
    def n_workers(self) -> int:
        return self._n_workers

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def next_id(self) -> int:
        return self._next_id

    def compensation(
        self,
        name: str,
        before_send: Callable[[A], object] | None,
        after_send: Callable[[A], object] | None,
        on_commit: Callable[[A], object] | None = None,
    ) -> Compensation[A]:
        """Declare one resource kind's compensation, once."""
        return Compensation(name, before_send, after_send, on_commit)

    # -- intrusive lists -------------------------------------------------

    def _check_worker(self, worker: int) -> int:
        if type(worker) is not int:
            worker = operator.index(worker)
        if not 0 <= worker < self._n_workers:
            raise ValueError(f"worker {worker} is out of range 0..{self._n_workers - 1}")
        return worker

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("DispatchTables cannot be pickled: it holds live compensations")

    def _link_worker(self, txn: Transaction) -> None:
        head = self._heads[txn._worker]
        txn._w_next = head
        if head is not None:
            head._w_prev = txn
        self._heads[txn._worker] = txn

    def _unlink_worker(self, txn: Transaction) -> None:
        prev, nxt = txn._w_prev, txn._w_next
        if prev is not None:
            prev._w_next = nxt
        elif self._heads[txn._worker] is txn:
            self._heads[txn._worker] = nxt
        else:
            return  # not linked
        if nxt is not None:
            nxt._w_prev = prev
        txn._w_prev = txn._w_next = None

    def _unlink_sent(self, txn: Transaction) -> None:
        prev, nxt = txn._s_prev, txn._s_next
        if prev is not None:
            prev._s_next = nxt
        elif self._sent_head is txn:
            self._sent_head = nxt
        else:
            return  # not linked
        if nxt is not None:
            nxt._s_prev = prev
        else:
            self._sent_tail = prev
        txn._s_prev = txn._s_next = None

    def _find(self, dispatch_id: int, phase: Phase, move: str) -> Transaction:
        """The dispatch in `phase`, or IllegalMove naming where it is."""
        txn = self._txns.get(dispatch_id)
        if txn is None:
            raise IllegalMove(dispatch_id, move, None)
        if txn._phase is not phase:
            raise IllegalMove(dispatch_id, move, txn._phase)
        return txn

    # -- moves -----------------------------------------------------------

    def prepare(self, worker: int, tag: Any = None) -> Transaction[T]:
        """Open a dispatch to `worker` (D1: at most `max_in_flight` per worker)."""
        worker = self._check_worker(worker)
        occupied = self._occupied[worker]
        if occupied >= self._max_in_flight:
            raise WorkerBusy(worker, occupied, self._max_in_flight)
        dispatch_id = self._next_id
        if dispatch_id > MAX_DISPATCH_ID:
            raise OverflowError("dispatch ids are exhausted (2**63)")
        self._next_id = dispatch_id + 1
        txn = _new_transaction(dispatch_id, worker, tag)
        self._txns[dispatch_id] = txn
        self._occupied[worker] = occupied + 1
        self._link_worker(txn)
        return txn

    def sent(self, dispatch_id: int, now: float) -> Transaction:
        """`send` returned: PREPARING -> ACTIVE, and the worker's object cache
        learns what the message carried (D7). `now` never goes backwards: an
        earlier one is taken as the latest seen."""
        # Checked before anything moves: a bad time leaves the dispatch
        # PREPARING, so its boundary still compensates it.
        now = _as_time(now)
        txn = self._find(dispatch_id, _SENT_FROM, "sent")
        if now < self._last_now:
            now = self._last_now
        else:
            self._last_now = now
        txn._phase = _SENT_TO
        txn._sent_at = now
        tail = self._sent_tail
        txn._s_prev = tail
        if tail is None:
            self._sent_head = txn
        else:
            tail._s_next = txn
        self._sent_tail = txn
        objects = txn._objects
        if objects is not None:
            txn._objects = None
            cache = self._caches[txn._worker]
            if cache is None:
                self._caches[txn._worker] = set(objects)
            else:
                cache.update(objects)
        return txn

    def abort(self, dispatch_id: int) -> Failures:
        """Never sent: run the before-send undos in reverse (D3)."""
        txn = self._find(dispatch_id, _ABORT_FROM, "abort")
        del self._txns[txn._id]
        self._occupied[txn._worker] -= 1
        self._unlink_worker(txn)
        return self._roll_back(txn, _BEFORE)

    def fence_passed(self, dispatch_id: int) -> Transaction:
        """`begin_commit` succeeded: ACTIVE -> COMMITTING (D5); the worker is free."""
        txn = self._find(dispatch_id, _FENCE_PASSED_FROM, "fence_passed")
        self._unlink_sent(txn)
        self._occupied[txn._worker] -= 1
        txn._phase = _FENCE_PASSED_TO
        return txn

    def finished(self, dispatch_id: int) -> Failures:
        """Triage and completion done: run the releases in reverse and drop
        the stack (D6)."""
        txn = self._find(dispatch_id, _FINISHED_FROM, "finished")
        del self._txns[txn._id]
        self._unlink_worker(txn)
        stack = txn._stack
        txn._stack = None
        txn._phase = _FINISHED_TO
        assert stack is not None
        failures, interrupt = _run(txn, stack, _ON_COMMIT)
        if interrupt is not None:
            _reraise(interrupt, failures)
        return failures

    def fenced_out(self, dispatch_id: int) -> Failures:
        """Sent, but the result cannot be trusted: run the after-send
        discards in reverse (D4)."""
        txn = self._find(dispatch_id, _FENCED_OUT_FROM, "fenced_out")
        del self._txns[txn._id]
        self._unlink_sent(txn)
        self._occupied[txn._worker] -= 1
        self._unlink_worker(txn)
        return self._roll_back(txn, _AFTER)

    def _roll_back(self, txn: Transaction, which: int) -> Failures:
        # The dispatch is already out of every table: a compensation that
        # calls back into the tables finds it gone.
        stack = txn._stack
        txn._stack = None
        txn._objects = None
        txn._phase = _ROLLED_BACK_TO
        assert stack is not None
        failures, interrupt = _run(txn, stack, which)
        if interrupt is not None:
            _reraise(interrupt, failures)
        return failures

    def _sweep(self, victims: list[Transaction]) -> Failures:
        """Take each distinct victim out of every table, then compensate each
        once, newest first (D8)."""
        seen: set[int] = set()
        detached: list[tuple[Transaction, list[Any], int]] = []
        for txn in victims:
            if id(txn) in seen:
                continue
            seen.add(id(txn))
            dispatch_id = txn._id
            if self._txns.get(dispatch_id) is txn:
                del self._txns[dispatch_id]
            if self._planted:
                self._planted = [entry for entry in self._planted if entry[1] is not txn]
            self._unlink_sent(txn)
            self._unlink_worker(txn)
            self._occupied[txn._worker] -= 1
            stack = txn._stack
            txn._stack = None
            txn._objects = None
            which = _BEFORE if txn._sent_at is None else _AFTER
            txn._phase = _ROLLED_BACK_TO
            assert stack is not None
            detached.append((txn, stack, which))
        detached.sort(key=lambda item: item[0]._id, reverse=True)
        all_failures: list[CompensationFailure] = []
        interrupts: list[BaseException] = []
        for txn, stack, which in detached:
            failures, interrupt = _run(txn, stack, which)
            all_failures.extend(failures)
            if interrupt is not None:
                interrupts.append(interrupt)
        result = tuple(all_failures) if all_failures else NO_FAILURES
        if interrupts:
            _reraise(interrupts[0], result, interrupts[1:])
        return result

    def lose_worker(self, worker: int) -> Failures:
        """The worker is gone: compensate its PREPARING and ACTIVE dispatches
        and forget its object cache. A COMMITTING one stays: its result is
        in hand."""
        worker = self._check_worker(worker)
        victims: list[Transaction] = []
        txn = self._heads[worker]
        while txn is not None:
            if txn._phase is _ABORT_FROM or txn._phase is _FENCED_OUT_FROM:
                victims.append(txn)
            txn = txn._w_next
        self._caches[worker] = None
        return self._sweep(victims) if victims else NO_FAILURES

    def shutdown(self) -> Failures:
        """Compensate every PREPARING and ACTIVE dispatch; COMMITTING ones
        stay for the caller to finish or for recovery to roll forward."""
        victims = [
            txn
            for txn in [*self._txns.values(), *[txn for _, txn in self._planted]]
            if txn._phase is _ABORT_FROM or txn._phase is _FENCED_OUT_FROM
        ]
        return self._sweep(victims) if victims else NO_FAILURES

    # -- boundaries ------------------------------------------------------

    def dispatch(self, worker: int, tag: object = None) -> _DispatchBoundary:
        """The D8 boundary around reserving, building and sending."""
        return _DispatchBoundary(self, worker, tag)

    def committing(self, dispatch_id: int) -> _CommittingBoundary:
        """The triage boundary; a failure inside parks the dispatch COMMITTING."""
        return _CommittingBoundary(self, dispatch_id)

    # -- looking, never moving -------------------------------------------

    def get(self, dispatch_id: int) -> Transaction | None:
        return self._txns.get(dispatch_id)

    def phase_of(self, dispatch_id: int) -> Phase | None:
        txn = self._txns.get(dispatch_id)
        return None if txn is None else txn._phase

    def match(self, worker: int, dispatch_id: int) -> Transaction:
        """The ACTIVE dispatch this result answers, or UnknownDispatch /
        WrongWorker: a result to count and drop."""
        txn = self._txns.get(dispatch_id)
        if txn is None:
            raise UnknownDispatch(dispatch_id, None)
        if txn._worker != worker:
            raise WrongWorker(dispatch_id, txn._worker, worker)
        if txn._phase is not _ACTIVE:
            raise UnknownDispatch(dispatch_id, txn._phase)
        return txn

    def in_flight(self, worker: int | None = None) -> Iterator[Transaction]:
        """A snapshot of the dispatches in any table (of one worker, if
        given), oldest first."""
        if worker is None:
            txns = [*self._txns.values(), *[txn for _, txn in self._planted]]
            txns.sort(key=lambda txn: txn._id)
            return iter(txns)
        worker = self._check_worker(worker)
        txns = []
        txn = self._heads[worker]
        while txn is not None:
            txns.append(txn)
            txn = txn._w_next
        txns.reverse()
        return iter(txns)

    def sent_before(self, cutoff: float) -> Iterator[Transaction]:
        """A snapshot of the ACTIVE dispatches sent before `cutoff`, oldest
        first; O(expired)."""
        cutoff = _as_time(cutoff)
        expired = []
        txn = self._sent_head
        while txn is not None and txn._sent_at is not None and txn._sent_at < cutoff:
            expired.append(txn)
            txn = txn._s_next
        return iter(expired)

    def missing(self, worker: int, object_ids: Iterable[str]) -> list[str]:
        """The ids the worker is not known to hold, in the order given."""
        worker = self._check_worker(worker)
        cache = self._caches[worker]
        if cache is None:
            return list(object_ids)
        return [object_id for object_id in object_ids if object_id not in cache]

    def __len__(self) -> int:
        return len(self._txns) + len(self._planted)

    def __repr__(self) -> str:
        counts = dict.fromkeys((_PREPARING, _ACTIVE, _COMMITTING), 0)
        for txn in self._txns.values():
            counts[txn._phase] += 1
        for table, _ in self._planted:
            counts[table] += 1
        return (
            f"<DispatchTables workers={self._n_workers} preparing={counts[_PREPARING]} "
            f"active={counts[_ACTIVE]} committing={counts[_COMMITTING]}>"
        )

    # -- test-only hook --------------------------------------------------

    def _debug_plant(self, dispatch_id: int, phase: Phase) -> None:
        """Put a dispatch into a second table as a regression would; tests
        use it to check that sweeps still compensate each dispatch once.
        Counted by len, in_flight, repr and sweeps alone: moves and look-ups
        see the dispatch where its phase says."""
        txn = self._txns.get(dispatch_id)
        if txn is None:
            raise KeyError(dispatch_id)
        # KeyError for a phase that has no table
        table = {_PREPARING: _PREPARING, _ACTIVE: _ACTIVE, _COMMITTING: _COMMITTING}[phase]
        if txn._phase is table or (table, txn) in self._planted:
            return  # already in that table
        self._planted.append((table, txn))
