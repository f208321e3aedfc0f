"""The campaign's workload: a small coverage-guided fuzzing campaign against
the bundled targets (targets.py), driven by a coordinator (DESIGN.md §4, §6).

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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from dispatchtx import Compensation, DispatchTables, Transaction
from dispatchtx.fs import FS, TEMP_PREFIX
from dispatchtx.jobs.workloads.targets import (
    MAX_INPUT,
    TARGETS,
    Target,
    execute,
    target_of_edge,
    target_of_signature,
)
from dispatchtx.objects import object_id_of
from dispatchtx.resources import (
    AlgorithmSelection,
    AlgorithmSelector,
    DispatchLog,
    Leak,
    NotReserved,
    ObjectCache,
    Pairing,
    ParameterAssignment,
    ParameterBandit,
    ProposalBoard,
    ProposalState,
    ProposalTicket,
    ResourceAdapter,
    SeedPairing,
    ShardLease,
    ShardLeases,
    TargetRegistry,
    TargetReservation,
)
from dispatchtx.store import ItemState, ItemStatus
from dispatchtx.transport import Work

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
    "committed_slots",
    "fuzz_locally",
    "fuzz_task",
    "mutate",
    "run_batch",
    "token_helps",
]

#: The multi-stage algorithm's stages: the mutation strategies.
STRATEGIES: Final = ("bitflip", "bytes", "havoc", "dictionary")
#: The bandit's arms: how many mutations are stacked on each input.
DEPTH_ARMS: Final = MappingProxyType({f"depth-{depth}": depth for depth in (1, 2, 4, 8)})

# A result stays small: at most this many new inputs and crash signatures.
_MAX_NEW_INPUTS: Final = 8
_MAX_CRASHES: Final = 4
_MAX_BATCH: Final = 4096
_MAX_DEPTH: Final = 64
# Where a proposed token is tried in the seed when it is verified.
_VERIFY_POSITIONS: Final = 9

_OBJECT_ID = re.compile(r"[0-9a-f]{64}")
# Item ids become file names: <target>-<16 hex of the seed id>-<batch number>.
_ITEM_ID = re.compile(r"([a-z][a-z0-9_]{0,31})-([0-9a-f]{16})-([0-9]{1,6})")
_ENTRY_NAME = re.compile(r"(.+)\.([1-9][0-9]{0,18})")


# --------------------------------------------------------------------------
# the payload


class MalformedPayload(ValueError):
    """A work payload that is not a well-formed `FuzzPayload`."""


@dataclass(frozen=True, slots=True)
class FuzzPayload:
    """What one mutation batch runs: everything the result depends on,
    apart from the seed's content (named by its object id)."""

    target: str
    seed: str  # object id of the seed's content
    strategy: str
    depth: int
    batch_size: int
    rng: int
    known: tuple[int, ...] = ()  # coverage the coordinator already has
    dictionary: tuple[bytes, ...] = ()  # verified tokens for the dictionary stages
    proposal: tuple[str, bytes] | None = None  # (proposal id, token) to verify

    def encode(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "seed": self.seed,
                "strategy": self.strategy,
                "depth": self.depth,
                "batch": self.batch_size,
                "rng": self.rng,
                "known": list(self.known),
                "dictionary": [token.hex() for token in self.dictionary],
                "proposal": None
                if self.proposal is None
                else [self.proposal[0], self.proposal[1].hex()],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: object) -> FuzzPayload:
        if not isinstance(text, str):
            raise MalformedPayload(f"a fuzz payload is JSON text, not {type(text).__name__}")
        try:
            fields = json.loads(text)
            proposal = fields["proposal"]
            payload = cls(
                _checked(fields["target"], str),
                _checked(fields["seed"], str),
                _checked(fields["strategy"], str),
                _checked(fields["depth"], int),
                _checked(fields["batch"], int),
                _checked(fields["rng"], int),
                tuple(_checked(edge, int) for edge in fields["known"]),
                tuple(bytes.fromhex(_checked(token, str)) for token in fields["dictionary"]),
                None
                if proposal is None
                else (_checked(proposal[0], str), bytes.fromhex(_checked(proposal[1], str))),
            )
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise MalformedPayload(f"bad fuzz payload: {error}") from error
        if payload.target not in TARGETS:
            raise MalformedPayload(f"unknown target {payload.target!r}")
        if _OBJECT_ID.fullmatch(payload.seed) is None:
            raise MalformedPayload(f"bad seed object id {payload.seed!r}")
        if payload.strategy not in STRATEGIES:
            raise MalformedPayload(f"unknown strategy {payload.strategy!r}")
        if not (1 <= payload.depth <= _MAX_DEPTH and 1 <= payload.batch_size <= _MAX_BATCH):
            raise MalformedPayload(f"depth {payload.depth} or batch {payload.batch_size} too big")
        return payload


