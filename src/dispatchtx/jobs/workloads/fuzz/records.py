"""The workload's configuration (`FuzzConfig`), its ledger of effects
(`FuzzLedger`), its adapters (`FuzzAdapters`) and the records it keeps per
seed, item and live dispatch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dispatchtx.jobs.workloads.fuzz.campaign_dir import Published
from dispatchtx.jobs.workloads.targets import (
    TARGETS,
)
from dispatchtx.resources import (
    AlgorithmSelection,
    AlgorithmSelector,
    ObjectCache,
    Pairing,
    ParameterAssignment,
    ParameterBandit,
    ProposalBoard,
    ProposalTicket,
    ResourceAdapter,
    SeedPairing,
    ShardLease,
    ShardLeases,
    TargetRegistry,
    TargetReservation,
)

# --------------------------------------------------------------------------
# the workload


@dataclass(frozen=True, slots=True)
class FuzzConfig:
    budget: int = 48  # exact work items in all, the initial ones included
    batches_per_seed: int = 2  # items per seed, each with its own RNG seed
    batch_size: int = 32
    target_capacity: int = 2  # concurrent dispatches per target
    similarity: float = 0.8  # Jaccard of coverage at which seeds share a family
    proposal_attempts: int = 3  # verification attempts before "result lost" rejects
    decoys: int = 1  # tokens of other targets proposed too (verification rejects them)
    rng_seed: int = 0
    targets: tuple[str, ...] = tuple(TARGETS)

    def __post_init__(self) -> None:
        unknown = set(self.targets) - TARGETS.keys()
        if unknown:
            raise ValueError(f"unknown targets {sorted(unknown)}")
        if self.budget < 1 or self.batches_per_seed < 1 or self.target_capacity < 1:
            raise ValueError("budget, batches_per_seed and target_capacity must be >= 1")


@dataclass
class FuzzLedger:
    """What triage did, shared by every coordinator of one run (as the
    campaign directory is): the counts a campaign report needs."""

    triage_runs: Counter[tuple[str, int]] = field(default_factory=Counter)
    committed_slot: dict[str, int] = field(default_factory=dict)
    # (item, slot, effect) -> times applied; each must stay at 1.
    local_effects: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    # Owner triage that found nothing to apply: "already applied" (a rerun)
    # or "state lost" (the reservation died with an earlier incarnation).
    local_skipped: Counter[str] = field(default_factory=Counter)
    files: Counter[Published] = field(default_factory=Counter)
    malformed_results: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def reruns(self) -> int:
        """Triage runs beyond the first per (item, slot): expected, harmless."""
        return sum(runs - 1 for runs in self.triage_runs.values())

    @property
    def effects_applied_twice(self) -> int:
        """Local effects applied more than once per (item, slot): must be 0."""
        return sum(count - 1 for count in self.local_effects.values() if count > 1)


@dataclass(frozen=True, slots=True)
class FuzzAdapters:
    """The resource adapters of one coordinator incarnation."""

    targets: TargetRegistry
    shards: ShardLeases
    params: ParameterBandit
    algorithms: AlgorithmSelector
    pairing: SeedPairing
    proposals: ProposalBoard
    objects: ObjectCache

    def all(self) -> list[ResourceAdapter]:
        return [
            self.targets,
            self.shards,
            self.params,
            self.algorithms,
            self.pairing,
            self.proposals,
            self.objects,
        ]


@dataclass(frozen=True, slots=True)
class _Seed:
    target: str
    object_id: str
    edges: frozenset[int]
    family: str  # the pairing unit: seeds of overlapping coverage


@dataclass(frozen=True, slots=True)
class _Item:
    work_id: str
    target: str
    seed: str  # object id
    family: str
    batch: int


@dataclass(frozen=True, slots=True)
class _Dispatch:
    """One live dispatch's reservations, by (work id, fencing token): what
    triage needs to apply the owner's local effects."""

    dispatch_id: int
    worker: int
    work_id: str
    token: int
    target: TargetReservation
    shard: ShardLease
    param: ParameterAssignment
    selection: AlgorithmSelection
    pairing: Pairing
    proposal: ProposalTicket | None
