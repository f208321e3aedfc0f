"""The coordinator: the master loop over a transport and the shared store
(`loop`), what it dispatches (`workload`: the protocol a workload of one's
own implements), what it counts (`stats`), a workload's queue of items (`queue`),
the post-run audit (`audit`), and the points where faults can be injected
into it (`faults`)."""

from __future__ import annotations

from dispatchtx.coordinator.faults import CoordinatorKilled, FaultPlan, FaultPoint, InjectedFault
from dispatchtx.coordinator.loop import Coordinator, CoordinatorConfig
from dispatchtx.coordinator.queue import QueueState, WorkQueue
from dispatchtx.coordinator.stats import CoordinatorStats, Stat
from dispatchtx.coordinator.workload import DispatchTag, Workload

__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorKilled",
    "CoordinatorStats",
    "DispatchTag",
    "FaultPlan",
    "FaultPoint",
    "InjectedFault",
    "QueueState",
    "Stat",
    "WorkQueue",
    "Workload",
]