def _checked(value: Any, kind: type[Any]) -> Any:
    # bool is an int subclass: never accept it where an int is meant
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


# --------------------------------------------------------------------------
# mutation

_INTERESTING: Final = b'\x00\xff019-\n "\\()[]{}=.'
_PRINTABLE: Final = bytes(range(32, 127)) + b"\n"
_OPS: Final = {
    "bitflip": ("flip",),
    "bytes": ("set", "interesting", "insert", "delete"),
    "havoc": (
        "flip",
        "set",
        "interesting",
        "insert",
        "delete",
        "clone",
        "token-insert",
        "token-overwrite",
    ),
    "dictionary": ("token-insert", "token-overwrite"),
}


def mutate(
    seed: bytes, rng: random.Random, strategy: str, depth: int, dictionary: Sequence[bytes]
) -> bytes:
    """`depth` stacked mutations of `seed` drawn from `strategy`'s operators."""
    data = bytearray(seed)
    ops = _OPS[strategy]
    for _ in range(depth):
        op = ops[rng.randrange(len(ops))]
        if op.startswith("token") and not dictionary:
            op = "insert"  # no verified token yet: a printable byte instead
        size = len(data)
        if op == "flip":
            if size:
                data[rng.randrange(size)] ^= 1 << rng.randrange(8)
        elif op == "set":
            if size:
                data[rng.randrange(size)] = rng.randrange(256)
        elif op == "interesting":
            if size:
                data[rng.randrange(size)] = _INTERESTING[rng.randrange(len(_INTERESTING))]
        elif op == "insert":
            data.insert(rng.randrange(size + 1), _PRINTABLE[rng.randrange(len(_PRINTABLE))])
        elif op == "delete":
            if size > 1:
                start = rng.randrange(size)
                del data[start : start + 1 + rng.randrange(4)]
        elif op == "clone":
            if size:
                start = rng.randrange(size)
                chunk = data[start : start + 1 + rng.randrange(8)]
                at = rng.randrange(size + 1)
                data[at:at] = chunk
        else:
            token = dictionary[rng.randrange(len(dictionary))]
            at = rng.randrange(size + 1)
            end = at if op == "token-insert" else at + len(token)
            data[at:end] = token
    return bytes(data[:MAX_INPUT])


