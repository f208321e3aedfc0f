# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
# cython: cdivision=True, embedsignature=True, binding=True, auto_pickle=False
"""The compiled build of the dispatch core (docs/design.md).

The pure-Python twin `_core_py.py` documents the layout and must behave
identically; the test suite runs every case against both. Here the phase is
a C int (a prebuilt `Phase` member is handed out), the per-worker counts are
a C array allocated through PyMem (so that tracemalloc sees it), and the
boundaries are cdef classes rather than generators.

The hot methods (`add` and the moves) are `binding=False`: a builtin method
that the eval loop calls directly, without the cyfunction call layers (about
a tenth of a lifecycle). The "clinic" signature format keeps their signatures
visible to `inspect`, hence to stubtest.
"""

cimport cython
from cpython.list cimport PyList_SET_ITEM
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.limits cimport LLONG_MAX

import operator
from types import GenericAlias

from dispatchtx.errors import (
    MOVES,
    CompensationFailure,
    IllegalMove,
    Phase,
    Side,
    UnknownDispatch,
    WorkerBusy,
    WrongWorker,
    raise_failures,
)

__all__ = ["Compensation", "DispatchTables", "Transaction"]

cdef enum:
    PREPARING = 0
    ACTIVE = 1
    COMMITTING = 2
    COMMITTED = 3
    ROLLED_BACK = 4

cdef enum:
    BEFORE = 0
    AFTER = 1
    ON_COMMIT = 2

# Which move is legal from which phase, and where it leaves the dispatch:
# C ints taken at import from the one table in dispatchtx.errors, so that the
# hot path compares ints.
cdef int SENT_FROM = MOVES["sent"].source
cdef int SENT_TO = MOVES["sent"].target
cdef int ABORT_FROM = MOVES["abort"].source
cdef int FENCE_PASSED_FROM = MOVES["fence_passed"].source
cdef int FENCE_PASSED_TO = MOVES["fence_passed"].target
cdef int FINISHED_FROM = MOVES["finished"].source
cdef int FINISHED_TO = MOVES["finished"].target
cdef int FENCED_OUT_FROM = MOVES["fenced_out"].source
# abort, fenced_out and the sweeps share one roll-back: one target.
cdef int ROLLED_BACK_TO = MOVES["abort"].target
if MOVES["fenced_out"].target != ROLLED_BACK_TO:
    raise ImportError("dispatchtx.errors.MOVES: abort and fenced_out must end alike")

cdef tuple _PHASES = (
    Phase.PREPARING, Phase.ACTIVE, Phase.COMMITTING, Phase.COMMITTED, Phase.ROLLED_BACK
)
cdef tuple _SIDES = (Side.BEFORE_SEND, Side.AFTER_SEND, Side.ON_COMMIT)
cdef tuple _NO_FAILURES = ()
# A stack is preallocated to the last sent dispatch's size, up to this (16
# compensations); past it, it grows as it is filled.
cdef Py_ssize_t _MAX_STACK_SIZE = 32
# Dispatch ids are C `long long`: both builds keep them below 2**63.
MAX_DISPATCH_ID = 2**63 - 1


@cython.final
cdef class Compensation:
    """One resource kind's undo, discard and release, declared once.

    Made by `DispatchTables.compensation`; per dispatch, an adapter adds
    `(compensation, reservation)` to the transaction, so no closure is
    created per dispatch.
    """

    cdef readonly str name
    cdef object _before
    cdef object _after
    cdef object _on_commit
    cdef int _sides  # bit `1 << side` set when that side has a callable

    def __init__(self, name, before_send, after_send, on_commit=None):
        if not isinstance(name, str):
            raise TypeError(f"compensation name must be str, not {type(name).__name__}")
        for side, fn in zip(_SIDES, (before_send, after_send, on_commit), strict=True):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}.{side.value} must be callable or None")
        self.name = name
        self._before = before_send
        self._after = after_send
        self._on_commit = on_commit
        self._sides = (
            (before_send is not None) << BEFORE
            | (after_send is not None) << AFTER
            | (on_commit is not None) << ON_COMMIT
        )

    __class_getitem__ = classmethod(GenericAlias)

    def __repr__(self):
        return f"<Compensation {self.name!r}>"


