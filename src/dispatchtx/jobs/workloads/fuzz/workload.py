"""The coordinator side: `FuzzWorkload`, the campaign as a coordinator's
`Workload` (its queue with a take window over families, reservations,
triage, adoption of a dead peer's items)."""

from __future__ import annotations

import hashlib
import os
from collections import Counter, OrderedDict
from typing import Final

from dispatchtx import Compensation, DispatchTables, Transaction
from dispatchtx.coordinator.queue import QueueState
from dispatchtx.coordinator.workload import DispatchTag, Workload
from dispatchtx.fs import FS
from dispatchtx.jobs.workloads.fuzz.campaign_dir import CampaignDir, Published, encode_delta
from dispatchtx.jobs.workloads.fuzz.payload import _ITEM_ID, DEPTH_ARMS, STRATEGIES, FuzzPayload
from dispatchtx.jobs.workloads.fuzz.records import (
    FuzzAdapters,
    FuzzConfig,
    FuzzLedger,
    _Dispatch,
    _Item,
    _Seed,
)
from dispatchtx.jobs.workloads.fuzz.result import BatchResult, MalformedResult
from dispatchtx.jobs.workloads.targets import (
    TARGETS,
    Target,
    execute,
)
from dispatchtx.resources import (
    AlgorithmSelector,
    DispatchLog,
    Leak,
    NotReserved,
    ObjectCache,
    ParameterBandit,
    ProposalBoard,
    ProposalState,
    ProposalTicket,
    SeedPairing,
    ShardLeases,
    TargetRegistry,
)
from dispatchtx.store import object_id_of

# take() looks at this many startable items (one per family) to choose from.
_TAKE_WINDOW: Final = 8


class FuzzWorkload(Workload):
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
        self._status: dict[str, QueueState] = {}
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

    def attach(
        self, tables: DispatchTables[DispatchTag], dispatch_log: DispatchLog | None = None
    ) -> None:
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
            if status is QueueState.TAKEN:
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
        self._status[work_id] = QueueState.TAKEN
        return work_id

    def give_back(self, work_id: str) -> None:
        if self._status.get(work_id) is QueueState.TAKEN:
            self._status[work_id] = QueueState.PENDING
            self._queue[work_id] = None

    def done(self, work_id: str) -> None:
        # Also for ids this workload never made (a peer's item rolled forward
        # here): if triage ever makes the same item, it is done already.
        if self._status.get(work_id) is not QueueState.DONE:
            self._status[work_id] = QueueState.DONE
            self._queue.pop(work_id, None)

    def drop(self, work_id: str, reason: str) -> None:
        if self._status.get(work_id) is not QueueState.DONE:
            self._status[work_id] = QueueState.DROPPED
            self._queue.pop(work_id, None)
            self.dropped[work_id] = reason

    def remaining(self) -> int:
        return sum(
            1
            for status in self._status.values()
            if status in (QueueState.PENDING, QueueState.TAKEN)
        )

    def status(self, work_id: str) -> QueueState:
        return self._status[work_id]

    @property
    def items(self) -> list[str]:
        """Every item this workload made, in order."""
        return list(self._items)

    # -- a dispatch (Workload) ---------------------------------------------------

    def reserve(
        self, txn: Transaction[DispatchTag], worker: int, work_id: str
    ) -> tuple[object, list[str]]:
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

    def _reserve_proposal(
        self, txn: Transaction[DispatchTag], target: str
    ) -> ProposalTicket | None:
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
        self._status[work_id] = QueueState.PENDING
        self._queue[work_id] = None
        self._created += 1

    def adopt(self, work_id: str) -> bool:
        """Take on an item another coordinator made (one killed for good
        leaves the items it alone discovered claimed in the store, where
        nobody else would finish them). Its seed is a bundled seed or a
        corpus entry on disk. Outside the budget: what the store holds must
        be finished. True if it is queued here now or was unfinished here
        already; False if it is finished here or not a fuzz item."""
        known = self._status.get(work_id)
        if known is not None:
            return known in (QueueState.PENDING, QueueState.TAKEN)
        match = _ITEM_ID.fullmatch(work_id)
        if match is None:
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

    def problems(self) -> list[str]:
        """Proposal attempts not conserved: an attempt counted for a
        dispatch that never went out, or one that went out uncounted."""
        if self._adapters is None:
            return []
        counted, sent = self.proposal_attempts()
        return [] if counted == sent else [f"proposal attempts {counted} counted, {sent} sent"]

    def figures(self) -> dict[str, int]:
        if self._adapters is None:
            return {}
        counted, sent = self.proposal_attempts()
        return {"proposal attempts counted": counted, "proposal attempts sent": sent}

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


def _fencing_token(txn: Transaction[DispatchTag], work_id: str) -> int:
    # The coordinator tags a dispatch with its DispatchTag (work id, fencing
    # token) before it asks the workload to reserve; triage is keyed by both.
    tag = txn.tag
    if tag.work_id != work_id or tag.token < 1:
        raise ValueError(f"dispatch {txn.id}: tag {tag!r} is not a claim of {work_id!r}")
    return tag.token


def _rng_seed_of(work_id: str) -> int:
    return int.from_bytes(hashlib.sha256(work_id.encode()).digest()[:8], "big")