def token_helps(target: Target, seed: bytes, token: bytes) -> bool:
    """Verify a proposed dictionary token: put it into the seed at spread-out
    positions and see whether it reaches an edge, or a crash, that a neutral
    filler of the same length does not (so that it matters as a token, not
    as noise)."""
    if not token:
        return False
    filler = b"a" * len(token)
    seed_edges = execute(target, seed).edges
    size = len(seed)
    positions = sorted(
        {size * step // (_VERIFY_POSITIONS - 1) for step in range(_VERIFY_POSITIONS)}
    )
    for at in positions:
        for end in (at, at + len(token)):  # inserted, then overwriting
            with_token = execute(target, seed[:at] + token + seed[end:])
            with_filler = execute(target, seed[:at] + filler + seed[end:])
            if with_token.edges - with_filler.edges - seed_edges:
                return True
            if with_token.crash is not None and with_token.crash != with_filler.crash:
                return True
    return False


# --------------------------------------------------------------------------
# the result


class MalformedResult(ValueError):
    """Result bytes that are not a well-formed `BatchResult`."""


@dataclass(frozen=True, slots=True)
class Finding:
    """An input that reached coverage new to the batch: a corpus entry."""

    input: bytes
    edges: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Crash:
    input: bytes
    signature: str


@dataclass(frozen=True, slots=True)
class BatchResult:
    target: str
    seed: str
    executions: int
    edges: tuple[int, ...]  # every edge the batch covered, the seed's own included
    new_edges: tuple[int, ...]  # those the payload's known coverage lacked
    new_inputs: tuple[Finding, ...]
    crashes: tuple[Crash, ...]  # the first input of each signature
    proposal: tuple[str, bool] | None  # (proposal id, accepted)

    @property
    def found_new(self) -> bool:
        return bool(self.new_edges)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "target": self.target,
                "seed": self.seed,
                "execs": self.executions,
                "edges": list(self.edges),
                "new_edges": list(self.new_edges),
                "new": [[f.input.hex(), list(f.edges)] for f in self.new_inputs],
                "crashes": [[c.input.hex(), c.signature] for c in self.crashes],
                "proposal": None if self.proposal is None else list(self.proposal),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> BatchResult:
        """Parse and check a worker's answer; `MalformedResult` if it is not one."""
        try:
            fields = json.loads(data)
            if fields["v"] != 1:
                raise ValueError(f"unknown version {fields['v']!r}")
            target = TARGETS[_checked(fields["target"], str)]
            proposal = fields["proposal"]
            result = cls(
                target.name,
                _checked(fields["seed"], str),
                _checked(fields["execs"], int),
                _edges_of(target, fields["edges"]),
                _edges_of(target, fields["new_edges"]),
                tuple(
                    Finding(_input_of(item[0]), _edges_of(target, item[1]))
                    for item in fields["new"]
                ),
                tuple(
                    Crash(_input_of(item[0]), _checked(item[1], str)) for item in fields["crashes"]
                ),
                None
                if proposal is None
                else (_checked(proposal[0], str), _checked(proposal[1], bool)),
            )
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise MalformedResult(f"bad fuzz result: {error}") from error
        if _OBJECT_ID.fullmatch(result.seed) is None:
            raise MalformedResult(f"bad seed object id {result.seed!r}")
        if len(result.new_inputs) > _MAX_NEW_INPUTS or len(result.crashes) > _MAX_CRASHES:
            raise MalformedResult("too many findings")
        for crash in result.crashes:
            if target_of_signature(crash.signature) is not target:
                raise MalformedResult(f"bad crash signature {crash.signature!r}")
        return result


def _edges_of(target: Target, values: Any) -> tuple[int, ...]:
    edges = tuple(_checked(value, int) for value in values)
    for edge in edges:
        if target_of_edge(edge) is not target:
            raise ValueError(f"edge {edge} is not one of {target.name}'s")
    return edges


def _input_of(text: Any) -> bytes:
    data = bytes.fromhex(_checked(text, str))
    if len(data) > MAX_INPUT:
        raise ValueError("an input longer than any target takes")
    return data


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


# --------------------------------------------------------------------------
# the campaign directory


class Published(Enum):
    LINKED = "linked"  # this call put the file in place
    PRESENT = "present"  # it was there already, with the same content
    CONFLICT = "conflict"  # it was there with OTHER content: reported, never replaced


class CampaignDir:
    """Immutable files linked into place under `root` on an `FS`."""

    CORPUS: Final = "corpus"
    CRASHES: Final = "crashes"
    DELTAS: Final = os.path.join("coverage", "deltas")
    TMP: Final = "tmp"

    def __init__(self, fs: FS, root: str) -> None:
        self.fs = fs
        self.root = root
        self._made: set[str] = set()

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def publish(self, directory: str, name: str, data: bytes) -> Published:
        """Write `data` as `<root>/<directory>/<name>` once: write a temp file,
        link it into place, fsync the directory (also when it was there
        already: its writer may have died before its fsync). Raises
        `OSError` if the disk fails; calling again is always safe."""
        where = self.path(directory)
        tmp = self.path(self.TMP)
        for needed in (tmp, where):
            if needed not in self._made:
                self.fs.mkdir(needed)  # durable on return (FS contract)
                self._made.add(needed)
        temp = self.fs.write_temp(tmp, data)
        try:
            try:
                self.fs.link(temp, os.path.join(where, name))
                outcome = Published.LINKED
            except FileExistsError:
                # Also a lost reply of our own link: then the content is ours.
                same = self.fs.read(os.path.join(where, name)) == data
                outcome = Published.PRESENT if same else Published.CONFLICT
            self.fs.fsync_dir(where)
        finally:
            with contextlib.suppress(OSError):  # a leftover temp is garbage, not data
                self.fs.unlink(temp)
        return outcome

    def listdir(self, *parts: str) -> list[str]:
        try:
            return sorted(self.fs.listdir(self.path(*parts)))
        except FileNotFoundError:
            return []


def encode_delta(target: str, edges: Iterable[int]) -> bytes:
    """A coverage delta file: the target's name, then one edge id a line."""
    return "\n".join([target, *(str(edge) for edge in sorted(edges))]).encode() + b"\n"


def decode_delta(data: bytes) -> tuple[str, frozenset[int]]:
    lines = data.decode().splitlines()
    if not lines or lines[0] not in TARGETS:
        raise ValueError("a delta starts with a target name")
    target = TARGETS[lines[0]]
    edges = frozenset(int(line) for line in lines[1:])
    if any(target_of_edge(edge) is not target for edge in edges):
        raise ValueError(f"an edge that is not one of {target.name}'s")
    return target.name, edges


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


_PENDING: Final = "pending"
_TAKEN: Final = "taken"
_DONE: Final = "done"
_DROPPED: Final = "dropped"
# take() looks at this many startable items (one per family) to choose from.
_TAKE_WINDOW: Final = 8


class FuzzWorkload:
    """A fuzzing campaign as a coordinator's `Workload`.

    Build it, build the `Coordinator` with it, then `attach` it to that
    coordinator's tables (the adapters declare their compensations on
    them); after a restart, `attach` again to the new coordinator's tables:
    the adapters' state of the dead incarnation is gone, as it would be with
    the process. A survivor of a peer killed for good `adopt`s the items the
    store holds that only the dead peer knew.

    Every dispatch reserves, through its adapter:

    - the target (TargetRegistry): a harness instance of the item's target
      group, `target_capacity` per target;
    - the coverage state shard (ShardLeases): a view slot of the target's
      shard, `coverage/<target>`, whose known edges the payload carries;
    - the mutation depth (ParameterBandit, Thompson sampling over
      `DEPTH_ARMS`), rewarded when the batch found new coverage;
    - the mutation strategy (AlgorithmSelector over `STRATEGIES`: each stage
      once in order, then Thompson sampling), fed back the same reward;
    - the seed's family to the worker (SeedPairing): seeds whose coverage
      overlaps (Jaccard >= `similarity`) form a family; one family is
      fuzzed by one worker at a time (no two workers on near-duplicates),
      and `take` prefers the family least assigned so far;
    - a proposed dictionary token of the target, when one is pending
      (ProposalBoard): the worker verifies it; the verdict is given by the
      owner's triage and an accepted token joins the target's dictionary;
    - the seed's content (ObjectCache): carried only to workers that lack it.

    The coordinator reserves the exact-work lease and the dispatch log
    itself; this workload also registers one compensation of its own,
    "fuzz-dispatches", which keeps the reservations by (work id, token)
    until the dispatch ends.
    """

    def __init__(
        self,
        fs: FS,
        root: str,
        config: FuzzConfig | None = None,
        *,
        ledger: FuzzLedger | None = None,
    ) -> None:
        self.config = FuzzConfig() if config is None else config
        self.directory = CampaignDir(fs, root)
        self.ledger = FuzzLedger() if ledger is None else ledger
        self.stats: Counter[str] = Counter()
        self.dropped: dict[str, str] = {}
        self._contents: dict[str, bytes] = {}  # object id -> seed content
        self._seeds: dict[tuple[str, str], _Seed] = {}  # (target, object id)
        self._families: dict[str, list[tuple[str, frozenset[int]]]] = {
            target: [] for target in self.config.targets
        }
        self._items: dict[str, _Item] = {}
        self._status: dict[str, str] = {}
        self._queue: OrderedDict[str, None] = OrderedDict()  # pending items, oldest first
        self._created = 0
        # Local knowledge, rebuilt by triage: coverage per target (the union
        # of the deltas triaged here), verified tokens, crash signatures.
        self._coverage: dict[str, set[int]] = {target: set() for target in self.config.targets}
        self._dictionary: dict[str, dict[bytes, None]] = {t: {} for t in self.config.targets}
        self._verdicts: dict[str, bool] = {}  # proposal id -> accepted
        self._proposal_tokens: dict[str, tuple[str, bytes]] = {}  # id -> (target, token)
        self.signatures: set[str] = set()
        # Per incarnation (reset by attach):
        self._adapters: FuzzAdapters | None = None
        self._dispatch_log: DispatchLog | None = None
        self._own: Compensation[tuple[str, int]] | None = None
        self._live: dict[tuple[str, int], _Dispatch] = {}
        self._applied: set[tuple[str, int]] = set()
        self._proposal_dispatches_sent = 0
        self._on_board: list[str] = []
        for target_name in self.config.targets:
            target = TARGETS[target_name]
            for content in target.seeds:
                self._add_seed(target_name, content, execute(target, content).edges)
        self._propose_tokens()

    # -- one coordinator incarnation -------------------------------------------

    def attach(self, tables: DispatchTables, *, dispatch_log: DispatchLog | None = None) -> None:
        """Build this incarnation's adapters on `tables` (the coordinator's),
        and use `dispatch_log` (the coordinator's, when it has a journal) to
        mark local triage effects applied. Items a previous incarnation had
        taken are offered again: its dispatches died with it."""
        config = self.config
        targets = TargetRegistry(tables)
        shards = ShardLeases(tables)
        for target in config.targets:
            for index in range(config.target_capacity):
                targets.add_target(f"{target}#{index}", group=target)
                shards.add_task(f"coverage/{target}", f"view-{index}")
        depth_configs = {arm: {"depth": depth} for arm, depth in DEPTH_ARMS.items()}
        self._adapters = FuzzAdapters(
            targets,
            shards,
            ParameterBandit(tables, depth_configs, policy="thompson", seed=config.rng_seed),
            AlgorithmSelector(tables, STRATEGIES, seed=config.rng_seed),
            SeedPairing(tables),
            ProposalBoard(tables, max_attempts=config.proposal_attempts),
            ObjectCache(tables),
        )
        self._own = tables.compensation(
            "fuzz-dispatches", self._unsent, self._ended_sent, self._ended_sent
        )
        self._dispatch_log = dispatch_log
        self._live.clear()
        self._applied.clear()
        self._proposal_dispatches_sent = 0
        # Proposals an earlier incarnation decided stay decided (their
        # verdicts are this workload's); the others are proposed again.
        self._on_board = [pid for pid in self._proposal_tokens if pid not in self._verdicts]
        for proposal_id in self._on_board:
            self._adapters.proposals.propose(proposal_id)
        for work_id, status in self._status.items():
            if status == _TAKEN:
                self.give_back(work_id)

    @property
    def adapters(self) -> FuzzAdapters:
        if self._adapters is None:
            raise RuntimeError("FuzzWorkload.attach(tables) first")
        return self._adapters

    # -- the queue (Workload) --------------------------------------------------

    def take(self) -> str | None:
        adapters = self._adapters
        if adapters is None:
            return None
        first_of_family: dict[str, str] = {}
        for work_id in self._queue:
            item = self._items[work_id]
            if item.family in first_of_family:
                continue
            if adapters.targets.free_capacity(item.target) == 0:
                continue
            if adapters.pairing.paired_worker(item.family) is not None:
                continue
            first_of_family[item.family] = work_id
            if len(first_of_family) >= _TAKE_WINDOW:
                break
        family = adapters.pairing.least_assigned(first_of_family)
        if family is None:
            return None
        work_id = first_of_family[family]
        del self._queue[work_id]
        self._status[work_id] = _TAKEN
        return work_id

    def give_back(self, work_id: str) -> None:
        if self._status.get(work_id) == _TAKEN:
            self._status[work_id] = _PENDING
            self._queue[work_id] = None

    def done(self, work_id: str) -> None:
        # Also for ids this workload never made (a peer's item rolled forward
        # here): if triage ever makes the same item, it is done already.
        if self._status.get(work_id) != _DONE:
            self._status[work_id] = _DONE
            self._queue.pop(work_id, None)

    def drop(self, work_id: str, reason: str) -> None:
        if self._status.get(work_id) != _DONE:
            self._status[work_id] = _DROPPED
            self._queue.pop(work_id, None)
            self.dropped[work_id] = reason

    def remaining(self) -> int:
        return sum(1 for status in self._status.values() if status in (_PENDING, _TAKEN))

    def status(self, work_id: str) -> str:
        return self._status[work_id]

    @property
    def items(self) -> list[str]:
        """Every item this workload made, in order."""
        return list(self._items)

    # -- a dispatch (Workload) ---------------------------------------------------

    def reserve(self, txn: Transaction, worker: int, work_id: str) -> tuple[object, list[str]]:
        adapters = self.adapters
        own = self._own
        assert own is not None  # set with the adapters
        item = self._items[work_id]
        token = _fencing_token(txn, work_id)
        target = adapters.targets.reserve(txn, item.target)
        shard = adapters.shards.reserve(txn, f"coverage/{item.target}")
        param = adapters.params.reserve(txn)
        selection = adapters.algorithms.reserve(txn)
        pairing = adapters.pairing.reserve(txn, item.family)
        proposal = self._reserve_proposal(txn, item.target)
        adapters.objects.reserve(txn, [item.seed])
        key = (work_id, token)
        self._live[key] = _Dispatch(
            txn.id, worker, work_id, token, target, shard, param, selection, pairing, proposal
        )
        try:
            txn.add(own, key)
        except BaseException:
            del self._live[key]
            raise
        dictionary = tuple(self._dictionary[item.target])
        payload = FuzzPayload(
            item.target,
            item.seed,
            selection.stage,
            int(param.config["depth"]),
            self.config.batch_size,
            _rng_seed_of(work_id),
            tuple(sorted(self._coverage[item.target])),
            dictionary,
            None
            if proposal is None
            else (proposal.proposal_id, self._proposal_tokens[proposal.proposal_id][1]),
        )
        return payload.encode(), [item.seed]

    def _reserve_proposal(self, txn: Transaction, target: str) -> ProposalTicket | None:
        board = self.adapters.proposals
        for proposal_id in board.pending():
            if self._proposal_tokens[proposal_id][0] == target:
                return board.reserve(txn, proposal_id)
        return None

    def object_content(self, object_id: str) -> bytes:
        return self._contents[object_id]

    # the "fuzz-dispatches" compensation
    def _unsent(self, key: tuple[str, int]) -> None:
        self._end(key)

    def _ended_sent(self, key: tuple[str, int]) -> None:
        entry = self._end(key)
        if entry.proposal is not None:
            self._proposal_dispatches_sent += 1

    def _end(self, key: tuple[str, int]) -> _Dispatch:
        entry = self._live.pop(key, None)
        if entry is None:
            raise NotReserved(f"fuzz-dispatches: no live dispatch of {key[0]!r} token {key[1]}")
        return entry

    # -- triage (Workload) -----------------------------------------------------

    def triage(self, work_id: str, token: int, result: bytes, *, owner: bool) -> None:
        """Apply a committed batch; idempotent per (item, token). Shared
        effects first (files: any coordinator), then what this coordinator
        learns (coverage view, new seeds and items: idempotent), then the
        owner's local effects, once. Raises `OSError` if the disk fails:
        the coordinator retries."""
        ledger = self.ledger
        key = (work_id, token)
        ledger.triage_runs[key] += 1
        earlier = ledger.committed_slot.setdefault(work_id, token)
        if earlier != token:
            ledger.violations.append(f"{work_id}: committed under slots {earlier} and {token}")
        try:
            batch: BatchResult | None = BatchResult.decode(result)
        except MalformedResult as error:
            batch = None
            ledger.malformed_results += 1
            ledger.violations.append(f"{work_id}.{token}: {error}")
        if batch is not None:
            if _ITEM_ID.fullmatch(work_id) is None or type(token) is not int or token < 1:
                ledger.violations.append(f"{work_id!r}.{token!r}: not a fuzz item; no files")
            else:
                self._publish(work_id, token, batch)
            self._learn(batch)
        if owner:
            self._apply_local(key, batch)

    def _publish(self, work_id: str, token: int, batch: BatchResult) -> None:
        directory = self.directory
        name = f"{work_id}.{token}"
        outcomes = [
            directory.publish(CampaignDir.CORPUS, object_id_of(finding.input), finding.input)
            for finding in batch.new_inputs
        ]
        outcomes.extend(
            directory.publish(os.path.join(CampaignDir.CRASHES, crash.signature), name, crash.input)
            for crash in batch.crashes
        )
        # Last: a delta on disk says every file of this (item, slot) is there.
        outcomes.append(
            directory.publish(CampaignDir.DELTAS, name, encode_delta(batch.target, batch.edges))
        )
        self.ledger.files.update(outcomes)
        if Published.CONFLICT in outcomes:
            self.ledger.violations.append(f"{name}: a file of other content is in place")

    def _learn(self, batch: BatchResult) -> None:
        if batch.target not in self._coverage:
            return  # a target this workload does not fuzz
        self._coverage[batch.target].update(batch.edges)
        for finding in batch.new_inputs:
            self._add_seed(batch.target, finding.input, frozenset(finding.edges))
        self.signatures.update(crash.signature for crash in batch.crashes)

    def _apply_local(self, key: tuple[str, int], batch: BatchResult | None) -> None:
        entry = self._live.get(key)
        if entry is None:
            # Reserved by an earlier incarnation: its adapters died with it.
            self.ledger.local_skipped["state lost"] += 1
            return
        log = self._dispatch_log
        work_id, token = key
        if key in self._applied or (log is not None and log.applied(work_id, token)):
            self.ledger.local_skipped["already applied"] += 1
        else:
            adapters = self.adapters
            reward = 1.0 if batch is not None and batch.found_new else 0.0
            effects = self.ledger.local_effects
            if adapters.params.observe(entry.param.token, reward):
                effects[(work_id, token, "bandit reward")] += 1
            if adapters.algorithms.feedback(entry.selection.token, reward):
                effects[(work_id, token, "algorithm feedback")] += 1
            if entry.proposal is not None:
                self._verdict(entry.proposal, batch, (work_id, token))
            self._applied.add(key)
        if log is not None and not log.applied(work_id, token):
            log.mark_applied(work_id, token)  # journaled, when the coordinator has a journal

    def _verdict(
        self, ticket: ProposalTicket, batch: BatchResult | None, key: tuple[str, int]
    ) -> None:
        proposal_id = ticket.proposal_id
        if batch is None or batch.proposal is None or batch.proposal[0] != proposal_id:
            accepted, reason = False, "not verified"
        else:
            accepted = batch.proposal[1]
            reason = "reaches new edges" if accepted else "reaches nothing a filler does not"
        if self.adapters.proposals.verdict(proposal_id, accepted, reason):
            self.ledger.local_effects[(*key, "proposal verdict")] += 1
            self._verdicts[proposal_id] = accepted
            if accepted:
                target, token = self._proposal_tokens[proposal_id]
                self._dictionary[target][token] = None

    # -- seeds, items and proposals ------------------------------------------------

    def _add_seed(self, target: str, content: bytes, edges: frozenset[int]) -> None:
        """A new seed and its items, while the budget lasts; a known one: nothing."""
        seed = self._register_seed(target, content, edges)
        if seed is None:
            return
        for batch in range(self.config.batches_per_seed):
            if self._created >= self.config.budget:
                return
            self._make_item(seed, batch)

    def _register_seed(self, target: str, content: bytes, edges: frozenset[int]) -> _Seed | None:
        object_id = object_id_of(content)
        if (target, object_id) in self._seeds:
            return None
        seed = _Seed(target, object_id, edges, self._family_of(target, edges))
        self._seeds[(target, object_id)] = seed
        self._contents[object_id] = content
        return seed

    def _make_item(self, seed: _Seed, batch: int) -> None:
        work_id = f"{seed.target}-{seed.object_id[:16]}-{batch}"
        if work_id in self._status:
            return  # done already (a peer's item, rolled forward here)
        self._items[work_id] = _Item(work_id, seed.target, seed.object_id, seed.family, batch)
        self._status[work_id] = _PENDING
        self._queue[work_id] = None
        self._created += 1

    def adopt(self, work_id: str) -> bool:
        """Take on an item another coordinator made (one killed for good
        leaves the items it alone discovered claimed in the store, where
        nobody else would finish them). Its seed is a bundled seed or a
        corpus entry on disk. Outside the budget: what the store holds must
        be finished. False if the item is known here or not a fuzz item."""
        match = _ITEM_ID.fullmatch(work_id)
        if work_id in self._status or match is None:
            return False
        target_name, prefix, batch = match.group(1), match.group(2), int(match.group(3))
        if target_name not in self._coverage:
            return False
        target = TARGETS[target_name]
        content = self._seed_content(target, prefix)
        if content is None:
            return False
        self._register_seed(target_name, content, execute(target, content).edges)
        self._make_item(self._seeds[(target_name, object_id_of(content))], batch)
        self.stats["items adopted"] += 1
        return True

    def _seed_content(self, target: Target, prefix: str) -> bytes | None:
        for object_id, content in self._contents.items():
            if object_id.startswith(prefix) and (target.name, object_id) in self._seeds:
                return content
        for name in self.directory.listdir(CampaignDir.CORPUS):
            if name.startswith(prefix):
                content = self.directory.fs.read(self.directory.path(CampaignDir.CORPUS, name))
                if object_id_of(content) == name:
                    return content
        return None

    def _family_of(self, target: str, edges: frozenset[int]) -> str:
        families = self._families[target]
        for family, representative in families:
            union = len(edges | representative)
            if union and len(edges & representative) / union >= self.config.similarity:
                return family
        family = f"{target}/family-{len(families)}"
        families.append((family, edges))
        return family

    def _propose_tokens(self) -> None:
        """Each target's own dictionary tokens, plus a few of other targets'
        as decoys: all proposed, none used before a worker verified it."""
        chosen = self.config.targets
        for target_name in chosen:
            tokens = list(TARGETS[target_name].dictionary)
            others = [t for name in chosen if name != target_name for t in TARGETS[name].dictionary]
            tokens.extend(t for t in others[: self.config.decoys] if t not in tokens)
            for token in tokens:
                self._proposal_tokens[f"{target_name}:{token.hex()}"] = (target_name, token)

    # -- looking -------------------------------------------------------------------

    def coverage(self, target: str | None = None) -> set[int]:
        """The coverage this coordinator has triaged (of one target, or all)."""
        if target is not None:
            return set(self._coverage[target])
        return set().union(*self._coverage.values())

    def dictionary(self, target: str) -> list[bytes]:
        """The verified tokens of `target`."""
        return list(self._dictionary[target])

    def proposal_attempts(self) -> tuple[int, int]:
        """(attempts the proposal board counted, dispatches carrying a
        proposal that went out) for this incarnation: equal once no dispatch
        is in flight (proposal attempts conserved)."""
        board = self.adapters.proposals
        counted = sum(board.attempts(proposal_id) for proposal_id in self._on_board)
        return counted, self._proposal_dispatches_sent

    def proposal_states(self) -> Counter[ProposalState]:
        """This incarnation's proposals by state."""
        board = self.adapters.proposals
        return Counter(board.state(proposal_id) for proposal_id in self._on_board)

    def leaks(self) -> list[Leak]:
        """Everything this incarnation's adapters still hold, and live
        dispatches not ended: empty after shutdown."""
        if self._adapters is None:
            return []
        leaks = [leak for adapter in self._adapters.all() for leak in adapter.leaks()]
        leaks.extend(
            Leak(
                "fuzz-dispatches",
                "live dispatch",
                f"{entry.work_id}@{entry.token}",
                entry.dispatch_id,
            )
            for entry in self._live.values()
        )
        return leaks


def _fencing_token(txn: Transaction, work_id: str) -> int:
    # The coordinator tags a dispatch (work id, fencing token) before it asks
    # the workload to reserve; triage is keyed by the same pair.
    tag = txn.tag
    if (
        isinstance(tag, tuple)
        and len(tag) == 2
        and tag[0] == work_id
        and type(tag[1]) is int
        and tag[1] >= 1
    ):
        return tag[1]
    raise ValueError(f"dispatch {txn.id}: tag must be (work id, fencing token), got {tag!r}")


def _rng_seed_of(work_id: str) -> int:
    return int.from_bytes(hashlib.sha256(work_id.encode()).digest()[:8], "big")


def committed_slots(states: Iterable[ItemState]) -> dict[str, int]:
    """The store's view for `check_campaign_dir`: item -> committed slot, for
    items DONE (e.g. `committed_slots(store.items())`)."""
    return {
        state.work_id: state.token
        for state in states
        if state.status is ItemStatus.DONE and state.token is not None
    }


# --------------------------------------------------------------------------
# the audit


@dataclass
class CampaignCheck:
    """What `check_campaign_dir` re-derived from disk."""

    corpus_entries: int = 0
    crash_files: int = 0
    signatures: set[str] = field(default_factory=set)
    deltas: int = 0
    coverage: set[int] = field(default_factory=set)
    temp_files: int = 0  # garbage left by a kill between write_temp and unlink
    problems: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, object]:
        """For the campaign's JSON report."""
        return {
            "consistent": self.consistent,
            "corpus_entries": self.corpus_entries,
            "crash_files": self.crash_files,
            "signatures": sorted(self.signatures),
            "coverage_deltas": self.deltas,
            "coverage_edges": len(self.coverage),
            "temp_files": self.temp_files,
            "problems": list(self.problems),
        }