@cython.final
@cython.freelist(64)
cdef class Transaction:
    """A read-only handle on one dispatch. Only the tables move it."""

    cdef object _id  # an int made once: txn.id and the dict key are this object
    cdef Py_ssize_t _worker
    cdef int _phase
    cdef bint _was_sent
    cdef double _sent_at
    cdef object _tag
    cdef list _stack  # comp, arg, comp, arg...: `_n` entries, then None padding
    cdef Py_ssize_t _n
    cdef int _sides  # the union of its compensations' sides: _run skips a side none has
    cdef list _objects
    cdef Transaction _w_prev
    cdef Transaction _w_next
    cdef Transaction _s_prev
    cdef Transaction _s_next

    # Generic in the type of its tag, for type checkers: Transaction[T].
    __class_getitem__ = classmethod(GenericAlias)

    def __init__(self, *args, **kwargs):
        raise TypeError("transactions are made by DispatchTables.prepare")

    @property
    def id(self):
        return self._id

    @property
    def worker(self):
        return self._worker

    @property
    def phase(self):
        return _PHASES[self._phase]

    @property
    def sent_at(self):
        return self._sent_at if self._was_sent else None

    @property
    def tag(self):
        return self._tag

    @tag.setter
    def tag(self, value):
        if self._phase != PREPARING:
            raise IllegalMove(self._id, "set tag", _PHASES[self._phase])
        self._tag = value

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def add(self, Compensation comp not None, arg):
        """Register one reservation's compensation (PREPARING only, D2)."""
        if self._phase != PREPARING:
            raise IllegalMove(self._id, "add", _PHASES[self._phase])
        cdef list stack = self._stack
        cdef Py_ssize_t n = self._n
        if n < len(stack):
            # Fill two None pads in place.
            Py_INCREF(comp)
            Py_INCREF(arg)
            PyList_SET_ITEM(stack, n, comp)
            PyList_SET_ITEM(stack, n + 1, arg)
            Py_DECREF(None)
            Py_DECREF(None)
        else:
            stack.append(comp)
            stack.append(arg)
        self._n = n + 2
        self._sides |= comp._sides

    def ship(self, object_ids):
        """Objects this message carries; cached for the worker at `sent` (D7)."""
        if self._phase != PREPARING:
            raise IllegalMove(self._id, "ship", _PHASES[self._phase])
        if isinstance(object_ids, str):
            raise TypeError("ship() takes an iterable of object ids, not one str")
        cdef list ids = list(object_ids)
        for object_id in ids:
            if type(object_id) is not str:
                raise TypeError(f"object ids must be str, not {type(object_id).__name__}")
        if self._objects is None:
            self._objects = ids
        else:
            self._objects.extend(ids)

    def __len__(self):
        return 0 if self._stack is None else self._n >> 1

    def __repr__(self):
        return (
            f"<Transaction {self._id} worker={self._worker} "
            f"{_PHASES[self._phase].name} compensations={len(self)}>"
        )


cdef inline Transaction _new_transaction(
    long long dispatch_id, Py_ssize_t worker, object tag, Py_ssize_t size
):
    cdef Transaction txn = Transaction.__new__(Transaction)
    txn._id = dispatch_id
    txn._worker = worker
    txn._phase = PREPARING
    txn._tag = tag
    txn._stack = [None] * size  # sized once: no reallocation while adding
    return txn


cdef tuple _run(Transaction txn, list stack, int which, list interrupts):
    """Run one side of a detached stack in reverse; keep every failure.

    An interrupt (KeyboardInterrupt, SystemExit) lets the rest run; it is
    appended to `interrupts` when the caller collects them, else raised once
    everything has run.
    """
    if not txn._sides & (1 << which):
        return _NO_FAILURES
    cdef Py_ssize_t i = txn._n - 2
    cdef Compensation comp
    cdef list failures = None
    cdef object interrupt = None
    cdef object fn
    while i >= 0:
        comp = <Compensation>stack[i]
        if which == BEFORE:
            fn = comp._before
        elif which == AFTER:
            fn = comp._after
        else:
            fn = comp._on_commit
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
    cdef tuple result = _NO_FAILURES if failures is None else tuple(failures)
    if interrupt is not None:
        if interrupts is None:
            _reraise(interrupt, result)
        interrupts.append(interrupt)
    return result


