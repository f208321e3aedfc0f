"""The coordinator: the master loop over a transport and the shared store
(`loop`), and the points where faults can be injected into it (`faults`)."""

from __future__ import annotations

from dispatchtx.coordinator.faults import CoordinatorKilled, FaultPlan, FaultPoint, InjectedFault
from dispatchtx.coordinator.loop import Coordinator, CoordinatorConfig, Workload

__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorKilled",
    "FaultPlan",
    "FaultPoint",
    "InjectedFault",
    "Workload",
]
