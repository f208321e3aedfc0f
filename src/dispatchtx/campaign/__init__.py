"""The fault campaign's realistic workload: coverage-guided fuzzing of bundled
pure-Python targets (`targets`), as a coordinator's `Workload` that reserves
every resource kind on every dispatch (`fuzz`)."""

from __future__ import annotations

from dispatchtx.campaign.fuzz import (
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
from dispatchtx.campaign.targets import TARGETS, Execution, Target, execute

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
