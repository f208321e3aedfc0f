"""A workload's queue of items: the first half of the `Workload` protocol.

`take`, `give_back`, `done`, `drop` and `remaining` mean exactly what the
`Workload` protocol says; a workload of its own may hold a `WorkQueue` and
forward those five calls to it, and keep `reserve`, `object_content` and
`triage` for itself.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable

__all__ = ["QueueState", "WorkQueue"]


class QueueState(enum.Enum):
    PENDING = "pending"  # waiting to be taken
    TAKEN = "taken"  # handed to the coordinator, neither done nor given back
    DONE = "done"  # done in the store (by this coordinator or another)
    DROPPED = "dropped"  # will never be done (quarantined)


_UNFINISHED = (QueueState.PENDING, QueueState.TAKEN)


class WorkQueue:
    """Items in first-in, first-out order, each in one `QueueState`.

    Every call is O(1) amortized: a given-back item goes to the back, and an
    item finished while waiting is skipped when it reaches the front.
    """

    __slots__ = ("_order", "_state", "_unfinished")

    def __init__(self, work_ids: Iterable[str] = ()) -> None:
        self._order: deque[str] = deque()
        self._state: dict[str, QueueState] = {}
        self._unfinished = 0
        self.add(work_ids)

    def add(self, work_ids: Iterable[str]) -> None:
        """Queue new items; an id queued before is an error (nothing is added)."""
        new = list(work_ids)
        seen: set[str] = set()
        for work_id in new:
            if work_id in self._state or work_id in seen:
                raise ValueError(f"{work_id!r} was added before")
            seen.add(work_id)
        for work_id in new:
            self._state[work_id] = QueueState.PENDING
            self._order.append(work_id)
        self._unfinished += len(new)

    def take(self) -> str | None:
        """The first pending item, now TAKEN; None when none is pending."""
        order, state = self._order, self._state
        while order:
            work_id = order.popleft()
            if state[work_id] is QueueState.PENDING:
                state[work_id] = QueueState.TAKEN
                return work_id
        return None

    def give_back(self, work_id: str) -> None:
        """A TAKEN item is pending again, at the back; anything else is left."""
        if self._state.get(work_id) is QueueState.TAKEN:
            self._state[work_id] = QueueState.PENDING
            self._order.append(work_id)

    def give_back_taken(self) -> int:
        """Every TAKEN item pending again, in the order added (a new
        coordinator incarnation: the dispatches of the dead one died with
        it); returns how many."""
        taken = [w for w, state in self._state.items() if state is QueueState.TAKEN]
        for work_id in taken:
            self.give_back(work_id)
        return len(taken)

    def done(self, work_id: str) -> bool:
        """Mark an unfinished item DONE; False (and no change) if it is
        unknown or already done or dropped."""
        return self._finish(work_id, QueueState.DONE)

    def drop(self, work_id: str) -> bool:
        """Mark an unfinished item DROPPED; False as for `done`."""
        return self._finish(work_id, QueueState.DROPPED)

    def _finish(self, work_id: str, final: QueueState) -> bool:
        if self._state.get(work_id) not in _UNFINISHED:
            return False
        self._state[work_id] = final
        self._unfinished -= 1
        return True

    def remaining(self) -> int:
        """Items neither done nor dropped."""
        return self._unfinished

    def state(self, work_id: str) -> QueueState:
        """The item's state; KeyError for an id never added."""
        return self._state[work_id]

    def items(self) -> list[str]:
        """Every id ever added, in the order added."""
        return list(self._state)

    def __contains__(self, work_id: object) -> bool:
        return work_id in self._state

    def __len__(self) -> int:
        return len(self._state)
