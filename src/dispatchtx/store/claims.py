"""`WorkStore`, one coordinator incarnation's handle on the shared store:
its incarnations, claims, heartbeats and abandons, the fence
(`begin_commit`) and completion, and the reading of items for the
coordinator and for roll-forward. Every change goes through the slot chains
of `dispatchtx.store.publication`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from dataclasses import replace

from dispatchtx.store.errors import (
    CorruptObject,
    CorruptRecord,
    NotOwner,
    ObjectNotFound,
    StoreError,
    StoreIOError,
    _shown,
)
from dispatchtx.store.publication import SlotChains
from dispatchtx.store.records import (
    _KEY,
    _MAX_DECISION_ROUNDS,
    _RECORD_VERSION,
    _STATUS_OF,
    MAX_INCARNATION,
    AbandonOutcome,
    Change,
    ClaimOutcome,
    ClaimResult,
    CommitOutcome,
    CompleteOutcome,
    ItemState,
    ItemStatus,
    Owner,
    Record,
    RollForward,
    SetAside,
    Survey,
    _decode_fields,
    _encode_fields,
    _FieldReader,
    _lost_claims,
    _new_nonce,
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


class WorkStore(SlotChains):
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
        object_id = self.objects.put(result)
        self._mark_committing(key)
        record = self._record(
            key, token + 1, Change.COMMIT, token, owner, object_id=object_id, size=len(result)
        )
        published = self._publish(key, record, "begin_commit")
        if published.ours and published.record.change is Change.COMMIT:
            return CommitOutcome.COMMITTED
        return self._commit_settled(key, self._chain(key), token) or CommitOutcome.FENCED_OUT

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
        return CommitOutcome.DUPLICATE

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
                self._beats.pop((key, token), None)
                self._watch.pop(key, None)
                self._drop_heartbeat(key, token)
                self._unmark_committing(key)
                return CompleteOutcome.COMPLETED
            chain = self._chain(key)
        raise StoreError(f"complete of {_shown(work_id)}: the chain kept changing")

    # -- reading -----------------------------------------------------------------

    def read(self, work_id: str) -> ItemState:
        """The item's state from its chain (FREE if it has no slot yet)."""
        key = self._key(work_id)
        chain = self._load(key, work_id, create=False)
        return self._state(key, work_id, chain)

    def items(self) -> list[ItemState]:
        """Every item in the store, in key order. A listing: an item created
        a moment ago may be missing on a network filesystem."""
        states = []
        for key in self._item_keys():
            work_id = self._work_id_of(key)
            if work_id is None:
                continue  # a directory whose first record never landed: nothing claimed
            states.append(self._state(key, work_id, self._load(key, work_id, create=False)))
        return states

    def history(self, work_id: str) -> list[Record]:
        """The item's chain, slots 1 to the head, as read now: for audits
        (the simulator checks every claim and commit against it)."""
        return list(self._load(self._key(work_id), work_id, create=False))

    def survey(self) -> Survey:
        """`items()` that does not stop at an item it cannot read: those are
        listed apart, by key, with the reason (for audits and reports)."""
        states = []
        unreadable: dict[str, str] = {}
        look_again: list[str] = []
        for key in self._item_keys():
            try:
                work_id = self._work_id_of(key)
                if work_id is None:
                    look_again.append(key)  # no first record seen: nothing claimed, or not yet
                    continue
                states.append(self._state(key, work_id, self._load(key, work_id, create=False)))
            except StoreIOError as error:
                unreadable[key] = str(error)
                look_again.append(key)
            except CorruptRecord as error:
                unreadable[key] = str(error)
        return Survey(states, unreadable, look_again)

    def items_by_status(self) -> dict[ItemStatus, list[ItemState]]:
        """`items()` grouped by status (every status is a key)."""
        grouped: dict[ItemStatus, list[ItemState]] = {status: [] for status in ItemStatus}
        for state in self.items():
            grouped[state.status].append(state)
        return grouped

    def committing_items(self) -> list[ItemState]:
        return [state for state in self.items() if state.status is ItemStatus.COMMITTING]

    def mark_committing_items(self) -> list[str]:
        """Read every item (O(items): once per coordinator start) and mark
        the COMMITTING ones "maybe committing" again, for the looks of
        `roll_forward_candidates`. An item whose records are corrupt is
        skipped, not fatal: its key is returned."""
        unreadable = []
        self._set_aside.clear()  # the full look reads every item afresh
        for key in self._item_keys():
            try:
                work_id = self._work_id_of(key)
                if work_id is None:
                    continue
                state = self._state(key, work_id, self._load(key, work_id, create=False))
            except CorruptRecord:
                unreadable.append(key)
                continue
            if state.status is ItemStatus.COMMITTING:
                self._mark_committing(key)
        return unreadable

    def _marked_committing(self) -> list[ItemState]:
        """The COMMITTING items among the marked ones; marks of final items
        (done, quarantined) are removed on the way. A mark on an item that is
        not final stays: its holder may be about to link the commit."""
        try:
            names = self._fs.listdir(self._committing)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreIOError("listing committing marks", self._committing, error) from error
        states = []
        for key in names:
            if _KEY.fullmatch(key) is None:
                continue  # not ours (a temp of an editor, say): never a path we built
            if key in self._set_aside:
                continue  # reported once; it must not hold up the others
            try:
                work_id = self._work_id_of_marked(key)
                state = self._state(key, work_id, self._load(key, work_id, create=False))
            except CorruptRecord as error:
                self._set_aside[key] = SetAside(key, self._work_ids.get(key), str(error))
                continue
            except StoreIOError as error:
                self._deferred_in_look[key] = str(error)  # the next look tries again
                continue
            if state.status is ItemStatus.COMMITTING:
                states.append(state)
            elif state.status in (ItemStatus.DONE, ItemStatus.QUARANTINED):
                self._unmark_committing(key)
        return states

    def _work_id_of_marked(self, key: str) -> str:
        """The work id of an item marked "maybe committing": from its first
        record, else from its mark. Both reads may say "absent" without it
        being so (a cached negative look-up), so they are tried again, with
        a pause, before the item is taken for corrupt."""
        for attempt in range(self._attempts):
            if attempt:
                self._pause(min(0.001 * 2 ** (attempt - 1), 0.05))
            work_id = self._work_id_of(key) or self._work_id_of_mark(key)
            if work_id is not None:
                return work_id
        path = f"{self._committing}/{key}"
        raise CorruptRecord(path, "its first record is missing, and so is its mark")

    def _work_id_of_mark(self, key: str) -> str | None:
        """An item marked "maybe committing" whose first record reads as
        absent: the mark is a second name of that record, so the work id is
        read there. None if the mark reads as absent too; CorruptRecord if it
        is foreign."""
        path = f"{self._committing}/{key}"
        try:
            first = Record.decode(self._fs.read(path), path, key, 0)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StoreIOError("reading a committing mark", path, error) from error
        work_id = first.work_id
        if work_id is None or hashlib.sha256(work_id.encode("utf-8")).hexdigest() != key:
            raise CorruptRecord(path, "its first record is missing, and its mark is foreign")
        self._work_ids[key] = work_id
        return work_id

    def _mark_committing(self, key: str) -> None:
        """Mark the item "maybe committing" before its commit slot is linked."""
        self._ensure_dir(self._committing)
        path = f"{self._committing}/{key}"
        try:
            # One call, no fsync (the full look covers a power loss): a second
            # name for the item's first record, which is immutable.
            self._fs.link(self._slot_path(key, 0), path)
        except FileExistsError:
            pass  # marked already (an earlier attempt, or an earlier claim's)
        except OSError as error:
            raise StoreIOError("marking an item committing", path, error) from error

    def _unmark_committing(self, key: str) -> None:
        with contextlib.suppress(OSError):  # a mark left behind costs a look, no more
            self._fs.unlink(f"{self._committing}/{key}")

    def quarantined(self) -> list[ItemState]:
        return [state for state in self.items() if state.status is ItemStatus.QUARANTINED]

    def stored_result(self, work_id: str) -> bytes:
        """The committed result of a COMMITTING or DONE item, verified against
        its digest and size."""
        state = self.read(work_id)
        if state.object_id is None:
            raise StoreError(
                f"work id {_shown(work_id)} has no commit (it is {state.status.value})"
            )
        return self._result_of(state)

    def roll_forward_candidates(
        self, now: float | None = None, *, full: bool = False
    ) -> list[RollForward]:
        """COMMITTING items that this coordinator should roll forward now, with
        their stored results: those of an earlier incarnation of this
        coordinator at once, and those whose owner's heartbeat this store has
        seen stand still for `ttl + margin` (the first look starts the watch).
        Rerun triage on each result, then `complete(work_id, token)`.

        It looks only at items marked "maybe committing" (O(those), not
        O(items)): a commit slot is linked only after its mark exists, and a
        mark goes only once its item is final. A power loss can drop a mark
        whose commit survived (the mark's directory is not fsynced), so a
        coordinator's first look after its start is `full`: see
        `mark_committing_items`. A claim that finds an item COMMITTING marks
        it again too (a stale "absent" may have hidden that commit from the
        full look)."""
        now = self._now(now)
        candidates = []
        self._deferred_in_look = {}
        if full:
            self.mark_committing_items()
        for state in self._marked_committing():
            assert state.owner is not None and state.token is not None
            if state.owner == self._owner:
                continue  # ours: this incarnation is finishing it
            predecessor = self._owner is not None and state.owner.is_predecessor_of(self._owner)
            if predecessor or self._stalled(state.key, state.token, now):
                try:
                    result = self._result_of(state)
                except CorruptObject as error:
                    # Committed, but its result is rotted: reported and left
                    # COMMITTING (never completed without its triage).
                    self._set_aside[state.key] = SetAside(state.key, state.work_id, str(error))
                    continue
                except (ObjectNotFound, StoreIOError) as error:
                    # "Absent" may be a stale look-up, and a read may fail
                    # once: skipped for this look only, the next one retries.
                    self._deferred_in_look[state.key] = str(error)
                    continue
                candidates.append(RollForward(state, result))
        return candidates

    @property
    def deferred_in_last_look(self) -> dict[str, str]:
        """Items the last roll-forward look skipped for a read that may
        succeed next time (a failed read, a result object not found): key ->
        the error. They hold up no other item."""
        return dict(self._deferred_in_look)

    @property
    def set_aside(self) -> list[SetAside]:
        """Items the roll-forward looks of this store could not read, in the
        order found; the looks skip them from then on (each is reported once)."""
        return list(self._set_aside.values())

    def _result_of(self, state: ItemState) -> bytes:
        assert state.object_id is not None
        content = self.objects.get(state.object_id)
        if len(content) != state.result_size:
            raise CorruptObject(
                state.object_id,
                self.objects.path_of(state.object_id),
                f"{len(content)} bytes, but its commit record says {state.result_size}",
            )
        return content

    def _state(self, key: str, work_id: str, chain: list[Record]) -> ItemState:
        lost = _lost_claims(chain)
        if not chain:
            return ItemState(work_id, key, ItemStatus.FREE, 0, None, None, None, None, lost)
        head = chain[-1]
        status = _STATUS_OF[head.change]
        if head.change is Change.QUARANTINE:
            return ItemState(work_id, key, status, head.slot, None, None, None, None, lost)
        claim = chain[head.token - 1]
        commit = chain[head.token] if head.change in (Change.COMMIT, Change.DONE) else None
        return ItemState(
            work_id,
            key,
            status,
            head.slot,
            head.token,
            claim.owner,
            None if commit is None else commit.object_id,
            None if commit is None else commit.size,
            lost,
        )
