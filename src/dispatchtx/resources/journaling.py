"""The local resource adapters, kept in the local work journal (docs/design.md,
"Local work journal").

`AdapterJournal` owns one `Journal` for a coordinator's local adapters (the
`JournaledResource`s: targets, shards, parameters, algorithms, pairing,
proposals, the object cache's misses, the dispatch log), each addressed by
its `name`. Every state change of such an adapter already runs through one
`_ev_<event>` method with JSON arguments (resources/_base.py). The journal
makes each of those calls "append durably, then change memory": it appends
``Event(kind="<adapter name>.<event>", payload=[arguments...])`` and only
when that returned runs the method, with the arguments as replay decodes
them (so memory is what a replay of the file gives).

The hook. Opening the journal gives each adapter instance a subclass of its
own class, made once, whose `_ev_<event>` methods append and then call the
class's own, and switches the instance to it (`__class__` assignment: the
subclass adds no slots, so the layout is the same). Why this way: the
adapters have `__slots__`, so a bound method cannot be replaced on the
instance, and they call ``self._ev_x(...)`` directly, so a hook inside
`JournaledAdapter` would mean editing every adapter, or wrapping every
adapter class for every user, journaled or not. Here the adapters' code and
their unjournaled path stay as they are; the compensations they declared at
construction are bound methods that look ``_ev_x`` up on the instance's
class at each call, so they go through the hook too. `isinstance` still
holds; `type(adapter)` is the subclass (it keeps the class's name).

A failed append (an `OSError` from the disk) raises and leaves the adapter
untouched, so a reservation that cannot be journaled did not happen (the
dispatch boundary then undoes the others) and a triage effect that cannot be
journaled stays to be applied by triage's retry. The one exception is a
release: an event that a compensation (or the release on commit) makes,
listed per adapter class (`release_events`). The core runs each
compensation exactly once, so refusing it would leak the target, lease,
pairing or token for the rest of the process, and a briefly unwritable disk
must not keep in-process resources from being released (docs/design.md). So a
release whose record fails is applied in memory anyway and raises
`ReleaseNotJournaled` (the core records it as a `CompensationFailure`), and
the journal is marked out of step: before it appends anything else (and at
`sync`, at the end of a group, at `close`) it rewrites the file from memory,
as after a failed fsync (if that rewrite fails too, the new record is
refused, or, for another release, applied in memory only again). So no
record is ever appended to a file that lacks an earlier release. Until the
rewrite, a crash replays the resource as still held by a dispatch of a dead
incarnation, which is what a crash in the middle of any dispatch leaves too.
A record that was written but whose method then raised also marks the
journal out of step, so that replay does not apply what memory did not.

Opening replays the file into the adapters: the snapshot record (line 1,
written by compaction as ``{adapter name: adapter.snapshot()}``) restores
each adapter it names, and each event is replayed into the adapter it names.
An adapter the snapshot does not name keeps the state it was built with (a
new kind of resource). A record naming an adapter or event that is not here,
or arguments that are not a JSON array, raise `JournalCorrupt` naming the
file, the line and the reason; the adapters are then left as they were
before opening. A new (empty) journal starts with a snapshot of the adapters
as built, so that configuration made before opening is in the file too.

Compaction: `compact()` on demand; on its own every `compact_every`
records, right after the event that made it due is applied (the snapshot is
taken from the adapters, so it must include that event), or at the end of
the outermost group block.

Fsync policies (`FsyncPolicy`) apply as for any journal. Under `GROUP`, a
coordinator that reserves for several dispatches at once wraps those
reservations in `group()` and sends none of those dispatches before the
block has ended without raising::

    with adapter_journal.group():
        txns = [tables.prepare(worker) for worker in ready]
        for txn in txns:
            reserve_everything(txn)     # each record written, not yet fsynced
    # the exit fsynced them all: only now send
    for txn in txns:
        comm.send(message_for(txn), dest=txn.worker, tag=TAG_WORK)
        tables.sent(txn.id, clock.monotonic())

If the block or its exit raises, send none of them: `tables.abort` each one
(their undo records rewrite the journal first if it needs it). The
`tables.dispatch()` boundary cannot span the group, since it must end sent;
use `prepare` and `abort` as above. Under `EVERY` each record is durable when
its reservation returns; under `NONE` only `sync()` and compaction fsync.

Not thread-safe: one coordinator thread owns the journal and its adapters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, suppress
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Final, final

from dispatchtx.journal import (
    DEFAULT_COMPACT_EVERY,
    CompactionSchedule,
    Event,
    FsyncPolicy,
    Journal,
    JournalModel,
    JSONValue,
    ReplayReport,
    replay,
)
from dispatchtx.resources._base import JsonDict, ResourceError, SnapshotError, as_object
from dispatchtx.resources.algorithms import AlgorithmSelector
from dispatchtx.resources.cache import ObjectCache
from dispatchtx.resources.pairing import SeedPairing
from dispatchtx.resources.params import ParameterBandit
from dispatchtx.resources.proposals import ProposalBoard
from dispatchtx.resources.shards import ShardLeases
from dispatchtx.resources.targets import TargetRegistry

if TYPE_CHECKING:
    from dispatchtx.fs import FS
    from dispatchtx.resources import JournaledResource

__all__ = [
    "AdapterJournal",
    "ReleaseNotJournaled",
    "release_events",
    "replay_adapters",
]

# The release events of this package's adapters, listed side by side here so
# that the adapters' modules need no change. A class of your own declares
# them as `JOURNAL_RELEASE_EVENTS`, as `DispatchLog` does.
_RELEASE_EVENTS_OF: Final[Mapping[type, frozenset[str]]] = {
    TargetRegistry: frozenset({"release"}),
    ShardLeases: frozenset({"take_back", "fail", "release"}),
    ParameterBandit: frozenset({"retract", "forget", "settle"}),
    AlgorithmSelector: frozenset({"undo", "discard", "settle"}),
    SeedPairing: frozenset({"take_back", "unpair"}),
    ProposalBoard: frozenset({"take_back", "lose", "settle"}),
    ObjectCache: frozenset({"delivered", "forget_worker"}),
}

# Set on the subclass that hooks an adapter: the journal that owns it.
_HOOKED_BY: Final = "_dispatchtx_hooked_by"


def release_events(adapter_class: type) -> frozenset[str]:
    """The events of `adapter_class` that give something back: the ones its
    compensations and its release on commit make. A failed append of one of
    these still changes memory (see the module doc). A class declares them
    as `JOURNAL_RELEASE_EVENTS`; the adapters of this package are known."""
    declared: Iterable[str] | None = getattr(adapter_class, "JOURNAL_RELEASE_EVENTS", None)
    if declared is not None:
        return frozenset(declared)
    for cls in adapter_class.__mro__:
        known = _RELEASE_EVENTS_OF.get(cls)
        if known is not None:
            return known
    return frozenset()


class ReleaseNotJournaled(ResourceError):
    """A release whose journal record could not be written: it IS applied in
    memory, and the journal rewrites itself from memory before its next
    record. Raised inside a compensation, the core records it as a
    `CompensationFailure`; `error` is the disk's `OSError`."""

    def __init__(self, kind: str, error: OSError) -> None:
        super().__init__(
            f"{kind}: released in memory, but its journal record failed ({error}); "
            "the journal rewrites itself from memory before its next record"
        )
        self.kind = kind
        self.error = error


