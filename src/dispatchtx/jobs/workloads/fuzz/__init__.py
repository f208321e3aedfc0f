"""The campaign's workload: a small coverage-guided fuzzing campaign against
the bundled targets (targets.py), driven by a coordinator (docs/design.md).

Three parts:

- The worker side, `fuzz_task`: one exact work item is one mutation batch
  of one seed of one target. The payload (`FuzzPayload`, JSON text) names
  the target, the seed (a content-addressed object the message carries
  when the worker lacks it), the mutation strategy and depth, the batch
  size, the RNG seed, the coverage the coordinator already knows, the
  verified dictionary tokens and, sometimes, a proposed token to verify.
  The answer (`BatchResult`, compact JSON bytes) lists the edges the batch
  covered, the inputs that found new coverage, the crashing inputs with
  their signatures and the proposal's verdict. Same payload and seed, same
  bytes.

- The coordinator side, `FuzzWorkload`: the coordinator's `Workload`. Each
  dispatch reserves one of every resource kind through its adapter (see
  `FuzzWorkload.reserve`). Triage is idempotent per (item, commit slot):
  shared effects are immutable files linked into place in the campaign
  directory; local effects (bandit reward, algorithm feedback, proposal
  verdict) are applied by the owner only, once per (item, slot).

- The audit, `check_campaign_dir`: re-derives from disk what a run left
  (corpus names, crash reproduction, coverage as the union of the deltas,
  one commit slot per item) for the campaign report.

Campaign directory layout (every file immutable, written once by
write-temp + link + fsync of its directory; EEXIST means already there)::

    corpus/<sha256 of the input>              an input that found new coverage
    crashes/<target>.<site>/<item>.<slot>     the crashing input, per signature
    coverage/deltas/<item>.<slot>             the edges a committed batch covered
    tmp/.tmp.<random>                         temp files (garbage after a kill)

Coverage is the union of the deltas, never a counter.

The modules: `payload` (constants, `FuzzPayload`), `mutation`, `result`
(`BatchResult`), `task` (`fuzz_task`, `fuzz_locally`), `campaign_dir`,
`records` (`FuzzConfig`, `FuzzLedger`, `FuzzAdapters`), `workload`
(`FuzzWorkload`), `check` (`check_campaign_dir`, `committed_slots`).
"""

from __future__ import annotations

from dispatchtx.jobs.workloads.fuzz.campaign_dir import (
    CampaignDir,
    Published,
    decode_delta,
    encode_delta,
)
from dispatchtx.jobs.workloads.fuzz.check import CampaignCheck, check_campaign_dir, committed_slots
from dispatchtx.jobs.workloads.fuzz.mutation import mutate, token_helps
from dispatchtx.jobs.workloads.fuzz.payload import (
    DEPTH_ARMS,
    STRATEGIES,
    FuzzPayload,
    MalformedPayload,
)
from dispatchtx.jobs.workloads.fuzz.records import FuzzAdapters, FuzzConfig, FuzzLedger
from dispatchtx.jobs.workloads.fuzz.result import BatchResult, Crash, Finding, MalformedResult
from dispatchtx.jobs.workloads.fuzz.task import LocalRun, fuzz_locally, fuzz_task, run_batch
from dispatchtx.jobs.workloads.fuzz.workload import FuzzWorkload

__all__ = [
    "DEPTH_ARMS",
    "STRATEGIES",
    "BatchResult",
    "CampaignCheck",
    "CampaignDir",
    "Crash",
    "Finding",
    "FuzzAdapters",
    "FuzzConfig",
    "FuzzLedger",
    "FuzzPayload",
    "FuzzWorkload",
    "LocalRun",
    "MalformedPayload",
    "MalformedResult",
    "Published",
    "check_campaign_dir",
    "decode_delta",
    "encode_delta",
    "committed_slots",
    "fuzz_locally",
    "fuzz_task",
    "mutate",
    "run_batch",
    "token_helps",
]