cdef _reraise(object interrupt, tuple failures, list others=None):
    if others:
        for other in others:
            interrupt.add_note(f"dispatchtx: a further interrupt in this rollback: {other!r}")
    for failure in failures:
        interrupt.add_note(f"dispatchtx: also failed during this rollback: {failure}")
    raise interrupt


@cython.final
cdef class _DispatchBoundary:
    """`with tables.dispatch(worker) as txn:` (D8)."""

    cdef DispatchTables _tables
    cdef object _worker
    cdef object _tag
    cdef Transaction _txn

    def __enter__(self):
        if self._tables is None:
            raise RuntimeError("dispatch() boundaries are made by DispatchTables.dispatch")
        if self._txn is not None:
            raise RuntimeError("a dispatch() boundary can be entered only once")
        self._txn = self._tables.prepare(self._worker, self._tag)
        return self._txn

    def __exit__(self, exc_type, exc, tb):
        cdef Transaction txn = self._txn
        if txn is None or self._tables is None:
            raise RuntimeError("a dispatch() boundary left without being entered")
        cdef int phase = txn._phase
        cdef tuple failures
        if exc is None:
            if phase == PREPARING:
                failures = self._tables.abort(txn._id)
                error = IllegalMove(
                    txn._id,
                    "dispatch() exit",
                    Phase.PREPARING,
                    "the block ended neither sent nor aborted; the before-send undo ran",
                )
                for failure in failures:
                    error.add_note(f"dispatchtx: while compensating: {failure}")
                raise error
            return False
        if phase == PREPARING:
            failures = self._tables.abort(txn._id)
        elif phase == ACTIVE:
            failures = self._tables.fenced_out(txn._id)
        else:
            failures = _NO_FAILURES
        for failure in failures:
            exc.add_note(f"dispatchtx: while compensating: {failure}")
        return False


@cython.final
cdef class _CommittingBoundary:
    """`with tables.committing(dispatch_id) as txn:` the triage boundary."""

    cdef DispatchTables _tables
    cdef object _id

    def __enter__(self):
        if self._tables is None:
            raise RuntimeError("committing() boundaries are made by DispatchTables.committing")
        txn = self._tables._txns.get(self._id)
        if txn is not None and (<Transaction>txn)._phase == COMMITTING:
            return txn  # a retry of a triage that failed before
        return self._tables.fence_passed(self._id)

    def __exit__(self, exc_type, exc, tb):
        if self._tables is None:
            raise RuntimeError("committing() boundaries are made by DispatchTables.committing")
        if exc is None:
            raise_failures(
                self._tables.finished(self._id),
                f"dispatch {self._id} is COMMITTED, but releasing it",
            )
        # On an exception the dispatch stays COMMITTING, parked for a retry:
        # past the fence nothing is discarded.
        return False