def _is_hooked(adapter: object) -> bool:
    return getattr(type(adapter), _HOOKED_BY, None) is not None


def _by_name(adapters: Iterable[JournaledResource]) -> dict[str, JournaledResource]:
    """The adapters by name, checked: distinct names, events that exist,
    not journaled by another journal already."""
    by_name: dict[str, JournaledResource] = {}
    for adapter in adapters:
        name = adapter.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"an adapter name must be a non-empty str, got {name!r}")
        if name in by_name:
            raise ValueError(f"two adapters are named {name!r}: the journal tells them by name")
        if _is_hooked(adapter):
            raise ValueError(f"adapter {name!r} is already kept by an open journal")
        cls = type(adapter)
        for event in cls.JOURNAL_EVENTS:
            if not callable(getattr(cls, f"_ev_{event}", None)):
                raise ValueError(f"{cls.__name__} lists event {event!r} but has no _ev_{event}")
        unknown = release_events(cls) - set(cls.JOURNAL_EVENTS)
        if unknown:
            raise ValueError(f"{cls.__name__}: release events {sorted(unknown)} are not events")
        by_name[name] = adapter
    return by_name


def _saved(adapters: Mapping[str, JournaledResource]) -> dict[str, JsonDict]:
    """The adapters' states, to put back if a replay fails half-way. No copy:
    a snapshot may share a configuration or payload with its adapter, but
    no event changes those in place, and `restore` builds everything else
    anew."""
    return {name: adapter.snapshot() for name, adapter in adapters.items()}