def check_campaign_dir(
    fs: FS,
    root: str,
    *,
    committed: Mapping[str, int] | None = None,
    coverage: Collection[int] | None = None,
) -> CampaignCheck:
    """Re-derive the campaign from disk and report every inconsistency:

    - every corpus entry is named by the sha256 of its content;
    - every crash file reproduces its signature on its target;
    - every coverage delta parses; coverage is their union (and equals
      `coverage`, the coordinators' triaged view, when given);
    - no item has files under two different commit slots;
    - with `committed` (the store's view, see `committed_slots`): every file
      belongs to the slot the store committed, and every committed fuzz item
      has its delta (no shared effect lost).
    """
    directory = CampaignDir(fs, root)
    report = CampaignCheck()
    problems = report.problems
    slots: dict[str, set[int]] = {}

    def note_entry(where: str, name: str) -> None:
        match = _ENTRY_NAME.fullmatch(name)
        if match is None or _ITEM_ID.fullmatch(match.group(1)) is None:
            problems.append(f"{where}/{name}: not named <item>.<slot>")
            return
        slots.setdefault(match.group(1), set()).add(int(match.group(2)))

    for name in directory.listdir(CampaignDir.CORPUS):
        report.corpus_entries += 1
        content = fs.read(directory.path(CampaignDir.CORPUS, name))
        if object_id_of(content) != name:
            problems.append(f"corpus/{name}: content hashes to {object_id_of(content)}")
    for signature in directory.listdir(CampaignDir.CRASHES):
        target = target_of_signature(signature)
        if target is None:
            problems.append(f"crashes/{signature}: not a crash signature of a bundled target")
            continue
        report.signatures.add(signature)
        for name in directory.listdir(CampaignDir.CRASHES, signature):
            report.crash_files += 1
            note_entry(f"crashes/{signature}", name)
            content = fs.read(directory.path(CampaignDir.CRASHES, signature, name))
            again = execute(target, content).crash
            if again != signature:
                problems.append(f"crashes/{signature}/{name}: reproduces as {again!r}")
    for name in directory.listdir(CampaignDir.DELTAS):
        report.deltas += 1
        note_entry("coverage/deltas", name)
        try:
            _, edges = decode_delta(fs.read(directory.path(CampaignDir.DELTAS, name)))
        except ValueError as error:
            problems.append(f"coverage/deltas/{name}: {error}")
            continue
        report.coverage |= edges
    report.temp_files = sum(
        1 for name in directory.listdir(CampaignDir.TMP) if name.startswith(TEMP_PREFIX)
    )
    for item, item_slots in sorted(slots.items()):
        if len(item_slots) > 1:
            problems.append(f"{item}: files under commit slots {sorted(item_slots)}")
        if committed is not None:
            store_slot = committed.get(item)
            if store_slot is None or item_slots != {store_slot}:
                problems.append(
                    f"{item}: files under slots {sorted(item_slots)}, store committed {store_slot}"
                )
    if committed is not None:
        for item, slot in sorted(committed.items()):
            delta = directory.path(CampaignDir.DELTAS, f"{item}.{slot}")
            if _ITEM_ID.fullmatch(item) is not None and not fs.exists(delta):
                problems.append(f"{item}: committed under slot {slot} but has no coverage delta")
    if coverage is not None and set(coverage) != report.coverage:
        missing = len(set(coverage) - report.coverage)
        extra = len(report.coverage - set(coverage))
        problems.append(
            f"coverage: {missing} triaged edges have no delta, {extra} delta edges were "
            "never triaged"
        )
    return report
