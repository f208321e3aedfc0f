"""Reading the store: an item's state, the listing and survey of every
item, the "maybe committing" marks and the looks of roll-forward, and
the stored results. `ItemReads` is the part of `WorkStore` that reads
(it marks items "maybe committing" too, which claims and commits need);
`dispatchtx.store.claims` builds the changes on it."""

from __future__ import annotations

import contextlib
import hashlib

from dispatchtx.store.errors import (
    CorruptObject,
    CorruptRecord,
    ObjectNotFound,
    StoreError,
    StoreIOError,
    _shown,
)
from dispatchtx.store.objects import object_id_of
from dispatchtx.store.publication import SlotChains
from dispatchtx.store.records import (
    _KEY,
    _STATUS_OF,
    Change,
    ItemState,
    ItemStatus,
    Record,
    RollForward,
    SetAside,
    Survey,
    _lost_claims,
)

__all__ = ["ItemReads"]


class ItemReads(SlotChains):
    """The reading half of `WorkStore` (see there)."""

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
            self._pause_before_retry(attempt)
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
        assert state.object_id is not None and state.token is not None
        chain = self._chains.get(state.key, [])
        commit = chain[state.token] if len(chain) > state.token else None
        if commit is not None and commit.change is Change.COMMIT and commit.result is not None:
            content = commit.result
            if object_id_of(content) != state.object_id:
                raise CorruptObject(
                    state.object_id,
                    self._slot_path(state.key, commit.slot),
                    f"the result in its commit record hashes to {object_id_of(content)}",
                )
            return content
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