def _restore_all(adapters: Mapping[str, JournaledResource], saved: Mapping[str, JsonDict]) -> None:
    for name, state in saved.items():
        adapters[name].restore(state)


@final
class _AdapterModel:
    """The journal model over a set of adapters.

    The journal's own state is only the last event as decoded (so that the
    hook runs the method with the arguments replay will see): the adapters
    are the memory. While `replaying` (opening), `reduce` and `restore`
    apply the file to the adapters; live, they change nothing, since the
    journal computes the next state BEFORE it writes and the hook changes
    the adapter only after the write succeeded.
    """

    __slots__ = ("adapters", "replaying")

    def __init__(self, adapters: Mapping[str, JournaledResource]) -> None:
        self.adapters = adapters
        self.replaying = False

    def model(self) -> JournalModel[Event | None]:
        model: JournalModel[Event | None] = JournalModel(
            None, self.reduce, self.snapshot, self.restore
        )
        return model

    def reduce(self, state: Event | None, event: Event) -> Event | None:
        if not self.replaying:
            return event
        adapter_name, _, name = event.kind.rpartition(".")
        adapter = self.adapters.get(adapter_name)
        if adapter is None:
            raise SnapshotError(
                f"no adapter named {adapter_name!r} (event {name!r}); "
                f"this journal keeps {sorted(self.adapters)}"
            )
        if not isinstance(event.payload, list):
            raise SnapshotError(
                f"the arguments of {event.kind!r} must be a JSON array, got {event.payload!r}"
            )
        adapter.replay(name, event.payload)  # ValueError: an event it does not journal
        return None

    def snapshot(self, state: Event | None) -> JSONValue:
        return {name: adapter.snapshot() for name, adapter in self.adapters.items()}

    def restore(self, snapshot: JSONValue) -> Event | None:
        if not self.replaying:
            return None  # a rewrite from memory: the adapters are that memory
        states = as_object(snapshot, "a snapshot of the adapters")
        unknown = sorted(set(states) - set(self.adapters))
        if unknown:
            raise SnapshotError(
                f"the snapshot holds adapters {unknown} that are not here; "
                f"this journal keeps {sorted(self.adapters)}"
            )
        for name, state in states.items():
            self.adapters[name].restore(as_object(state, f"the snapshot of {name!r}"))
        return None


def replay_adapters(
    fs: FS,
    path: str,
    adapters: Iterable[JournaledResource],
    *,
    policy: FsyncPolicy = FsyncPolicy.EVERY,
) -> ReplayReport:
    """Rebuild `adapters` from the journal at `path` without changing the
    file or keeping it open (an audit, or a look at what a crash would
    leave). Raises `JournalCorrupt` (the adapters are then as they were)."""
    by_name = _by_name(adapters)
    saved = _saved(by_name)
    model = _AdapterModel(by_name)
    model.replaying = True
    try:
        return replay(fs, path, model.model(), policy=policy)[1]
    except BaseException:
        _restore_all(by_name, saved)
        raise


