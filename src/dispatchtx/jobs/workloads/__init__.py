"""The workloads the jobs run: a small self-checking one (`hash`) and the
campaign's realistic one, coverage-guided fuzzing of bundled pure-Python
targets (`targets`) as a coordinator's `Workload` that reserves every
resource kind on every dispatch (`fuzz`)."""

from __future__ import annotations

from dispatchtx.jobs.workloads.fuzz import (
    DEPTH_ARMS,
    STRATEGIES,
    BatchResult,
    CampaignCheck,
    CampaignDir,
    FuzzConfig,
    FuzzLedger,
    FuzzPayload,
    FuzzWorkload,
    check_campaign_dir,
    committed_slots,
    fuzz_locally,
    fuzz_task,
)
from dispatchtx.jobs.workloads.targets import TARGETS, Execution, Target, execute

__all__ = [
    "DEPTH_ARMS",
    "STRATEGIES",
    "TARGETS",
    "BatchResult",
    "CampaignCheck",
    "CampaignDir",
    "Execution",
    "FuzzConfig",
    "FuzzLedger",
    "FuzzPayload",
    "FuzzWorkload",
    "Target",
    "check_campaign_dir",
    "committed_slots",
    "execute",
    "fuzz_locally",
    "fuzz_task",
]
