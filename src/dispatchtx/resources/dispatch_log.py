"""This coordinator's dispatch history, kept in its local work journal
(docs/design.md: "local work journal: undo = append `reclaim`, drop the lease;
discard = append `reclaim`; never mark done").

Per dispatch, `reserve(txn, work_id, token)` records a `dispatch` (dispatch
id, worker, work id and the store's fencing token) and keeps the entry open
until the dispatch ends:

- undo before send: a `reclaim` with reason "never sent"; the open entry is
  dropped (the store's claim itself is `WorkLeases`' to abandon);
- discard after a stale or lost result: a `reclaim` with reason "result
  untrusted"; the dispatch is never marked done;
- release on commit: `done`.

The store stays the authority on items: this history only tells a
restarted coordinator what it had in flight, and which local triage effects
it already applied. Triage applies the owner's local effects (the bandit's
reward, the algorithm's feedback, the proposal's verdict) once per (work
item, commit slot): it asks `applied(work_id, slot)`, applies what is
missing (each of those effects is idempotent per token on its own), then
`mark_applied(work_id, slot)`. A restarted owner rolling a committed item
forward asks the same question and applies only what it had not yet.

The state (open dispatches, counts, applied marks) is rebuilt by replaying
the journal: every change runs through an `_ev_<event>` method, like every
adapter here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple

from dispatchtx.resources._base import (
    AdapterBase,
    JournaledAdapter,
    JsonDict,
    Leak,
    NotReserved,
    SnapshotError,
    Unavailable,
    as_object,
    expect_kind,
    get_dict,
    get_int,
    get_list,
    get_str,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from dispatchtx import DispatchTables, Transaction

__all__ = [
    "NEVER_SENT",
    "OWNER_RESTARTED",
    "RESULT_UNTRUSTED",
    "DispatchEntry",
    "DispatchLog",
]

#: Reason of the `reclaim` an undo before send appends.
NEVER_SENT: Final = "never sent"
#: Reason of the `reclaim` a discard after a stale or lost result appends.
RESULT_UNTRUSTED: Final = "result untrusted"
#: Reason of the `reclaim` that closes an entry a previous incarnation left
#: open and whose item was not committed (`DispatchLog.close_stale`).
OWNER_RESTARTED: Final = "owner restarted"

_KIND = "dispatch-log"
_VERSION = 1


class DispatchEntry(NamedTuple):
    """One dispatch in the history (the compensation's argument)."""

    dispatch_id: int
    worker: int
    work_id: str
    token: int


class DispatchLog(AdapterBase[DispatchEntry], JournaledAdapter):
    """Open dispatches with their work item and token, counts of how
    dispatches ended, and the (work item, commit slot) pairs whose local
    triage effects were applied."""

    __slots__ = (
        "_applied",
        "_completed",
        "_dispatched",
        "_live",
        "_open",
        "_reclaimed",
    )

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = (
        "dispatch",
        "dispatch_many",
        "reclaim",
        "done",
        "applied",
        "forget_applied",
    )
    #: The events a compensation makes: if the journal cannot record one,
    #: `AdapterJournal` still applies it in memory (see there).
    JOURNAL_RELEASE_EVENTS: ClassVar[tuple[str, ...]] = ("reclaim", "done")

    def __init__(self, tables: DispatchTables[Any], *, name: str = "dispatch-log") -> None:
        super().__init__(tables, name, self.undo, self.discard, self.complete)
        self._open: dict[int, DispatchEntry] = {}  # by dispatch id, oldest first
        self._dispatched = 0
        self._completed = 0
        self._reclaimed: dict[str, int] = {}  # reason -> count
        self._applied: dict[str, dict[int, None]] = {}  # work id -> commit slots
        # Entries reserved by this process: only these can still be ended by
        # a compensation, so `close_stale` refuses them. Not journaled: after
        # a restart every open entry is stale.
        self._live: set[int] = set()

    # -- per dispatch -------------------------------------------------------

    def reserve(self, txn: Transaction[Any], work_id: str, token: int) -> DispatchEntry:
        """Record that `txn` carries exact-work item `work_id` under the
        store's fencing `token`; the entry stays open until the dispatch ends."""
        self._require_preparing(txn)
        if not isinstance(work_id, str) or not work_id:
            raise ValueError(f"a work id must be a non-empty str, got {work_id!r}")
        if type(token) is not int or token < 1:
            raise ValueError(f"a fencing token is a slot number >= 1, got {token!r}")
        if txn.id in self._open:
            raise Unavailable(f"{self._name}: dispatch {txn.id} is already recorded")
        entry = DispatchEntry(txn.id, txn.worker, work_id, token)
        self._ev_dispatch(txn.id, txn.worker, work_id, token)
        self._live.add(txn.id)
        self._register(txn, entry, self.undo)
        return entry

    def reserve_many(
        self, reservations: Sequence[tuple[Transaction[Any], str, int]]
    ) -> list[DispatchEntry]:
        """`reserve` of each (txn, work id, token), journaled as ONE record
        (one write, one fsync under `EVERY`: a coordinator's pass records its
        dispatches together before it sends any). Every reservation is
        checked first: one that fails raises and records nothing."""
        entries: list[DispatchEntry] = []
        ids: set[int] = set()
        for txn, work_id, token in reservations:
            self._require_preparing(txn)
            if not isinstance(work_id, str) or not work_id:
                raise ValueError(f"a work id must be a non-empty str, got {work_id!r}")
            if type(token) is not int or token < 1:
                raise ValueError(f"a fencing token is a slot number >= 1, got {token!r}")
            if txn.id in self._open or txn.id in ids:
                raise Unavailable(f"{self._name}: dispatch {txn.id} is already recorded")
            ids.add(txn.id)
            entries.append(DispatchEntry(txn.id, txn.worker, work_id, token))
        if not entries:
            return entries
        self._ev_dispatch_many([list(entry) for entry in entries])
        for (txn, _, _), entry in zip(reservations, entries, strict=True):
            self._live.add(txn.id)
            self._register(txn, entry, self.undo)
        return entries

    def undo(self, entry: DispatchEntry) -> None:
        """Before send: `reclaim`, reason "never sent"; drop the entry."""
        self._check_open(entry)
        # A compensation runs once: whatever its record's fate, no live
        # transaction holds the entry any more.
        self._live.discard(entry.dispatch_id)
        self._ev_reclaim(entry.dispatch_id, NEVER_SENT)

    def discard(self, entry: DispatchEntry) -> None:
        """After a stale or lost result: `reclaim`, reason "result
        untrusted". Never `done`: the result is not this dispatch's to commit."""
        self._check_open(entry)
        self._live.discard(entry.dispatch_id)
        self._ev_reclaim(entry.dispatch_id, RESULT_UNTRUSTED)

    def complete(self, entry: DispatchEntry) -> None:
        """Release on commit: `done`. The store already says the item is
        done, so its applied marks are dropped with it."""
        self._check_open(entry)
        self._live.discard(entry.dispatch_id)
        self._ev_done(entry.dispatch_id)

    def _check_open(self, entry: DispatchEntry) -> None:
        if self._open.get(entry.dispatch_id) != entry:
            raise NotReserved(
                f"{self._name}: dispatch {entry.dispatch_id} of {entry.work_id!r} "
                f"with token {entry.token} is not open"
            )

    # -- recovery -------------------------------------------------------------

    def stale(self) -> list[DispatchEntry]:
        """Open entries that no transaction of this process holds: those a
        previous incarnation left (found by replaying the journal)."""
        return [entry for key, entry in self._open.items() if key not in self._live]

    def close_stale(self, dispatch_id: int, *, committed: bool) -> DispatchEntry:
        """End an entry a previous incarnation left open, once the store has
        settled its item: `done` if the item was committed (and rolled
        forward), else `reclaim` with reason "owner restarted"."""
        entry = self._open.get(dispatch_id)
        if entry is None:
            raise NotReserved(f"{self._name}: dispatch {dispatch_id} is not open")
        if dispatch_id in self._live:
            raise ValueError(
                f"{self._name}: dispatch {dispatch_id} belongs to a live transaction; "
                "its compensation ends it"
            )
        if committed:
            self._ev_done(dispatch_id)
        else:
            self._ev_reclaim(dispatch_id, OWNER_RESTARTED)
        return entry

    # -- local triage effects, once per (work item, commit slot) --------------

    def applied(self, work_id: str, slot: int) -> bool:
        """Whether the local triage effects of `work_id`'s commit `slot`
        were applied (and journaled as such)."""
        return slot in self._applied.get(work_id, ())

    def mark_applied(self, work_id: str, slot: int) -> bool:
        """Record that the local effects of (`work_id`, `slot`) are applied.
        Returns False, writing nothing, if they were marked already."""
        if not isinstance(work_id, str) or not work_id:
            raise ValueError(f"a work id must be a non-empty str, got {work_id!r}")
        if type(slot) is not int or slot < 1:
            raise ValueError(f"a commit slot is a slot number >= 1, got {slot!r}")
        if self.applied(work_id, slot):
            return False
        self._ev_applied(work_id, slot)
        return True

    def applied_slots(self, work_id: str) -> list[int]:
        """The commit slots of `work_id` whose local effects were applied."""
        return list(self._applied.get(work_id, ()))

    def forget_applied(self, work_id: str) -> None:
        """Drop the applied marks of `work_id`, once the store says it is
        done (a committed dispatch's `done` does this on its own)."""
        if work_id in self._applied:
            self._ev_forget_applied(work_id)

    # -- looking --------------------------------------------------------------

    def open_dispatches(self) -> list[DispatchEntry]:
        """Every open entry, oldest first."""
        return list(self._open.values())

    def entry(self, dispatch_id: int) -> DispatchEntry | None:
        return self._open.get(dispatch_id)

    @property
    def dispatched(self) -> int:
        """Dispatches recorded (whether or not they went out)."""
        return self._dispatched

    @property
    def completed(self) -> int:
        """Dispatches marked done."""
        return self._completed

    def reclaimed(self, reason: str | None = None) -> int:
        """Dispatches reclaimed (for `reason`, if given)."""
        if reason is None:
            return sum(self._reclaimed.values())
        return self._reclaimed.get(reason, 0)

    def leaks(self) -> list[Leak]:
        """Every open entry."""
        return [
            self._leak("open dispatch", f"{entry.work_id}@{entry.token}", entry.dispatch_id)
            for entry in self._open.values()
        ]

    # -- journaled events -----------------------------------------------------

    def _ev_dispatch(self, dispatch_id: int, worker: int, work_id: str, token: int) -> None:
        self._open[dispatch_id] = DispatchEntry(dispatch_id, worker, work_id, token)
        self._dispatched += 1

    def _ev_dispatch_many(self, dispatches: list[Any]) -> None:
        # Checked whole before any is applied: a record is applied entirely or
        # not at all, also when replay reads one written by someone else.
        checked = []
        for dispatch in dispatches:
            if not isinstance(dispatch, list) or len(dispatch) != 4:
                raise ValueError(f"a dispatch is [id, worker, work id, token], not {dispatch!r}")
            dispatch_id, worker, work_id, token = dispatch
            if not all(type(value) is int for value in (dispatch_id, worker, token)):
                raise ValueError(f"a dispatch's id, worker and token are ints: {dispatch!r}")
            if not isinstance(work_id, str) or dispatch_id in self._open:
                raise ValueError(f"not a new dispatch with a work id: {dispatch!r}")
            checked.append(DispatchEntry(dispatch_id, worker, work_id, token))
        for entry in checked:
            self._open[entry.dispatch_id] = entry
        self._dispatched += len(checked)

    def _ev_reclaim(self, dispatch_id: int, reason: str) -> None:
        del self._open[dispatch_id]
        self._reclaimed[reason] = self._reclaimed.get(reason, 0) + 1

    def _ev_done(self, dispatch_id: int) -> None:
        entry = self._open.pop(dispatch_id)
        self._completed += 1
        self._applied.pop(entry.work_id, None)

    def _ev_applied(self, work_id: str, slot: int) -> None:
        self._applied.setdefault(work_id, {})[slot] = None

    def _ev_forget_applied(self, work_id: str) -> None:
        del self._applied[work_id]

    # -- snapshot -------------------------------------------------------------

    def snapshot(self) -> JsonDict:
        """Open entries, counts and applied marks, in insertion order."""
        return {
            "kind": _KIND,
            "version": _VERSION,
            "name": self._name,
            "dispatched": self._dispatched,
            "completed": self._completed,
            "reclaimed": dict(self._reclaimed),
            "open": [entry._asdict() for entry in self._open.values()],
            "applied": [
                {"work_id": work_id, "slots": list(slots)}
                for work_id, slots in self._applied.items()
            ],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Replace the whole history by a `snapshot()` (before dispatching:
        the entries restored here belong to no live transaction)."""
        expect_kind(state, _KIND, _VERSION)
        entries: dict[int, DispatchEntry] = {}
        for item in get_list(state, "open"):
            fields = as_object(item, "an open dispatch")
            entry = DispatchEntry(
                get_int(fields, "dispatch_id"),
                get_int(fields, "worker"),
                get_str(fields, "work_id"),
                get_int(fields, "token", minimum=1),
            )
            if entry.dispatch_id in entries:
                raise SnapshotError(f"dispatch {entry.dispatch_id} appears twice")
            entries[entry.dispatch_id] = entry
        reclaimed: dict[str, int] = {}
        for reason, count in get_dict(state, "reclaimed").items():
            if type(count) is not int or count < 1:
                raise SnapshotError(f"reclaimed {reason!r}: bad count {count!r}")
            reclaimed[reason] = count
        applied: dict[str, dict[int, None]] = {}
        for item in get_list(state, "applied"):
            fields = as_object(item, "applied marks")
            work_id = get_str(fields, "work_id")
            slots = get_list(fields, "slots")
            if work_id in applied or not slots:
                raise SnapshotError(f"applied marks of {work_id!r}: duplicate or empty")
            if any(type(slot) is not int or slot < 1 for slot in slots):
                raise SnapshotError(f"applied marks of {work_id!r}: bad slot in {slots!r}")
            applied[work_id] = dict.fromkeys(slots)
        dispatched = get_int(state, "dispatched")
        completed = get_int(state, "completed")
        if completed + sum(reclaimed.values()) + len(entries) != dispatched:
            raise SnapshotError(
                f"{dispatched} dispatched must be {completed} done + "
                f"{sum(reclaimed.values())} reclaimed + {len(entries)} open"
            )
        # Everything is checked: only now does the state change.
        self._open = entries
        self._dispatched = dispatched
        self._completed = completed
        self._reclaimed = reclaimed
        self._applied = applied
        self._live = set()