class AdapterJournal:
    """One journal for a coordinator's local adapters: every adapter event
    is appended durably (by `policy`) before it changes memory.

    Opening replays the file into `adapters` (see the module doc) and hooks
    them. Raises `JournalCorrupt` or `OSError`; the adapters are then left
    as they were. `compact_every` (None: never on its own) is how many
    records are appended between automatic compactions.
    """

    def __init__(
        self,
        fs: FS,
        path: str,
        adapters: Iterable[JournaledResource],
        *,
        policy: FsyncPolicy = FsyncPolicy.EVERY,
        compact_every: int | None = DEFAULT_COMPACT_EVERY,
    ) -> None:
        self._compaction = CompactionSchedule(compact_every)
        by_name = _by_name(adapters)
        self._adapters = by_name
        self._model = _AdapterModel(by_name)
        # The file and memory differ: a release applied without its record,
        # or a record whose method then raised. The next write rewrites the
        # file from memory first.
        self._out_of_step = False
        self._releases_not_journaled = 0
        self._applying = False  # inside a hooked event method

        saved = _saved(by_name)
        self._model.replaying = True
        try:
            # The journal never compacts on its own: it would snapshot the
            # adapters before the hook applied the record that made it due.
            journal = Journal(fs, path, self._model.model(), policy=policy, compact_every=None)
        except BaseException:
            _restore_all(by_name, saved)
            raise
        finally:
            self._model.replaying = False
        if journal.replay_report.last_seq == 0:
            # A new journal: start it with the adapters as built.
            try:
                journal.compact()
            except Exception:
                with suppress(OSError):
                    journal.close()
                raise
        self._journal = journal
        self._compaction.start(journal.replay_report.records_applied)
        for name, adapter in by_name.items():
            self._hook(name, adapter)

    # -- looking ------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._journal.path

    @property
    def policy(self) -> FsyncPolicy:
        return self._journal.policy

    @property
    def adapters(self) -> Mapping[str, JournaledResource]:
        """The adapters kept, by name."""
        return MappingProxyType(self._adapters)

    @property
    def replay_report(self) -> ReplayReport:
        """What opening replayed and dropped."""
        return self._journal.replay_report

    @property
    def out_of_step(self) -> bool:
        """Whether memory and the file differ (a release applied without its
        record): the next write first rewrites the file from memory."""
        return self._out_of_step

    @property
    def needs_rewrite(self) -> bool:
        """Whether the next write first rewrites the file from memory: out
        of step, or the journal is poisoned (a failed fsync or cut-back)."""
        return self._out_of_step or self._journal.poisoned

    @property
    def releases_not_journaled(self) -> int:
        """Releases applied in memory whose record failed (a campaign metric)."""
        return self._releases_not_journaled

    @property
    def unsynced(self) -> int:
        """Records written but not yet fsynced (lost on a power loss)."""
        return self._journal.unsynced

    @property
    def in_group(self) -> bool:
        return self._journal.in_group

    @property
    def last_compaction_error(self) -> Exception | None:
        """Why the last automatic compaction failed, if it did; it does not
        fail the event that made it due, which is applied and durable."""
        return self._compaction.last_error

    @property
    def closed(self) -> bool:
        return self._journal.closed

    def __repr__(self) -> str:
        return (
            f"AdapterJournal({self.path!r}, policy={self.policy.value}, "
            f"adapters={sorted(self._adapters)}, out_of_step={self._out_of_step})"
        )

    # -- writing --------------------------------------------------------------

    def group(self) -> AbstractContextManager[AdapterJournal]:
        """A block whose records are fsynced together when it ends (under
        `GROUP`; see `Journal.group` and the module doc: send none of the
        block's dispatches before it ended). The end also rewrites an
        out-of-step file and compacts when due; it raises `OSError` if
        making the records durable failed."""
        return _AdapterGroup(self)

    def sync(self) -> None:
        """Make every record durable, whatever the policy; an out-of-step or
        poisoned file is rewritten from memory. Raises `OSError`."""
        if self._out_of_step:
            self._catch_up()
        else:
            self._journal.sync()

    def compact(self) -> None:
        """Rewrite the journal now as one snapshot of the adapters (durable
        when this returns). Raises `OSError`."""
        self._catch_up()

    def close(self) -> None:
        """Close the journal; an out-of-step file is rewritten first (if that
        raises `OSError`, the journal stays open). No fsync otherwise, as
        `Journal.close`. The adapters stay hooked: an event after closing
        raises `ValueError` and changes nothing. Closing twice is a no-op."""
        if self._journal.closed:
            return
        if self._journal.in_group:
            raise ValueError(f"journal {self.path}: close inside a group block")
        if self._out_of_step:
            self._catch_up()
        self._journal.close()

    def __enter__(self) -> AdapterJournal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # A kill or KeyboardInterrupt leaves with no more I/O, as a dead
        # process would.
        if exc is None or isinstance(exc, Exception):
            self.close()

    # -- inside ---------------------------------------------------------------

    def _hook(self, name: str, adapter: JournaledResource) -> None:
        cls = type(adapter)
        releases = release_events(cls)
        namespace: dict[str, Any] = {
            "__slots__": (),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            _HOOKED_BY: self,
        }
        for event in cls.JOURNAL_EVENTS:
            method = getattr(cls, f"_ev_{event}")
            namespace[f"_ev_{event}"] = self._journaled(
                f"{name}.{event}", method, event in releases
            )
        # `type` defers to the class's own metaclass, if it has one.
        hooked = type(cls.__name__, (cls,), namespace)
        object.__setattr__(adapter, "__class__", hooked)

    def _journaled(
        self, kind: str, method: Callable[..., Any], is_release: bool
    ) -> Callable[..., Any]:
        apply = self._apply

        @functools.wraps(method)
        def journaled_event(adapter: object, *args: Any) -> Any:
            return apply(kind, is_release, method, adapter, args)

        return journaled_event

    def _apply(
        self,
        kind: str,
        is_release: bool,
        method: Callable[..., Any],
        adapter: object,
        args: tuple[Any, ...],
    ) -> Any:
        """Append the event durably, then run its method; see the module doc
        for a failed append."""
        if self._applying:
            # An event method calling another makes one event: replaying the
            # outer one makes the inner call again.
            return method(adapter, *args)
        self._applying = True
        try:
            try:
                if self._out_of_step:
                    self._catch_up()
                decoded = self._journal.append(Event(kind, list(args)))
            except OSError as error:
                if not is_release:
                    raise
                method(adapter, *args)
                self._out_of_step = True
                self._releases_not_journaled += 1
                raise ReleaseNotJournaled(kind, error) from error
            assert decoded is not None and isinstance(decoded.payload, list)
            try:
                result = method(adapter, *decoded.payload)
            except BaseException:
                # The record is in the file, the change is not in memory:
                # replace the file by memory before anything else is written.
                self._out_of_step = True
                raise
            self._compaction.count()
        finally:
            self._applying = False
        if not self._journal.in_group:
            self._compact_if_due()
        return result

    def _catch_up(self) -> None:
        """Rewrite the file from memory (the adapters)."""
        self._journal.compact()
        self._out_of_step = False
        self._compaction.compacted()

    def _compact_if_due(self) -> None:
        # The event that made it due is applied and as durable as the policy
        # says: a failure is reported, not raised (see `CompactionSchedule`).
        self._compaction.run_if_due(self._catch_up)


@final
class _AdapterGroup:
    """The context manager `AdapterJournal.group()` returns."""

    __slots__ = ("_inner", "_owner")

    def __init__(self, owner: AdapterJournal) -> None:
        self._owner = owner
        self._inner: AbstractContextManager[Journal[Event | None]] = owner._journal.group()

    def __enter__(self) -> AdapterJournal:
        self._inner.__enter__()
        return self._owner

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        owner = self._owner
        self._inner.__exit__(exc_type, exc, traceback)  # fsyncs under GROUP
        if owner.in_group or not (exc is None or isinstance(exc, Exception)):
            return
        if owner.out_of_step:
            owner._catch_up()
        owner._compact_if_due()
