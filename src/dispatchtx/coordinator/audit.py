"""The post-run audit: what must hold once a coordinator has shut down.

Nothing held (the coordinator's leases and journal entries, the tables, the
workload's adapters), nothing its workload finds wrong, and, read from the
shared store, no item left neither done nor quarantined. The simulator, the
MPI job and the campaign all judge a run by this one audit; the MPI job
writes it into its JSON report (`RunAudit.as_json`), where the campaign
reads it back (`RunAudit.from_json`) without parsing any message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dispatchtx.coordinator.loop import Coordinator
from dispatchtx.resources import Leak
from dispatchtx.store import ItemState, ItemStatus, WorkStore

__all__ = ["RunAudit", "audit", "unsettled_items"]

SETTLED = (ItemStatus.DONE, ItemStatus.QUARANTINED)


def unsettled_items(store: WorkStore) -> list[ItemState]:
    """Every readable item of the store that is neither done nor quarantined."""
    return [state for state in store.survey().states if state.status not in SETTLED]


@dataclass(frozen=True)
class RunAudit:
    leaks: tuple[Leak, ...] = ()
    problems: tuple[str, ...] = ()  # what the workload found wrong
    unsettled: tuple[str, ...] = ()  # work ids the store holds unsettled
    figures: dict[str, int] = field(default_factory=dict)  # the workload's own counts
    # Items of the store that cannot be read at all: key -> what is wrong.
    unreadable: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.leaks or self.problems or self.unsettled or self.unreadable)

    def leaks_per_resource(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for leak in self.leaks:
            counts[leak.resource] = counts.get(leak.resource, 0) + 1
        return counts

    def as_json(self) -> dict[str, Any]:
        return {
            "leaks": [
                {"resource": x.resource, "kind": x.kind, "key": x.key, "dispatch_id": x.dispatch_id}
                for x in self.leaks
            ],
            "problems": list(self.problems),
            "unsettled": list(self.unsettled),
            "figures": dict(self.figures),
            "unreadable": dict(self.unreadable),
        }

    @classmethod
    def from_json(cls, data: object) -> RunAudit:
        """The audit `as_json` wrote; ValueError naming what is malformed."""
        if not isinstance(data, dict):
            raise ValueError(f"an audit must be a JSON object, got {type(data).__name__}")
        try:
            leaks = tuple(
                Leak(str(x["resource"]), str(x["kind"]), str(x["key"]), _optional_int(x))
                for x in data["leaks"]
            )
            return cls(
                leaks,
                tuple(str(problem) for problem in data["problems"]),
                tuple(str(work_id) for work_id in data["unsettled"]),
                {str(name): _int(count) for name, count in data["figures"].items()},
                {str(key): str(why) for key, why in data.get("unreadable", {}).items()},
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"malformed audit: {error!r}") from error


def _optional_int(leak: dict[str, object]) -> int | None:
    value = leak["dispatch_id"]
    return None if value is None else _int(value)


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"{value!r} is not an int")
    return value


def audit(coordinator: Coordinator, store: WorkStore | None = None) -> RunAudit:
    """Audit `coordinator` after its `shutdown()`; with `store` (best one
    that reads the shared directory without injected faults), also the
    items left unsettled there."""
    workload = coordinator.workload
    survey = None if store is None else store.survey()
    unsettled = (
        () if survey is None else tuple(s.work_id for s in survey.states if s.status not in SETTLED)
    )
    return RunAudit(
        tuple(coordinator.leaks()),
        tuple(workload.problems()),
        unsettled,
        dict(workload.figures()),
        {} if survey is None else dict(survey.unreadable),
    )
