"""What every resource adapter shares: its errors, the leak record, its
preamble (`AdapterBase`: the name, the one compensation, the PREPARING check
and the registering of a reservation), the journal seam, and the checks that
turn a JSON snapshot back into state.

This module sees the core only through `Compensation` and `Transaction[Any]`
(docs/design.md): it never imports the coordinator or the transport.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, final

from dispatchtx.errors import DispatchError, IllegalMove, Phase

if TYPE_CHECKING:
    from dispatchtx import Compensation, DispatchTables, Transaction

__all__ = [
    "AdapterBase",
    "JsonDict",
    "JournaledAdapter",
    "Leak",
    "NotReserved",
    "ResourceError",
    "SnapshotError",
    "Unavailable",
]

A = TypeVar("A")
R = TypeVar("R")

JsonDict = dict[str, Any]
"""A snapshot: str keys, values that `json.dumps` takes as they are."""


class ResourceError(DispatchError):
    """Root of the errors the resource adapters raise."""


class Unavailable(ResourceError):
    """Nothing can be reserved: no free capacity, already held, nothing pending."""


class NotReserved(ResourceError):
    """An undo, discard, release or success call for something not held.

    Raised inside a compensation it becomes a `CompensationFailure`: it means
    a second release or a reservation that never happened, never a silent
    negative count.
    """


class SnapshotError(ResourceError, ValueError):
    """`restore` was given a state that this adapter did not write."""


@final
@dataclass(frozen=True, slots=True)
class Leak:
    """One thing an adapter still holds: a reservation or a pending token.

    `kind` names what is held ("target", "lease", "pending token", ...) so a
    campaign can count leaks by kind; `dispatch_id` is the dispatch holding
    it, when the adapter knows it.
    """

    resource: str
    kind: str
    key: str
    dispatch_id: int | None

    def __str__(self) -> str:
        held_by = "" if self.dispatch_id is None else f" held by dispatch {self.dispatch_id}"
        return f"{self.resource}: {self.kind} {self.key}{held_by}"


class JournaledAdapter:
    """The journal seam every adapter here shares.

    Every change of an adapter's state runs through one small method named
    `_ev_<event>` whose arguments are JSON scalars (or JSON objects), and each
    such method is deterministic in (state, arguments): choices that use the
    adapter's RNG make the same draws when replayed. So a journal records
    `(adapter name, event, arguments)` before the method runs, and its
    reducer is `replay`: a snapshot plus the events after it rebuild the state
    exactly. `JOURNAL_EVENTS` lists the events of each adapter.
    """

    __slots__ = ()

    JOURNAL_EVENTS: ClassVar[tuple[str, ...]] = ()

    def replay(self, event: str, args: Sequence[Any]) -> None:
        """Apply one journaled event again (the journal's reducer)."""
        if event not in type(self).JOURNAL_EVENTS:
            raise ValueError(f"{type(self).__name__} journals no event {event!r}")
        getattr(self, f"_ev_{event}")(*args)


def require_preparing(txn: Transaction[Any], move: str) -> None:
    """Refuse a reservation on a dispatch that can no longer register one.

    Checked before anything is reserved, so a refused reservation leaves no
    trace (and no journal record) behind.
    """
    if txn.phase is not Phase.PREPARING:
        raise IllegalMove(txn.id, move, txn.phase, "a reservation needs a PREPARING dispatch")


def register(
    txn: Transaction[Any], compensation: Compensation[A], arg: A, undo: Callable[[A], object]
) -> None:
    """`txn.add(compensation, arg)` for a reservation already made.

    If `add` refuses, `undo` takes the reservation back at once (D2: nothing
    stays reserved without its compensation).
    """
    try:
        txn.add(compensation, arg)
    except BaseException:
        undo(arg)
        raise


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"an adapter name must be a non-empty str, got {name!r}")
    return name