@cython.final
cdef class DispatchTables:
    """The three tables of in-flight dispatches and the moves between them."""

    cdef Py_ssize_t _n_workers
    cdef int _max_in_flight
    cdef long long _next_id
    cdef bint _exhausted
    cdef dict _txns  # every dispatch in flight by id; its phase says its table
    cdef list _planted  # (phase, txn) put in a second table by _debug_plant
    cdef list _heads
    cdef int *_occupied
    cdef list _caches
    cdef Transaction _sent_head
    cdef Transaction _sent_tail
    cdef double _last_now
    cdef Py_ssize_t _stack_size  # the last sent dispatch's, for the next one's stack

    # Generic in the type of its tag, for type checkers: DispatchTables[T].
    __class_getitem__ = classmethod(GenericAlias)

    def __cinit__(self, n_workers, *, max_in_flight=1, first_id=0):
        self._occupied = NULL

    def __init__(self, n_workers, *, max_in_flight=1, first_id=0):
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
        self._txns = {}
        self._planted = []
        self._heads = [None] * self._n_workers
        self._caches = [None] * self._n_workers
        PyMem_Free(self._occupied)
        self._occupied = <int *>PyMem_Calloc(max(self._n_workers, 1), sizeof(int))
        if self._occupied == NULL:
            raise MemoryError()
        self._sent_head = None
        self._sent_tail = None
        self._last_now = float("-inf")

    def __dealloc__(self):
        PyMem_Free(self._occupied)

    # -- configuration ---------------------------------------------------

    @property
    def n_workers(self):
        return self._n_workers

    @property
    def max_in_flight(self):
        return self._max_in_flight

    @property
    def next_id(self):
        return int(self._next_id) + 1 if self._exhausted else self._next_id

    def compensation(self, name, before_send, after_send, on_commit=None):
        """Declare one resource kind's compensation, once."""
        return Compensation(name, before_send, after_send, on_commit)

    # -- intrusive lists -------------------------------------------------

    cdef inline Py_ssize_t _worker_index(self, object worker) except -1:
        cdef Py_ssize_t w
        if type(worker) is int:
            try:
                w = worker
            except OverflowError:
                w = -1
            if 0 <= w < self._n_workers:
                return w
        elif 0 <= worker < self._n_workers:
            return <Py_ssize_t>worker
        raise ValueError(f"worker {worker} is out of range 0..{self._n_workers - 1}")

    # noexcept: pointer moves on lists sized in __init__; nothing here can raise.
    cdef inline void _link_worker(self, Transaction txn) noexcept:
        cdef Transaction head = self._heads[txn._worker]
        txn._w_next = head
        if head is not None:
            head._w_prev = txn
        self._heads[txn._worker] = txn

    cdef inline void _unlink_worker(self, Transaction txn) noexcept:
        cdef Transaction prev = txn._w_prev
        cdef Transaction nxt = txn._w_next
        if prev is not None:
            prev._w_next = nxt
        elif self._heads[txn._worker] is txn:
            self._heads[txn._worker] = nxt
        else:
            return  # not linked
        if nxt is not None:
            nxt._w_prev = prev
        txn._w_prev = None
        txn._w_next = None

    cdef inline void _unlink_sent(self, Transaction txn) noexcept:
        cdef Transaction prev = txn._s_prev
        cdef Transaction nxt = txn._s_next
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
        txn._s_prev = None
        txn._s_next = None

    cdef Transaction _find(self, object dispatch_id, int phase, str move):
        """The dispatch in `phase`, or IllegalMove naming where it is."""
        cdef object found = self._txns.get(dispatch_id)
        if found is None:
            raise IllegalMove(dispatch_id, move, None)
        cdef Transaction txn = <Transaction>found
        if txn._phase != phase:
            raise IllegalMove(dispatch_id, move, _PHASES[txn._phase])
        return txn

    # -- moves -----------------------------------------------------------

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def prepare(self, worker, tag=None):
        """Open a dispatch to `worker` (D1: at most `max_in_flight` per worker)."""
        cdef Py_ssize_t w = self._worker_index(worker)
        cdef int occupied = self._occupied[w]
        if occupied >= self._max_in_flight:
            raise WorkerBusy(w, occupied, self._max_in_flight)
        cdef long long dispatch_id = self._next_id
        if self._exhausted:
            raise OverflowError("dispatch ids are exhausted (2**63)")
        if dispatch_id == LLONG_MAX:
            self._exhausted = True  # the next id would not fit in a long long
        else:
            self._next_id = dispatch_id + 1
        cdef Transaction txn = _new_transaction(dispatch_id, w, tag, self._stack_size)
        self._txns[txn._id] = txn
        self._occupied[w] = occupied + 1
        self._link_worker(txn)
        return txn

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def sent(self, dispatch_id, double now):
        """`send` returned: PREPARING -> ACTIVE, and the worker's object cache
        learns what the message carried (D7). `now` never goes backwards: an
        earlier one is taken as the latest seen."""
        if now != now:
            raise ValueError("a time must not be NaN")
        cdef Transaction txn = self._find(dispatch_id, SENT_FROM, "sent")
        if now < self._last_now:
            now = self._last_now
        else:
            self._last_now = now
        txn._phase = SENT_TO
        txn._was_sent = True
        txn._sent_at = now
        self._stack_size = min(txn._n, _MAX_STACK_SIZE)
        cdef Transaction tail = self._sent_tail
        txn._s_prev = tail
        if tail is None:
            self._sent_head = txn
        else:
            tail._s_next = txn
        self._sent_tail = txn
        cdef list objects = txn._objects
        cdef object cache
        if objects is not None:
            txn._objects = None
            cache = self._caches[txn._worker]
            if cache is None:
                self._caches[txn._worker] = set(objects)
            else:
                (<set>cache).update(objects)
        return txn

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def abort(self, dispatch_id):
        """Never sent: run the before-send undos in reverse (D3)."""
        cdef Transaction txn = self._find(dispatch_id, ABORT_FROM, "abort")
        del self._txns[txn._id]
        self._occupied[txn._worker] -= 1
        self._unlink_worker(txn)
        return self._roll_back(txn, BEFORE)

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def fence_passed(self, dispatch_id):
        """`begin_commit` succeeded: ACTIVE -> COMMITTING (D5); the worker is free."""
        cdef Transaction txn = self._find(dispatch_id, FENCE_PASSED_FROM, "fence_passed")
        self._unlink_sent(txn)
        self._occupied[txn._worker] -= 1
        txn._phase = FENCE_PASSED_TO
        return txn

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def finished(self, dispatch_id):
        """Triage and completion done: run the releases in reverse and drop
        the stack (D6)."""
        cdef Transaction txn = self._find(dispatch_id, FINISHED_FROM, "finished")
        del self._txns[txn._id]
        self._unlink_worker(txn)
        cdef list stack = txn._stack
        txn._stack = None
        txn._phase = FINISHED_TO
        return _run(txn, stack, ON_COMMIT, None)

    @cython.binding(False)
    @cython.embedsignature.format("clinic")
    def fenced_out(self, dispatch_id):
        """Sent, but the result cannot be trusted: run the after-send
        discards in reverse (D4)."""
        cdef Transaction txn = self._find(dispatch_id, FENCED_OUT_FROM, "fenced_out")
        del self._txns[txn._id]
        self._unlink_sent(txn)
        self._occupied[txn._worker] -= 1
        self._unlink_worker(txn)
        return self._roll_back(txn, AFTER)

    cdef tuple _roll_back(self, Transaction txn, int which):
        # The dispatch is already out of every table: a compensation that
        # calls back into the tables finds it gone.
        cdef list stack = txn._stack
        txn._stack = None
        txn._objects = None
        txn._phase = ROLLED_BACK_TO
        return _run(txn, stack, which, None)

    cdef tuple _sweep(self, list victims):
        """Take each distinct victim out of every table, then compensate each
        once, newest first (D8)."""
        cdef set seen = set()
        cdef list detached = []
        cdef Transaction txn
        for item in victims:
            txn = <Transaction>item
            if id(txn) in seen:
                continue
            seen.add(id(txn))
            if self._txns.get(txn._id) is txn:
                del self._txns[txn._id]
            if self._planted:
                self._planted = [entry for entry in self._planted if entry[1] is not txn]
            self._unlink_sent(txn)
            self._unlink_worker(txn)
            self._occupied[txn._worker] -= 1
            detached.append((txn._id, txn, txn._stack, BEFORE if not txn._was_sent else AFTER))
            txn._stack = None
            txn._objects = None
            txn._phase = ROLLED_BACK_TO
        detached.sort(key=_first, reverse=True)
        cdef list all_failures = []
        cdef list interrupts = []
        for _, txn, stack, which in detached:
            all_failures.extend(_run(txn, stack, which, interrupts))
        cdef tuple result = tuple(all_failures) if all_failures else _NO_FAILURES
        if interrupts:
            _reraise(interrupts[0], result, interrupts[1:])
        return result

    def lose_worker(self, worker):
        """The worker is gone: compensate its PREPARING and ACTIVE dispatches
        and forget its object cache. A COMMITTING one stays: its result is
        in hand."""
        cdef Py_ssize_t w = self._worker_index(worker)
        cdef list victims = []
        cdef object node = self._heads[w]
        cdef Transaction txn
        while node is not None:
            txn = <Transaction>node
            if txn._phase == ABORT_FROM or txn._phase == FENCED_OUT_FROM:
                victims.append(txn)
            node = txn._w_next
        self._caches[w] = None
        return self._sweep(victims) if victims else _NO_FAILURES

    def shutdown(self):
        """Compensate every PREPARING and ACTIVE dispatch; COMMITTING ones
        stay for the caller to finish or for recovery to roll forward."""
        cdef list victims = []
        cdef Transaction txn
        for item in [*self._txns.values(), *[entry[1] for entry in self._planted]]:
            txn = <Transaction>item
            if txn._phase == ABORT_FROM or txn._phase == FENCED_OUT_FROM:
                victims.append(txn)
        return self._sweep(victims) if victims else _NO_FAILURES

    # -- boundaries ------------------------------------------------------

    def dispatch(self, worker, tag=None):
        """The D8 boundary around reserving, building and sending."""
        cdef _DispatchBoundary boundary = _DispatchBoundary.__new__(_DispatchBoundary)
        boundary._tables = self
        boundary._worker = worker
        boundary._tag = tag
        return boundary

    def committing(self, dispatch_id):
        """The triage boundary; a failure inside parks the dispatch COMMITTING."""
        cdef _CommittingBoundary boundary = _CommittingBoundary.__new__(_CommittingBoundary)
        boundary._tables = self
        boundary._id = dispatch_id
        return boundary

    # -- looking, never moving -------------------------------------------

    def get(self, dispatch_id):
        return self._txns.get(dispatch_id)

    def phase_of(self, dispatch_id):
        cdef object txn = self._txns.get(dispatch_id)
        return None if txn is None else _PHASES[(<Transaction>txn)._phase]

    def match(self, worker, dispatch_id):
        """The ACTIVE dispatch this result answers, or UnknownDispatch /
        WrongWorker: a result to count and drop."""
        cdef object found = self._txns.get(dispatch_id)
        if found is None:
            raise UnknownDispatch(dispatch_id, None)
        cdef Transaction txn = <Transaction>found
        if txn._worker != worker:
            raise WrongWorker(dispatch_id, txn._worker, worker)
        if txn._phase != ACTIVE:
            raise UnknownDispatch(dispatch_id, _PHASES[txn._phase])
        return txn

    def in_flight(self, worker=None):
        """A snapshot of the dispatches in any table (of one worker, if
        given), oldest first."""
        cdef list txns
        if worker is None:
            txns = [*self._txns.values(), *[entry[1] for entry in self._planted]]
            txns.sort(key=_dispatch_id)
            return iter(txns)
        cdef Py_ssize_t w = self._worker_index(worker)
        txns = []
        cdef object node = self._heads[w]
        while node is not None:
            txns.append(node)
            node = (<Transaction>node)._w_next
        txns.reverse()
        return iter(txns)

    def sent_before(self, double cutoff):
        """A snapshot of the ACTIVE dispatches sent before `cutoff`, oldest
        first; O(expired)."""
        cdef list expired = []
        cdef Transaction txn = self._sent_head
        while txn is not None and txn._sent_at < cutoff:
            expired.append(txn)
            txn = txn._s_next
        return iter(expired)

    def missing(self, worker, object_ids):
        """The ids the worker is not known to hold, in the order given."""
        cdef Py_ssize_t w = self._worker_index(worker)
        cdef object cache = self._caches[w]
        if cache is None:
            return list(object_ids)
        return [object_id for object_id in object_ids if object_id not in <set>cache]

    def __len__(self):
        return len(self._txns) + len(self._planted)

    def __repr__(self):
        cdef Py_ssize_t[3] counts = [0, 0, 0]
        for txn in self._txns.values():
            counts[(<Transaction>txn)._phase] += 1
        for table, _ in self._planted:
            counts[<int>table] += 1
        return (
            f"<DispatchTables workers={self._n_workers} preparing={counts[PREPARING]} "
            f"active={counts[ACTIVE]} committing={counts[COMMITTING]}>"
        )

    # -- test-only hook --------------------------------------------------

    def _debug_plant(self, dispatch_id, phase):
        """Put a dispatch into a second table as a regression would; tests
        use it to check that sweeps still compensate each dispatch once.
        Counted by len, in_flight, repr and sweeps alone: moves and look-ups
        see the dispatch where its phase says."""
        txn = self._txns.get(dispatch_id)
        if txn is None:
            raise KeyError(dispatch_id)
        # KeyError for a phase that has no table
        cdef int table = {
            Phase.PREPARING: PREPARING, Phase.ACTIVE: ACTIVE, Phase.COMMITTING: COMMITTING
        }[phase]
        if (<Transaction>txn)._phase == table:
            return  # already in that table
        for entry in self._planted:
            if entry[0] == table and entry[1] is txn:
                return
        self._planted.append((table, txn))


def _first(item):
    return item[0]


def _dispatch_id(txn):
    return (<Transaction>txn)._id
