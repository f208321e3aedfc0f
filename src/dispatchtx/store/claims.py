"""`WorkStore`, one coordinator incarnation's handle on the shared store:
its incarnations, claims, heartbeats and abandons, the fence
(`begin_commit`) and completion. The reading of items for the coordinator
and for roll-forward is `dispatchtx.store.reading`; every change goes
through the slot chains of `dispatchtx.store.publication`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from dispatchtx.store.errors import (
    CorruptRecord,
    NotOwner,
    OutcomeUnknown,
    StoreError,
    StoreIOError,
    _shown,
)
from dispatchtx.store.objects import object_id_of
from dispatchtx.store.reading import ItemReads
from dispatchtx.store.records import (
    _MAX_DECISION_ROUNDS,
    _RECORD_VERSION,
    INLINE_RESULT_BYTES,
    MAX_INCARNATION,
    AbandonOutcome,
    Change,
    ClaimOutcome,
    ClaimResult,
    CommitOutcome,
    CompleteOutcome,
    Owner,
    Record,
    _decode_fields,
    _encode_fields,
    _FieldReader,
    _lost_claims,
    _new_nonce,
    _Published,
    validate_coordinator_id,
)

__all__ = ["WorkStore"]


class _CounterGone(Exception):
    """A heartbeat counter that was not there to rewrite."""


def _incarnation_numbers(names: list[str], coordinator_id: str) -> list[int]:
    """The incarnation numbers in a listing of incarnations/, ascending. A
    name that cannot be one (junk, a number past the range) is passed over:
    it must not lock `coordinator_id` out."""
    return sorted(
        int(suffix)
        for prefix, _, suffix in (name.rpartition(".") for name in names)
        if prefix == coordinator_id
        and suffix.isascii()
        and suffix.isdigit()
        and len(suffix) <= len(str(MAX_INCARNATION))  # no int() of a huge string
        and 1 <= int(suffix) <= MAX_INCARNATION
    )


_Outcome = TypeVar("_Outcome")


@dataclass(slots=True)
class _Plan(Generic[_Outcome]):
    """A group's plan for one kind of change: per call index, the answer
    known so far; the items to publish ((index, key, slot, lost claims,
    new: 1/0), their records); the indexes decided by the one-item call."""

    results: list[_Outcome | Exception | None]
    planned: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    records: list[list[tuple[str, Record]]] = field(default_factory=list)
    alone: list[int] = field(default_factory=list)

    def decided_alone(self, one: Callable[[int], _Outcome]) -> list[_Outcome | Exception]:
        """Every answer, once those left to the one-item call `one(index)`
        are in (an exception it raises is that index's answer)."""
        for index in self.alone:
            try:
                self.results[index] = one(index)
            except Exception as error:
                self.results[index] = error
        return [result for result in self.results if result is not None]


class WorkStore(ItemReads):
    """One coordinator incarnation's handle on the shared exact-work store.

    `ttl` is how long a claim lives without a heartbeat; `margin` (default
    `ttl / 4`) is added before another coordinator may take it, to cover
    heartbeat latency and clock-rate differences. `quarantine_after` lost
    claims quarantine an item. An ambiguous publication (EIO on `link`, a
    failing directory fsync) is retried `publish_attempts` times with
    `retry_pause(seconds)` between attempts before `OutcomeUnknown` is raised.

    It is not thread-safe: one coordinator thread owns it. It reaches the
    disk only through `FS` and time only through `Clock` (or the `now` it is
    passed).
    """

    # -- incarnations --------------------------------------------------------

    def register(self, coordinator_id: str) -> int:
        """Register one start of `coordinator_id`: publish the next free
        `incarnations/<coordinator>.<n>` by `link()` and return `n` (1, 2, ...).

        The store then acts as that owner. `n` is unique among every start of
        the coordinator ever registered in this directory, so it can seed
        dispatch ids; a later incarnation may take its predecessors' claims at
        once.
        """
        if self._owner is not None:
            raise StoreError(f"this WorkStore is already registered as {self._owner}")
        coordinator_id = validate_coordinator_id(coordinator_id)
        self._refuse_old_layout()
        self._ensure_dir(self._incarnations)
        try:
            names = self._fs.listdir(self._incarnations)
        except OSError as error:
            raise StoreIOError("listing incarnations", self._incarnations, error) from error
        # The listing is only a hint for where to start: a stale one costs an
        # EEXIST. The highest name that is a real registration is the start.
        taken = reversed(_incarnation_numbers(names, coordinator_id))
        incarnation = 1 + next((n for n in taken if self._registered(coordinator_id, n)), 0)
        while True:
            if incarnation > MAX_INCARNATION:
                raise StoreError(
                    f"{coordinator_id!r} has used all {MAX_INCARNATION} incarnations of this "
                    "store (dispatch ids are made from them): register under another id"
                )
            path = os.path.join(self._incarnations, f"{coordinator_id}.{incarnation}")
            nonce = _new_nonce()
            owner = Owner(coordinator_id, incarnation)
            data = _encode_fields(
                {
                    "v": _RECORD_VERSION,
                    "change": "incarnation",
                    "owner": coordinator_id,
                    "incarnation": incarnation,
                    "nonce": nonce,
                    "wall": self._clock.wall(),  # for people reading the directory only
                }
            )
            ours, _ = self._link_publish(
                f"register {owner}",
                path,
                self._incarnations,
                data,
                nonce,
                functools.partial(self._nonce_of_registration, path, owner),
            )
            if ours:
                self._owner = owner
                return incarnation
            incarnation += 1

    def _refuse_old_layout(self) -> None:
        """A store made by dispatchtx 0.x before the shared slot directory
        (one directory per item under `items/`) is not read: its claims would
        be invisible here, so two layouts on one store could both claim."""
        old = os.path.join(self._root, "items")
        try:
            found = self._fs.exists(old)
        except OSError as error:
            raise StoreIOError("looking for an older store layout", old, error) from error
        if found:
            raise StoreError(
                f"{self._root!r} holds a store of the older per-item layout ({old!r}); "
                "this dispatchtx keeps every slot in one `slots/` directory: let the "
                "old store's runs finish and start a new store directory"
            )

    def incarnations(self, coordinator_id: str) -> list[int]:
        """The incarnations of `coordinator_id` registered so far (a listing:
        a hint, possibly stale on a network filesystem; a name that cannot be
        an incarnation is left out)."""
        coordinator_id = validate_coordinator_id(coordinator_id)
        try:
            names = self._fs.listdir(self._incarnations)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreIOError("listing incarnations", self._incarnations, error) from error
        return _incarnation_numbers(names, coordinator_id)

    def _registered(self, coordinator_id: str, incarnation: int) -> bool:
        """Whether `incarnations/<id>.<n>` is a real registration (not junk
        put there by something else)."""
        path = os.path.join(self._incarnations, f"{coordinator_id}.{incarnation}")
        try:
            return self._nonce_of_registration(path, Owner(coordinator_id, incarnation)) != ""
        except (FileNotFoundError, IsADirectoryError):
            return False
        except OSError as error:
            raise StoreIOError("reading an incarnation", path, error) from error

    def _nonce_of_registration(self, path: str, owner: Owner) -> str:
        """The nonce in `path`, which a link found taken; "" (no nonce of
        ours) if it holds junk: the name is taken all the same."""
        try:
            return self._read_incarnation(path, owner)
        except CorruptRecord:
            return ""

    def _read_incarnation(self, path: str, owner: Owner) -> str:
        fields = _decode_fields(self._fs.read(path), path)
        reader = _FieldReader(fields, path)
        reader.expect_keys({"v", "change", "owner", "incarnation", "nonce", "wall"})
        reader.version()
        reader.number("wall")
        if reader.text("change") != "incarnation" or reader.owner() != owner:
            raise CorruptRecord(path, f"foreign record: not the registration of {owner}")
        return reader.nonce()

    # -- claims ----------------------------------------------------------------

    def claim(self, work_id: str, now: float | None = None) -> int | None:
        """Claim `work_id`; return the fencing token, or None if it is not
        claimable now (see `try_claim` for why)."""
        result = self.try_claim(work_id, now)
        return result.token if result.outcome is ClaimOutcome.CLAIMED else None

    def try_claim(self, work_id: str, now: float | None = None) -> ClaimResult:
        """Claim `work_id` if its head slot is free, abandoned, a claim whose
        heartbeat THIS store has seen stand still for `ttl + margin` on its own
        monotonic clock (`now`, default `clock.monotonic()`), or a claim of an
        earlier incarnation of this coordinator.

        The first look at a claim starts the watch, so taking it over needs two
        calls at least `ttl + margin` apart. Committing and done items are
        never claimable. An item whose lost claims reach `quarantine_after` is
        quarantined instead of claimed (`quarantined_now`), for good.
        """
        owner = self._require_owner("claim")
        key = self._key(work_id)
        now = self._now(now)
        held = self._held_in_batch(key, work_id)
        if held is not None:
            return held
        chain = self._load(key, work_id, create=True)
        lost_race = False
        for _ in range(_MAX_DECISION_ROUNDS):
            lost = _lost_claims(chain)
            head = chain[-1] if chain else None
            if head is not None:
                if head.change is Change.COMMIT:
                    # Mark it again: a power loss can take a mark, and a stale
                    # "absent" can hide the commit from the full look.
                    with contextlib.suppress(StoreError):
                        self._mark_committing(key)
                    return ClaimResult(ClaimOutcome.COMMITTING, None, lost)
                if head.change is Change.DONE:
                    self._watch.pop(key, None)  # final: nothing left to watch
                    return ClaimResult(ClaimOutcome.DONE, None, lost)
                if head.change is Change.QUARANTINE:
                    self._watch.pop(key, None)
                    return ClaimResult(ClaimOutcome.QUARANTINED, None, lost)
                if head.change is Change.CLAIM:
                    if head.nonce in self._in_batch:
                        # Ours, linked in this batch (`claim_many`): durable at its end.
                        return ClaimResult(ClaimOutcome.ALREADY_HELD, head.token, lost)
                    if head.nonce in self._pending:
                        # Our earlier claim whose outcome was unknown: it won.
                        self._settle(key, head, "claim")
                        return ClaimResult(ClaimOutcome.CLAIMED, head.token, lost)
                    if head.owner == owner:
                        return ClaimResult(ClaimOutcome.ALREADY_HELD, head.token, lost)
                    if not head.owner.is_predecessor_of(owner) and not self._stalled(
                        key, head.token, now
                    ):
                        busy = ClaimOutcome.LOST_RACE if lost_race else ClaimOutcome.BUSY
                        return ClaimResult(busy, None, lost)
                    lost += 1  # taking it over ends that claim
            slot = len(chain) + 1
            if lost >= self._quarantine_after:
                record = self._record(key, slot, Change.QUARANTINE, 0, owner)
                published = self._publish(key, record, "quarantine")
                if published.ours and published.record.change is Change.QUARANTINE:
                    if head is not None and head.change is Change.CLAIM:
                        self._drop_heartbeat(key, head.token)  # the claim it ended
                    return ClaimResult(ClaimOutcome.QUARANTINED, None, lost, quarantined_now=True)
            else:
                # The counter file exists BEFORE the claim can be seen, so no
                # watcher ever caches a negative look-up of a live holder's
                # heartbeat (NFS). A loser's write only looks like one heartbeat.
                self._write_heartbeat(key, slot)
                record = self._record(key, slot, Change.CLAIM, slot, owner)
                published = self._publish(key, record, "claim")
                if published.ours and published.record.change is Change.CLAIM:
                    self._watch.pop(key, None)
                    if head is not None and head.change is Change.CLAIM:
                        self._drop_heartbeat(key, head.token)  # the claim taken over
                    return ClaimResult(ClaimOutcome.CLAIMED, slot, lost)
                self._beats.pop((key, slot), None)
                if published.record.change is not Change.CLAIM:
                    # The slot went to no claim (an abandon, a commit...): no
                    # one else owns this counter, so it must not stay behind.
                    self._drop_heartbeat(key, slot)
            lost_race = True  # decide again from what won the slot, and what followed
            chain = self._chain(key)
        return ClaimResult(ClaimOutcome.LOST_RACE, None, _lost_claims(self._chain(key)))

    def claim_many(
        self, work_ids: Sequence[str], now: float | None = None
    ) -> list[ClaimResult | Exception]:
        """`try_claim` of each work id, with the records of every item that is
        new or was abandoned (its first record and its claim) in ONE file:
        one file fsync and one directory fsync for all (the directory's at
        the end of the enclosing `batch()`, if any). Any other item, or one
        whose link meets another publisher's record, is decided by
        `try_claim` on its own.

        Returns, in order, what `try_claim` would have returned for each, or
        the exception it would have raised. A later `try_claim` of an item
        claimed here answers ALREADY_HELD with the same token."""
        return self.claim_and_complete(work_ids, (), now)[0]

    def claim_and_complete(
        self,
        work_ids: Sequence[str],
        completions: Sequence[tuple[str, int]],
        now: float | None = None,
    ) -> tuple[list[ClaimResult | Exception], list[CompleteOutcome | Exception]]:
        """`claim_many(work_ids)` and `complete_many(completions)` as ONE
        group: one file and one fsync of each kind for both (a coordinator's
        `done`s of one poll go with the claims of its next dispatches)."""
        _, claimed, completed = self.commit_claim_and_complete((), work_ids, completions, now)
        return claimed, completed

    def _held_in_batch(self, key: str, work_id: str) -> ClaimResult | None:
        """ALREADY_HELD, without a read, when the cached head is our claim
        linked in the current batch or made durable by the last one
        (`claim_many` made it a moment ago): a slot published after it could
        only be found by reading, and would fence this claim's commit all the
        same (the link decides)."""
        chain = self._chains.get(key)
        if not chain or self._work_ids.get(key) != work_id:
            return None
        head = chain[-1]
        if head.change is not Change.CLAIM:
            return None
        if head.nonce not in self._in_batch and head.nonce not in self._last_batch:
            return None
        return ClaimResult(ClaimOutcome.ALREADY_HELD, head.token, _lost_claims(chain))

    def _plan_claims(self, work_ids: Sequence[str], now: float) -> _Plan[ClaimResult]:
        owner = self._require_owner("claim")
        plan: _Plan[ClaimResult] = _Plan([None] * len(work_ids))
        seen: set[str] = set()
        for index, work_id in enumerate(work_ids):
            try:
                key = self._key(work_id)
                if key in seen:
                    plan.alone.append(index)
                    continue
                seen.add(key)
                chain = self._load(key, work_id, create=False)
                head = chain[-1] if chain else None
                lost = _lost_claims(chain)
                if head is not None and head.change is not Change.ABANDON:
                    plan.alone.append(index)  # held, committing, final: try_claim decides
                    continue
                if lost >= self._quarantine_after or self._unsettled():
                    plan.alone.append(index)
                    continue
                new = key not in self._work_ids
                slot = len(chain) + 1
                # As in try_claim: the counter exists before the claim is visible.
                self._write_heartbeat(key, slot)
            except Exception as error:  # returned, as try_claim would raise it
                plan.results[index] = error
                continue
            item: list[tuple[str, Record]] = []
            if new:
                item.append((key, self._record(key, 0, Change.ITEM, 0, owner, work_id=work_id)))
            item.append((key, self._record(key, slot, Change.CLAIM, slot, owner)))
            plan.planned.append((index, key, slot, lost, int(new)))
            plan.records.append(item)
        return plan

    def _finish_claims(
        self,
        plan: _Plan[ClaimResult],
        published: list[list[_Published | StoreError]],
        work_ids: Sequence[str],
        now: float,
    ) -> list[ClaimResult | Exception]:
        results = plan.results
        for (index, key, slot, lost, new), item, outcome in zip(
            plan.planned, plan.records, published, strict=True
        ):
            if new and isinstance(outcome[0], _Published) and outcome[0].ours:
                self._work_ids[key] = work_ids[index]
                self._chains.setdefault(key, [])
            claim = outcome[-1] if len(outcome) == len(item) else None
            if isinstance(claim, _Published) and claim.ours and claim.record.change is Change.CLAIM:
                self._watch.pop(key, None)
                results[index] = ClaimResult(ClaimOutcome.CLAIMED, slot, lost)
                continue
            if isinstance(outcome[-1], OutcomeUnknown):
                results[index] = outcome[-1]  # try_claim settles it from the slot
                continue
            self._beats.pop((key, slot), None)
            if isinstance(claim, _Published) and claim.record.change is not Change.CLAIM:
                self._drop_heartbeat(key, slot)  # the slot went to no claim: ours alone
            plan.alone.append(index)
        return plan.decided_alone(lambda index: self.try_claim(work_ids[index], now))

    def heartbeat(self, work_id: str, token: int) -> bool:
        """Rewrite the heartbeat counter of our claim `token` (off the chain,
        advisory: it can never undo a claim). Also for COMMITTING items, until
        they are done, so that nobody rolls them forward meanwhile.

        Returns False, writing nothing, if `token` no longer holds the item
        (taken over, abandoned, done or quarantined) or is not this
        incarnation's.
        """
        owner = self._require_owner("heartbeat")
        key = self._key(work_id)
        chain = self._load(key, work_id, create=False)
        claim = self._claim_at(work_id, chain, token)
        if claim.owner != owner:
            return False
        committing = len(chain) == token + 1 and chain[token].change is Change.COMMIT
        if len(chain) != token and not committing:
            return False
        try:
            # Never creates the counter (the claim made it): a beat racing a
            # takeover must not bring back the file the taker removed.
            self._write_heartbeat(key, token, create=False)
        except _CounterGone:
            ours_while = token + int(committing)  # the chain's length while the claim is ours
            if len(self._chain(key)) > ours_while:
                return False  # taken over (or ended) meanwhile
            # Still ours: the counter was lost otherwise (a power loss takes
            # an unsynced file). Write it again, and look once more after.
            self._write_heartbeat(key, token)
            if len(self._chain(key)) > ours_while:
                self._drop_heartbeat(key, token)
                return False
        return True

    def _write_heartbeat(self, key: str, token: int, *, create: bool = True) -> None:
        count = self._beats.get((key, token), -1) + 1
        self._beats[(key, token)] = count
        body = f"{token:010d} {count:016d} {self._session}".encode("ascii")
        data = body + b" " + hashlib.sha256(body).hexdigest()[:16].encode("ascii") + b"\n"
        path = self._heartbeat_path(key, token)
        if create:
            self._ensure_dir(self._slots)
        try:
            # Fixed length: each write replaces the last. Not fsynced: the
            # counter is advisory, and readers see it without (the page cache
            # here; close-to-open on NFS). After a power loss its holder is
            # dead anyway, and a restarted incarnation takes its claims at once.
            self._fs.pwrite(path, 0, data, sync=False, create=create)
        except FileNotFoundError as error:
            if create:
                raise StoreIOError("writing a heartbeat", path, error) from error
            raise _CounterGone(path) from error
        except OSError as error:
            raise StoreIOError("writing a heartbeat", path, error) from error

    def _drop_heartbeat(self, key: str, token: int) -> None:
        """Remove the counter of a claim that ended (best effort: advisory)."""
        with contextlib.suppress(OSError):
            self._fs.unlink(self._heartbeat_path(key, token))

    def abandon(self, work_id: str, token: int, *, sent: bool = True) -> AbandonOutcome:
        """End our claim `token` without a result (the before-send undo with
        `sent=False`, or the discard of a lost or stale result: only those
        count towards quarantine). Safe when the claim was taken
        over meanwhile (`TAKEN_OVER`, no effect). A later incarnation of the
        same coordinator may abandon its predecessors' claims. Raises
        `NotOwner` for another coordinator's claim.
        """
        owner = self._require_owner("abandon")
        key = self._key(work_id)
        chain = self._load(key, work_id, create=False)
        claim = self._claim_at(work_id, chain, token)
        if not (claim.owner == owner or claim.owner.is_predecessor_of(owner)):
            raise NotOwner(work_id, token, claim.owner, owner)
        for _ in range(_MAX_DECISION_ROUNDS):
            if len(chain) == token:  # our claim is the head: end it
                record = self._record(key, token + 1, Change.ABANDON, token, owner)
                if not sent:
                    record = replace(record, unsent=True)
                published = self._publish(key, record, "abandon")
                if published.ours and published.record.change is Change.ABANDON:
                    self._beats.pop((key, token), None)
                    self._drop_heartbeat(key, token)
                    return AbandonOutcome.ABANDONED
                chain = self._chain(key)
                continue
            after = chain[token]
            if after.change is Change.ABANDON:
                return AbandonOutcome.ABANDONED
            if after.change is Change.COMMIT:
                if len(chain) > token + 1:
                    return AbandonOutcome.ALREADY_DONE
                return AbandonOutcome.ALREADY_COMMITTING
            return AbandonOutcome.TAKEN_OVER
        raise StoreError(f"abandon of {_shown(work_id)}: the chain kept changing")

    # -- the fence -------------------------------------------------------------

    def begin_commit(self, work_id: str, token: int, result: bytes) -> CommitOutcome:
        """The fence: commit `result` under claim `token` if that claim is still
        the item's head and this incarnation's.

        The result is stored as a content-addressed object FIRST, then the
        `commit` slot naming it is published: the commit record is the commit
        intent, and past it the item is only ever rolled forward. An ambiguous
        publication (EIO on link, a lost reply) is resolved by reading the slot
        back (our nonce there = committed), retried until known; if it never
        becomes known, `OutcomeUnknown` is raised and a later call resolves it.
        """
        owner = self._require_owner("begin_commit")
        if not isinstance(result, bytes):
            raise TypeError(f"result must be bytes, not {type(result).__name__}")
        key = self._key(work_id)
        chain = self._known_chain(key, work_id, upto=token if isinstance(token, int) else 0)
        claim = self._claim_at(work_id, chain, token)
        if claim.owner != owner:
            return CommitOutcome.FENCED_OUT
        settled = self._commit_settled(key, chain, token)
        if settled is not None:
            return settled
        record = self._commit_record(key, token, owner, result)
        self._mark_committing(key)
        published = self._publish(key, record, "begin_commit")
        if published.ours and published.record.change is Change.COMMIT:
            return CommitOutcome.COMMITTED
        return self._commit_settled(key, self._chain(key), token) or CommitOutcome.FENCED_OUT

    def begin_commit_many(
        self, commits: Sequence[tuple[str, int, bytes]]
    ) -> list[CommitOutcome | Exception]:
        """`begin_commit` of each (work id, token, result), with every commit
        record in ONE file: one file fsync and one directory fsync for all
        (the directory's at the end of the enclosing `batch()`, if any).

        Returns, in order, what `begin_commit` would have returned for each,
        or the exception it would have raised (`OutcomeUnknown` among them:
        calling `begin_commit` again settles that one). One commit's failure
        stops no other."""
        return self.commit_claim_and_complete(commits, (), ())[0]

    def commit_claim_and_complete(
        self,
        commits: Sequence[tuple[str, int, bytes]],
        work_ids: Sequence[str],
        completions: Sequence[tuple[str, int]],
        now: float | None = None,
    ) -> tuple[
        list[CommitOutcome | Exception],
        list[ClaimResult | Exception],
        list[CompleteOutcome | Exception],
    ]:
        """`begin_commit_many(commits)`, `claim_many(work_ids)` and
        `complete_many(completions)` as ONE group: one file and one fsync of
        each kind for all three (a coordinator's pass: the commits of the
        results it took, the `done`s of its last triage, the claims of its
        next dispatches). Each list of answers is what its own call returns."""
        now = self._now(now)
        committed = self._plan_commits(commits) if commits else _Plan([])
        claims = self._plan_claims(work_ids, now) if work_ids else _Plan([])
        dones = self._plan_completions(completions) if completions else _Plan([])
        records = committed.records + claims.records + dones.records
        published = self._publish_many(records, "commit, claim and complete") if records else []
        first_claim = len(committed.records)
        first_done = first_claim + len(claims.records)
        return (
            self._finish_commits(committed, published[:first_claim], commits),
            self._finish_claims(claims, published[first_claim:first_done], work_ids, now),
            self._finish_completions(dones, published[first_done:], completions),
        )

    def _plan_commits(self, commits: Sequence[tuple[str, int, bytes]]) -> _Plan[CommitOutcome]:
        owner = self._require_owner("begin_commit")
        plan: _Plan[CommitOutcome] = _Plan([None] * len(commits))
        seen: set[str] = set()
        for index, (work_id, token, result) in enumerate(commits):
            try:
                if not isinstance(result, bytes):
                    raise TypeError(f"result must be bytes, not {type(result).__name__}")
                key = self._key(work_id)
                if key in seen:
                    plan.alone.append(index)  # decided after the group, on its own
                    continue
                seen.add(key)
                upto = token if isinstance(token, int) else 0
                chain = self._known_chain(key, work_id, upto=upto)
                claim = self._claim_at(work_id, chain, token)
                if claim.owner != owner:
                    plan.results[index] = CommitOutcome.FENCED_OUT
                    continue
                settled = self._commit_settled(key, chain, token)
                if settled is not None:
                    plan.results[index] = settled
                    continue
                record = self._commit_record(key, token, owner, result)
                self._mark_committing(key)
            except Exception as error:  # returned, as begin_commit would raise it
                plan.results[index] = error
                continue
            plan.planned.append((index, key, token, 0, 0))
            plan.records.append([(key, record)])
        return plan

    def _finish_commits(
        self,
        plan: _Plan[CommitOutcome],
        published: list[list[_Published | StoreError]],
        commits: Sequence[tuple[str, int, bytes]],
    ) -> list[CommitOutcome | Exception]:
        outcomes = plan.results
        for (index, key, token, _, _), (one,) in zip(plan.planned, published, strict=True):
            if isinstance(one, Exception):
                outcomes[index] = one
                continue
            try:
                if one.ours and one.record.change is Change.COMMIT:
                    outcomes[index] = CommitOutcome.COMMITTED
                else:
                    chain = self._chain(key)
                    outcomes[index] = (
                        self._commit_settled(key, chain, token) or CommitOutcome.FENCED_OUT
                    )
            except Exception as error:
                outcomes[index] = error
        return plan.decided_alone(lambda index: self.begin_commit(*commits[index]))

    def _commit_record(self, key: str, token: int, owner: Owner, result: bytes) -> Record:
        """The commit slot's record. A small result rides in it; a larger
        one is stored first, durably, as the object the record names."""
        if len(result) <= INLINE_RESULT_BYTES:
            object_id = object_id_of(result)
            inline: bytes | None = result
        else:
            object_id = self.objects.put(result)
            inline = None
        return self._record(
            key,
            token + 1,
            Change.COMMIT,
            token,
            owner,
            object_id=object_id,
            size=len(result),
            result=inline,
        )

    def _commit_settled(self, key: str, chain: list[Record], token: int) -> CommitOutcome | None:
        """The fence's answer if the slot after claim `token` is taken, else None."""
        if len(chain) == token:
            return None
        after = chain[token]
        if after.change is not Change.COMMIT:
            return CommitOutcome.FENCED_OUT
        if after.nonce in self._pending:
            self._settle(key, after, "begin_commit")  # our earlier ambiguous commit
            return CommitOutcome.COMMITTED
        if after.nonce in self._settled_late:
            self._settled_late.discard(after.nonce)  # made durable by a later fsync
            return CommitOutcome.COMMITTED
        return CommitOutcome.DUPLICATE

    def complete_many(
        self, completions: Sequence[tuple[str, int]]
    ) -> list[CompleteOutcome | Exception]:
        """`complete` of each (work id, token), with every `done` record in ONE
        file: one file fsync and one directory fsync for all. Returns, in
        order, what `complete` would have returned for each, or the exception
        it would have raised; one failure stops no other."""
        return self.claim_and_complete((), completions)[1]

    def _plan_completions(self, completions: Sequence[tuple[str, int]]) -> _Plan[CompleteOutcome]:
        owner = self._require_owner("complete")
        plan: _Plan[CompleteOutcome] = _Plan([None] * len(completions))
        seen: set[str] = set()
        for index, (work_id, token) in enumerate(completions):
            try:
                key = self._key(work_id)
                upto = token + 1 if isinstance(token, int) else 0
                chain = self._known_chain(key, work_id, upto=upto)
                self._claim_at(work_id, chain, token)
            except Exception as error:  # returned, as complete would raise it
                plan.results[index] = error
                continue
            if key in seen or len(chain) != token + 1 or chain[token].change is not Change.COMMIT:
                plan.alone.append(index)  # done already, fenced out, or twice here
                continue
            seen.add(key)
            plan.planned.append((index, key, token, 0, 0))
            plan.records.append([(key, self._record(key, token + 2, Change.DONE, token, owner))])
        return plan

    def _finish_completions(
        self,
        plan: _Plan[CompleteOutcome],
        published: list[list[_Published | StoreError]],
        completions: Sequence[tuple[str, int]],
    ) -> list[CompleteOutcome | Exception]:
        results = plan.results
        for (index, key, token, _, _), (one,) in zip(plan.planned, published, strict=True):
            if isinstance(one, _Published) and one.ours and one.record.change is Change.DONE:
                self._completed(key, token)
                results[index] = CompleteOutcome.COMPLETED
            elif isinstance(one, OutcomeUnknown):
                results[index] = one  # complete settles it from the slot
            else:
                plan.alone.append(index)
        return plan.decided_alone(lambda index: self.complete(*completions[index]))

    def _completed(self, key: str, token: int) -> None:
        """Our `done` for claim `token` is durable: what the claim kept goes."""
        self._beats.pop((key, token), None)
        self._watch.pop(key, None)
        self._drop_heartbeat(key, token)
        self._unmark_committing(key)

    def complete(self, work_id: str, token: int) -> CompleteOutcome:
        """Publish `done` for the commit of claim `token` (after triage).
        Finding `done` for this token already there is success too, so ANY
        registered coordinator may complete a commit (roll-forward)."""
        owner = self._require_owner("complete")
        key = self._key(work_id)
        chain = self._known_chain(key, work_id, upto=token + 1 if isinstance(token, int) else 0)
        self._claim_at(work_id, chain, token)
        for _ in range(_MAX_DECISION_ROUNDS):
            if len(chain) <= token or chain[token].change is not Change.COMMIT:
                return CompleteOutcome.FENCED_OUT
            if len(chain) > token + 1:
                done = chain[token + 1]
                if done.nonce in self._pending:
                    self._settle(key, done, "complete")
                    return CompleteOutcome.COMPLETED
                return CompleteOutcome.ALREADY_DONE
            record = self._record(key, token + 2, Change.DONE, token, owner)
            published = self._publish(key, record, "complete")
            if published.ours and published.record.change is Change.DONE:
                self._completed(key, token)
                return CompleteOutcome.COMPLETED
            chain = self._chain(key)
        raise StoreError(f"complete of {_shown(work_id)}: the chain kept changing")