class AdapterBase(Generic[R]):
    """The preamble every adapter here repeats, written once: a checked
    name, the one compensation declared from bound methods at construction
    (see `dispatchtx.resources`), the PREPARING check before a reservation
    and the registering of the reservation made.

    `R` is the compensation's argument (the reservation). A subclass calls
    `AdapterBase.__init__` where it checks its name: `tables.compensation`
    only builds the handle, so the methods it binds may use state set after.
    """

    __slots__ = ("_compensation", "_name")

    def __init__(
        self,
        tables: DispatchTables[Any],
        name: str,
        undo: Callable[[R], object] | None,
        discard: Callable[[R], object] | None,
        release: Callable[[R], object] | None,
    ) -> None:
        self._name = check_name(name)
        self._compensation: Compensation[R] = tables.compensation(
            self._name, undo, discard, release
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def compensation(self) -> Compensation[R]:
        return self._compensation

    def _require_preparing(self, txn: Transaction[Any], method: str = "reserve") -> None:
        """`require_preparing` for this adapter's `method`."""
        require_preparing(txn, f"{self._name}.{method}")

    def _register(self, txn: Transaction[Any], reservation: R, undo: Callable[[R], object]) -> R:
        """`register` the reservation just made with this adapter's
        compensation; return it."""
        register(txn, self._compensation, reservation, undo)
        return reservation

    def _leak(self, kind: str, key: str, dispatch_id: int | None) -> Leak:
        """A `Leak` reported under this adapter's name."""
        return Leak(self._name, kind, key, dispatch_id)


# -- reading a snapshot back ----------------------------------------------


def expect_kind(state: Mapping[str, Any], kind: str, version: int) -> None:
    if not isinstance(state, Mapping):
        raise SnapshotError(f"a {kind} snapshot must be a JSON object, got {type(state).__name__}")
    if state.get("kind") != kind or state.get("version") != version:
        raise SnapshotError(
            f"not a {kind} snapshot of version {version}: "
            f"kind={state.get('kind')!r} version={state.get('version')!r}"
        )


def get_int(obj: Mapping[str, Any], key: str, *, minimum: int | None = 0) -> int:
    value = obj.get(key)
    if type(value) is not int:
        raise SnapshotError(f"{key!r} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise SnapshotError(f"{key!r} must be >= {minimum}, got {value}")
    return value


def get_optional_int(obj: Mapping[str, Any], key: str) -> int | None:
    if obj.get(key) is None:
        return None
    return get_int(obj, key)


def get_float(obj: Mapping[str, Any], key: str) -> float:
    value = obj.get(key)
    if (type(value) is not int and type(value) is not float) or not math.isfinite(value):
        raise SnapshotError(f"{key!r} must be a finite number, got {value!r}")
    return float(value)


def get_optional_float(obj: Mapping[str, Any], key: str) -> float | None:
    if obj.get(key) is None:
        return None
    return get_float(obj, key)


def get_str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise SnapshotError(f"{key!r} must be a str, got {value!r}")
    return value


def get_optional_str(obj: Mapping[str, Any], key: str) -> str | None:
    if obj.get(key) is None:
        return None
    return get_str(obj, key)


def get_bool(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key)
    if not isinstance(value, bool):
        raise SnapshotError(f"{key!r} must be a bool, got {value!r}")
    return value


def get_list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise SnapshotError(f"{key!r} must be a JSON array, got {type(value).__name__}")
    return value


def get_dict(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise SnapshotError(f"{key!r} must be a JSON object, got {type(value).__name__}")
    return value


def as_object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


# -- the RNG as JSON --------------------------------------------------------

_MT_STATE_WORDS = 625  # random.Random's Mersenne Twister: 624 words plus the index


def rng_state_to_json(state: tuple[Any, ...]) -> JsonDict:
    """`random.Random.getstate()` as a JSON object."""
    version, internal, gauss_next = state
    return {"version": version, "internal": list(internal), "gauss_next": gauss_next}


def rng_state_from_json(obj: Any) -> tuple[Any, ...]:
    """The inverse of `rng_state_to_json`, checked, ready for `setstate`."""
    state = as_object(obj, "an RNG state")
    version = get_int(state, "version")
    internal = get_list(state, "internal")
    if len(internal) != _MT_STATE_WORDS or any(type(word) is not int for word in internal):
        raise SnapshotError(f"an RNG state holds {_MT_STATE_WORDS} ints")
    return (version, tuple(internal), get_optional_float(state, "gauss_next"))


def check_reward(reward: float) -> float:
    """Rewards feed Beta posteriors and UCB means: a finite number in [0, 1]."""
    value = float(reward)
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise ValueError(f"a reward must be in [0, 1], got {reward!r}")
    return value
