"""The worker side: `run_batch`, `fuzz_task` (one batch of one seed) and
`fuzz_locally`, a campaign without a coordinator."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from dispatchtx.jobs.workloads.fuzz.mutation import mutate, token_helps
from dispatchtx.jobs.workloads.fuzz.payload import (
    _MAX_CRASHES,
    _MAX_NEW_INPUTS,
    DEPTH_ARMS,
    STRATEGIES,
    FuzzPayload,
)
from dispatchtx.jobs.workloads.fuzz.result import BatchResult, Crash, Finding
from dispatchtx.jobs.workloads.targets import (
    TARGETS,
    Target,
    execute,
)
from dispatchtx.store import object_id_of
from dispatchtx.transport import Work

# --------------------------------------------------------------------------
# the task


def run_batch(target: Target, seed: bytes, payload: FuzzPayload) -> BatchResult:
    """One mutation batch of `seed` as `payload` says; deterministic."""
    rng = random.Random(payload.rng)
    dictionary = list(payload.dictionary)
    if payload.proposal is not None and payload.proposal[1] not in dictionary:
        dictionary.append(payload.proposal[1])  # the proposed token is tried too
    first = execute(target, seed)
    covered = set(first.edges)
    seen = set(payload.known) | covered
    new_inputs: list[Finding] = []
    crashes: dict[str, bytes] = {}
    if first.crash is not None:
        crashes[first.crash] = seed
    for _ in range(payload.batch_size):
        data = mutate(seed, rng, payload.strategy, payload.depth, dictionary)
        run = execute(target, data)
        covered |= run.edges
        if run.crash is not None:
            if run.crash not in crashes and len(crashes) < _MAX_CRASHES:
                crashes[run.crash] = data
        elif not run.edges <= seen and len(new_inputs) < _MAX_NEW_INPUTS:
            new_inputs.append(Finding(data, tuple(sorted(run.edges))))
            seen |= run.edges
    verdict: tuple[str, bool] | None = None
    if payload.proposal is not None:
        proposal_id, token = payload.proposal
        verdict = (proposal_id, token_helps(target, seed, token))
    return BatchResult(
        target.name,
        payload.seed,
        payload.batch_size + 1,
        tuple(sorted(covered)),
        tuple(sorted(covered.difference(payload.known))),
        tuple(new_inputs),
        tuple(Crash(data, signature) for signature, data in sorted(crashes.items())),
        verdict,
    )


def fuzz_task(work: Work, objects: Mapping[str, bytes]) -> bytes:
    """The worker's `TaskFn`: run the batch `work.payload` describes on the
    seed content the worker holds, and answer with the encoded result."""
    payload = FuzzPayload.decode(work.payload)
    seed = objects.get(payload.seed)
    if seed is None:
        raise LookupError(f"object miss: the worker lacks seed {payload.seed}")
    if object_id_of(seed) != payload.seed:
        raise ValueError(f"seed {payload.seed} content does not hash to its id")
    return run_batch(TARGETS[payload.target], seed, payload).encode()


@dataclass
class LocalRun:
    """What `fuzz_locally` found."""

    batches: int = 0
    executions: int = 0
    corpus: list[bytes] = field(default_factory=list)
    edges: set[int] = field(default_factory=set)
    crashes: dict[str, bytes] = field(default_factory=dict)  # signature -> input


def fuzz_locally(
    target_name: str,
    *,
    batches: int,
    batch_size: int = 32,
    seed: int = 0,
    stop_when_found: Collection[str] = (),
) -> LocalRun:
    """A single-process fuzz loop through `fuzz_task` (no coordinator): the
    corpus grows by the new inputs, strategies and depths take turns, and
    the target's whole dictionary counts as verified. For tests and demos."""
    target = TARGETS[target_name]
    run = LocalRun(corpus=list(target.seeds))
    depths = tuple(DEPTH_ARMS.values())
    wanted = set(stop_when_found)
    for number in range(batches):
        content = run.corpus[number % len(run.corpus)]
        object_id = object_id_of(content)
        payload = FuzzPayload(
            target.name,
            object_id,
            STRATEGIES[number % len(STRATEGIES)],
            depths[(number // len(STRATEGIES)) % len(depths)],
            batch_size,
            seed * 1_000_003 + number,
            tuple(sorted(run.edges)),
            target.dictionary,
        )
        work = Work(number, f"local-{number}", 1, payload.encode())
        result = BatchResult.decode(fuzz_task(work, {object_id: content}))
        run.batches += 1
        run.executions += result.executions
        run.edges.update(result.edges)
        run.corpus.extend(finding.input for finding in result.new_inputs)
        for crash in result.crashes:
            run.crashes.setdefault(crash.signature, crash.input)
        if wanted and wanted <= run.crashes.keys():
            break
    return run
