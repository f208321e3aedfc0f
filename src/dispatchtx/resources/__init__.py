"""Resource adapters: one module per kind of thing a dispatch reserves
(docs/design.md).

Every adapter follows the same shape, which `ResourceAdapter` states for
resource kinds of your own:

1. At construction, declare the compensation ONCE, from bound methods::

       self._compensation = tables.compensation(
           "my-resource", self.undo, self.discard, self.release
       )

   `undo` runs if the dispatch is never sent (D3), `discard` if it was sent
   but its result is stale or lost (D4), `release` once it is committed
   (D6); any of them may be None.

2. Per dispatch, `reserve(txn, ...)` makes the reservation and registers it
   with `txn.add(self._compensation, reservation)`: one prebound handle plus
   one argument, no closure per dispatch. The core runs exactly one of the
   three, exactly once, whatever way the dispatch ends.

3. `leaks()` lists what is still reserved or pending, so a test or a
   campaign can assert that nothing leaked once every dispatch has ended
   (after `tables.shutdown()` and finishing the COMMITTING ones).

An adapter whose state is local to this coordinator (all of those here)
is also a `JournaledResource`: `snapshot()` returns its state as JSON,
`restore()` rebuilds it, and every state change runs through one small
event method, listed in `JOURNAL_EVENTS`, so that a journal can record the
events and `replay` them.

Adapters see the core only through `Compensation`, `Transaction.add` (and,
for the object cache, `tables.missing` and `Transaction.ship`): they never
import the coordinator or the transport.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from dispatchtx.resources._base import (
    JournaledAdapter,
    JsonDict,
    Leak,
    NotReserved,
    ResourceError,
    SnapshotError,
    Unavailable,
)
from dispatchtx.resources.algorithms import AlgorithmSelection, AlgorithmSelector
from dispatchtx.resources.cache import ObjectCache, RecarriedObjects
from dispatchtx.resources.dispatch_log import (
    NEVER_SENT,
    OWNER_RESTARTED,
    RESULT_UNTRUSTED,
    DispatchEntry,
    DispatchLog,
)
from dispatchtx.resources.journaling import (
    AdapterJournal,
    ReleaseNotJournaled,
    release_events,
    replay_adapters,
)
from dispatchtx.resources.pairing import Pairing, SeedPairing
from dispatchtx.resources.params import BanditPolicy, ParameterAssignment, ParameterBandit
from dispatchtx.resources.proposals import (
    RESULT_LOST,
    MissingVerdict,
    ProposalBoard,
    ProposalState,
    ProposalTicket,
)
from dispatchtx.resources.shards import ShardLease, ShardLeases
from dispatchtx.resources.targets import TargetRegistry, TargetReservation

if TYPE_CHECKING:
    from dispatchtx import Compensation, Transaction

__all__ = [
    "NEVER_SENT",
    "OWNER_RESTARTED",
    "RESULT_LOST",
    "RESULT_UNTRUSTED",
    "AdapterJournal",
    "AlgorithmSelection",
    "AlgorithmSelector",
    "BanditPolicy",
    "DispatchEntry",
    "DispatchLog",
    "JournaledAdapter",
    "JournaledResource",
    "JsonDict",
    "Leak",
    "MissingVerdict",
    "NotReserved",
    "ObjectCache",
    "Pairing",
    "ParameterAssignment",
    "ParameterBandit",
    "ProposalBoard",
    "ProposalState",
    "ProposalTicket",
    "RecarriedObjects",
    "ReleaseNotJournaled",
    "ResourceAdapter",
    "ResourceError",
    "SeedPairing",
    "ShardLease",
    "ShardLeases",
    "SnapshotError",
    "TargetRegistry",
    "TargetReservation",
    "Unavailable",
    "all_leaks",
    "release_events",
    "replay_adapters",
]


@runtime_checkable
class ResourceAdapter(Protocol):
    """What a resource adapter offers; implement it for a kind of your own.

    Example, a pool of licences that a dispatch holds while it runs::

        class Licences:
            def __init__(self, tables: DispatchTables[Any], count: int) -> None:
                self.free = count
                self.held: dict[int, None] = {}
                self._comp = tables.compensation("licences", self.give_back,
                                                 self.give_back, self.give_back)
            name = "licences"
            @property
            def compensation(self) -> Compensation[int]:
                return self._comp
            def reserve(self, txn: Transaction[Any]) -> int:
                if not self.free:
                    raise Unavailable("no licence")
                self.free -= 1
                self.held[txn.id] = None
                txn.add(self._comp, txn.id)   # the dispatch id is the argument
                return txn.id
            def give_back(self, dispatch_id: int) -> None:
                del self.held[dispatch_id]
                self.free += 1
            def leaks(self) -> list[Leak]:
                return [Leak("licences", "licence", str(d), d) for d in self.held]

    Rules the core relies on:

    - reserve only on a PREPARING transaction, and call `txn.add` for every
      reservation made (D2); if `add` raises, take the reservation back;
    - a compensation must not assume another one ran before it: the core
      runs them newest first, one side each, and records (never stops at) a
      compensation that raises;
    - a compensation for something not held should raise (it is recorded as
      a `CompensationFailure`), never push a count below zero.
    """

    @property
    def name(self) -> str:
        """The compensation's name: failures and leaks are reported under it."""
        ...

    @property
    def compensation(self) -> Compensation[Any]:
        """The one compensation declared at construction."""
        ...

    def reserve(self, txn: Transaction[Any], /, *args: Any, **kwargs: Any) -> object:
        """Reserve for one dispatch and `txn.add(self.compensation, arg)`."""
        ...

    def leaks(self) -> list[Leak]:
        """What is still reserved or pending; empty when nothing leaked."""
        ...


@runtime_checkable
class JournaledResource(ResourceAdapter, Protocol):
    """An adapter with local state that a journal can rebuild.

    Each state change is an event: a method `_ev_<event>` whose arguments
    are JSON values and which is deterministic in (state, arguments);
    `replay(event, args)` applies one again. A snapshot plus the events
    recorded after it rebuild the state exactly.
    """

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]]

    def snapshot(self) -> dict[str, Any]:
        """The adapter's local state, as JSON."""
        ...

    def restore(self, state: Mapping[str, Any]) -> None:
        """Rebuild the local state from a `snapshot()` (before dispatching)."""
        ...

    def replay(self, event: str, args: Sequence[Any]) -> None:
        """Apply one journaled event again (the journal's reducer)."""
        ...


def all_leaks(adapters: Sequence[ResourceAdapter]) -> list[Leak]:
    """Every adapter's leaks together, for one assertion after shutdown."""
    return [leak for adapter in adapters for leak in adapter.leaks()]
