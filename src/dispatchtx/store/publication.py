"""The store's slot chains on disk (docs/design.md, "The shared store"): the
`link()` publication of each next slot, its retries and settling, group
commit (`batch()`), heartbeat files, the "maybe committing" marks, and the
paths of the layout. `SlotChains` is the base that `WorkStore` builds its
claims, fence and completion on."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

from dispatchtx.fs import FS, Clock
from dispatchtx.store.errors import (
    CorruptRecord,
    InvalidToken,
    NotRegistered,
    OutcomeUnknown,
    StoreError,
    StoreIOError,
    _shown,
)
from dispatchtx.store.objects import ObjectStore
from dispatchtx.store.records import (
    _HEARTBEAT_PREFIX,
    _KEY,
    _MAX_RECORD_BYTES,
    _SLOT_NAME,
    _SLOT_PREFIX,
    DEFAULT_MAX_WORK_ID_BYTES,
    DEFAULT_QUARANTINE_AFTER,
    MAX_WORK_ID_BYTES_LIMIT,
    Change,
    Owner,
    Record,
    SetAside,
    _check_transition,
    _new_nonce,
    _Published,
    item_key,
)

__all__ = ["SlotChains"]


_Held = TypeVar("_Held")


class SlotChains:
    """The slot chains of a store directory: what `WorkStore` stands on.

    It reads an item's chain (caching each slot, as slots are immutable once
    linked), publishes the next slot with the write-temp-then-`link()`
    compare-and-swap, settles a publication whose outcome was ambiguous,
    defers directory fsyncs to the end of a `batch()`, keeps the heartbeat
    files and the "maybe committing" marks, and builds every path. The
    arguments are `WorkStore`'s:

    `ttl` is how long a claim lives without a heartbeat; `margin` (default
    `ttl / 4`) is added before another coordinator may take it, to cover
    heartbeat latency and clock-rate differences. `quarantine_after` lost
    claims quarantine an item. An ambiguous publication (EIO on `link`, a
    failing directory fsync) is retried `publish_attempts` times with
    `retry_pause(seconds)` between attempts before `OutcomeUnknown` is raised.
    """

    def __init__(
        self,
        fs: FS,
        root: str,
        clock: Clock,
        *,
        ttl: float,
        margin: float | None = None,
        quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
        max_work_id_bytes: int = DEFAULT_MAX_WORK_ID_BYTES,
        publish_attempts: int = 20,
        retry_pause: Callable[[float], None] = time.sleep,
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be positive, not {ttl!r}")
        margin = ttl / 4 if margin is None else margin
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, not {margin!r}")
        if quarantine_after < 1:
            raise ValueError(f"quarantine_after must be >= 1, not {quarantine_after!r}")
        if not 1 <= max_work_id_bytes <= MAX_WORK_ID_BYTES_LIMIT:
            raise ValueError(
                f"max_work_id_bytes must be in 1..{MAX_WORK_ID_BYTES_LIMIT} (a longer id, "
                f"escaped, would not fit a readable record), not {max_work_id_bytes!r}"
            )
        if publish_attempts < 1:
            raise ValueError(f"publish_attempts must be >= 1, not {publish_attempts!r}")
        self._fs = fs
        self._root = root
        self._clock = clock
        self._ttl = float(ttl)
        self._margin = float(margin)
        self._quarantine_after = quarantine_after
        self._max_work_id_bytes = max_work_id_bytes
        self._attempts = publish_attempts
        self._pause = retry_pause
        self._slots = os.path.join(root, "slots")
        self._incarnations = os.path.join(root, "incarnations")
        self._tmp = os.path.join(root, "tmp")
        self._committing = os.path.join(root, "committing")
        self.objects: Final = ObjectStore(fs, root)
        self._owner: Owner | None = None
        self._session = secrets.token_hex(8)  # tells this store's heartbeats from a restart's
        # Slots are immutable once linked: cache each item's chain (index i = slot i + 1).
        self._chains: dict[str, list[Record]] = {}
        self._work_ids: dict[str, str] = {}  # key -> work id verified against slot 0
        self._created: set[str] = set()
        # Nonces of publications whose outcome this store has not learned yet.
        self._pending: set[str] = set()
        # Inside `batch()`: directory -> nonces linked there, not yet durable.
        self._deferred: dict[str, list[str]] | None = None
        # Those of `_pending` that are linked, ours, and waiting only for the
        # batch's fsyncs (a subset of `_pending`).
        self._in_batch: set[str] = set()
        # What the last batch made durable (the claims a coordinator made
        # ahead are adopted just after it, from the cache).
        self._last_batch: set[str] = set()
        # directory -> nonces linked there whose batch fsync failed: the next
        # successful fsync of that directory settles them all.
        self._unsynced: dict[str, set[str]] = {}
        # Nonces of ours made durable by such a later fsync, not yet asked
        # about again (`begin_commit` then answers COMMITTED, not DUPLICATE).
        self._settled_late: set[str] = set()
        # Claimer's watch, one per item: key -> (token, heartbeat seen, monotonic
        # time it was first seen). Watching another token replaces it.
        self._watch: dict[str, tuple[int, object, float]] = {}
        self._beats: dict[tuple[str, int], int] = {}
        # Items a roll-forward look could not read: key -> what was wrong.
        self._set_aside: dict[str, SetAside] = {}
        # Items the last look skipped for a read that may succeed later.
        self._deferred_in_look: dict[str, str] = {}
        # Inside `_publish_many`: the one file every record of the group is
        # linked from (its bytes, and the temp once written).
        self._shared: _SharedFile | None = None

    # -- configuration -------------------------------------------------------

    @property
    def root(self) -> str:
        return self._root

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def margin(self) -> float:
        return self._margin

    @property
    def quarantine_after(self) -> int:
        return self._quarantine_after

    @property
    def owner(self) -> Owner | None:
        """This store's coordinator and incarnation, once registered."""
        return self._owner

    # -- group commit -----------------------------------------------------------

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Group commit: inside the block, a publication's directory fsync is
        put off to the block's end, where each directory touched is fsynced
        once (on ext4 the first fsync commits the journal for all of them).

        Until the block ends, what was published inside is decided (the
        links were made) but NOT durable: act on none of it (send no claimed
        work, triage no commit) before the block has ended without error. If
        a fsync keeps failing, the block raises `OutcomeUnknown` and those
        publications stay pending: calling the operation again settles each
        one. A block ended by a BaseException (a kill) fsyncs nothing.
        Blocks do not nest."""
        if self._deferred is not None:
            raise RuntimeError("store batches do not nest")
        deferred: dict[str, list[str]] = {}
        self._deferred = deferred
        try:
            yield
        except Exception:
            self._deferred = None
            with contextlib.suppress(StoreError):  # the block's own error wins
                self._sync_deferred(deferred)
            raise
        except BaseException:
            self._deferred = None
            self._in_batch.clear()  # not fsynced: their outcomes are unknown
            raise
        self._deferred = None
        self._sync_deferred(deferred)

    def _sync_deferred(self, deferred: dict[str, list[str]]) -> None:
        # Whatever is not fsynced now stays pending: an outcome unknown.
        self._in_batch.clear()
        self._last_batch = set()
        failed: tuple[str, OSError] | None = None
        for directory, nonces in deferred.items():
            error = self._fsync_dir_retried(directory)
            if error is None:
                self._pending.difference_update(nonces)
                self._last_batch.update(nonces)
                continue
            self._unsynced.setdefault(directory, set()).update(nonces)
            if failed is None:
                failed = (directory, error)
        if failed is not None:
            raise OutcomeUnknown("batch", failed[0], failed[1])

    def _synced(self, directory: str) -> None:
        """`directory` was fsynced: what a failed batch linked there is durable.
        Those nonces are remembered as ours until an operation asks again."""
        if self._unsynced:
            settled = self._unsynced.pop(directory, set())
            self._pending.difference_update(settled)
            self._settled_late.update(settled)

    def _pause_before_retry(self, attempt: int) -> None:
        """Before attempt `attempt` (0 is the first: no pause) of a retried
        step: 1 ms, doubling, at most 50 ms."""
        if attempt:
            self._pause(min(0.001 * 2 ** (attempt - 1), 0.05))

    def _fsync_dir_retried(self, directory: str) -> OSError | None:
        """fsync `directory`, retried; None once it succeeded, else the last error."""
        last_error: OSError | None = None
        for attempt in range(self._attempts):
            self._pause_before_retry(attempt)
            try:
                self._fs.fsync_dir(directory)
            except OSError as error:
                last_error = error
                continue
            self._synced(directory)
            return None
        return last_error

    # -- the chain -----------------------------------------------------------------

    def _load(self, key: str, work_id: str, *, create: bool) -> list[Record]:
        """The item's chain, after checking slot 0 names `work_id`. With
        `create`, slot 0 is published if missing (by link: first one wins)."""
        if key not in self._work_ids:
            path = self._slot_path(key, 0)
            first = self._read_first(key)
            if first is None and create:
                owner = self._require_owner("claim")
                self._ensure_dir(self._slots)
                record = self._record(key, 0, Change.ITEM, 0, owner, work_id=work_id)
                published = self._publish(key, record, "create item")
                first = published.record
                if published.ours and first.work_id == work_id:
                    # Ours a moment ago: slot 1 can only be a racing claim,
                    # and our claim's link will meet it.
                    self._work_ids[key] = work_id
                    return self._chains.setdefault(key, [])
            if first is None and self._slot_exists(key, 1):
                # Slot 0 is durable before slot 1 is linked: an "absent" here is a
                # stale negative look-up, or the record really is missing.
                for attempt in range(1, self._attempts):
                    self._pause_before_retry(attempt)
                    first = self._read_first(key)
                    if first is not None:
                        break
                else:
                    raise CorruptRecord(path, "the item has slots but no first record")
            if first is None:
                return []  # nothing published for this item yet
            if first.work_id != work_id:
                raise CorruptRecord(
                    path,
                    f"foreign item: it names work id {_shown(first.work_id)}, "
                    f"not {_shown(work_id)}",
                )
            self._work_ids[key] = work_id
        return self._chain(key)

    def _known_chain(self, key: str, work_id: str, upto: int) -> list[Record]:
        """The cached chain as it is, without reading ahead, when it holds
        slots 1..`upto` and nothing of ours is pending; else `_load`. For a
        publisher of slot `upto + 1` only: a slot published meanwhile makes
        its `link` fail with EEXIST, and it reads on from there (the link
        decides, never the read)."""
        chain = self._chains.get(key)
        if (
            chain is not None
            and len(chain) == upto
            and not self._unsettled()
            and self._work_ids.get(key) == work_id
        ):
            return chain
        return self._load(key, work_id, create=False)

    def _unsettled(self) -> bool:
        """Whether a publication's outcome is unknown (not merely waiting for
        the directory fsync at the end of a batch)."""
        return len(self._pending) > len(self._in_batch)  # O(1): once per publication

    def _read_first(self, key: str) -> Record | None:
        try:
            return self._read_slot(key, 0)
        except FileNotFoundError:
            return None
        except OSError as error:
            path = self._slot_path(key, 0)
            raise StoreIOError("reading an item's first record", path, error) from error

    def _chain(self, key: str) -> list[Record]:
        """Read the slots after the cached ones until one is absent. A stale
        "absent" only makes the chain look short: the next publication then
        meets EEXIST and reads on."""
        chain = self._chains.setdefault(key, [])
        while True:
            slot = len(chain) + 1
            try:
                record = self._read_slot(key, slot)
            except FileNotFoundError:
                return chain
            except OSError as error:
                path = self._slot_path(key, slot)
                raise StoreIOError("reading a slot", path, error) from error
            self._append(key, chain, record)

    def _append(self, key: str, chain: list[Record], record: Record) -> None:
        _check_transition(chain, record, self._slot_path(key, record.slot))
        chain.append(record)

    def _read_slot(self, key: str, slot: int) -> Record:
        path = self._slot_path(key, slot)
        return Record.decode(self._fs.read(path), path, key, slot)

    def _slot_exists(self, key: str, slot: int) -> bool:
        path = self._slot_path(key, slot)
        try:
            return self._fs.exists(path)
        except OSError as error:
            raise StoreIOError("looking up a slot", path, error) from error

    def _claim_at(self, work_id: str, chain: list[Record], token: object) -> Record:
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidToken(work_id, token, "a token is an int")
        if not 1 <= token <= len(chain) or chain[token - 1].change is not Change.CLAIM:
            raise InvalidToken(work_id, token, "the item has no claim in that slot")
        return chain[token - 1]

    def _work_id_of(self, key: str) -> str | None:
        if key in self._work_ids:
            return self._work_ids[key]
        first = self._read_first(key)
        if first is None:
            return None
        work_id = first.work_id
        assert work_id is not None
        try:
            hashed = hashlib.sha256(work_id.encode("utf-8")).hexdigest()
        except UnicodeEncodeError:
            hashed = ""
        if hashed != key:
            raise CorruptRecord(self._slot_path(key, 0), "its work id does not hash to the item")
        self._work_ids[key] = work_id
        return work_id

    def _item_keys(self) -> list[str]:
        """The keys of every item with a slot in the listing, in key order
        (a name that is not `<key>.<slot>` is not ours and is passed over)."""
        try:
            names = self._fs.listdir(self._slots)
        except FileNotFoundError:
            return []
        except OSError as error:
            raise StoreIOError("listing slots", self._slots, error) from error
        keys = set()
        for name in names:
            key, dot, slot = name.partition(".")
            if dot and _KEY.fullmatch(key) is not None and _SLOT_NAME.fullmatch(slot):
                keys.add(key)
        return sorted(keys)

    # -- publishing ------------------------------------------------------------------

    def _record(
        self,
        key: str,
        slot: int,
        change: Change,
        token: int,
        owner: Owner,
        *,
        object_id: str | None = None,
        size: int | None = None,
        work_id: str | None = None,
        result: bytes | None = None,
    ) -> Record:
        return Record(
            key, slot, change, token, owner, _new_nonce(), object_id, size, work_id, result=result
        )

    def _publish(self, key: str, record: Record, action: str) -> _Published:
        """Publish `record` as its slot; report whether we did and what the slot
        holds. The chain cache learns the slot either way."""
        path = self._slot_path(key, record.slot)
        ours, holder = self._link_publish(
            action,
            path,
            self._slots,
            record.encode() if self._shared is None else b"",  # a group's file holds it
            record.nonce,
            lambda: self._read_slot(key, record.slot),
        )
        held = record if holder is None else holder
        if held.slot > 0:
            chain = self._chains.setdefault(key, [])
            if len(chain) + 1 == held.slot:
                self._append(key, chain, held)
        return _Published(ours, held)

    def _link_publish(
        self,
        action: str,
        path: str,
        directory: str,
        data: bytes,
        nonce: str,
        read_holder: Callable[[], _Held],
    ) -> tuple[bool, _Held | None]:
        """The compare-and-swap: write `data` to a fsynced temp, `link` it to
        `path`, fsync `directory`, unlink the temp.

        Returns (True, None) when our link made the slot and it is durable;
        (True, holder) when EEXIST showed a record of ours (a lost reply, or an
        earlier ambiguous attempt of this store); (False, holder) when another
        publisher won. `read_holder` reads the slot and must expose its nonce
        as `.nonce` or be the nonce itself.

        An EIO on link or fsync is ambiguous: we try the link again (EEXIST
        then tells whose it is) until the attempts run out, and then raise
        `OutcomeUnknown`, keeping the nonce pending so a later call can learn
        the outcome from the slot. Never decides from an "absent".
        """
        self._ensure_dir(self._tmp)
        temps: list[str] = []
        temp: str | None = None
        linked_once = False
        last_error: OSError | None = None
        self._pending.add(nonce)
        try:
            for attempt in range(self._attempts):
                self._pause_before_retry(attempt)
                try:
                    if temp is None:
                        temp = self._write_temp(data, temps)
                    linked_once = True
                    holder: _Held | None = None
                    try:
                        self._fs.link(temp, path)
                    except FileExistsError:
                        # Read it back (a stale "absent" here raises and we retry).
                        holder = read_holder()
                        if _nonce_of(holder) not in self._pending:
                            self._pending.discard(nonce)
                            return False, holder
                    except FileNotFoundError as error:
                        temp = None  # our temp vanished (a stale handle): write it again
                        if self._shared is not None:
                            self._shared.temp = None
                        last_error = error
                        continue
                    # Ours (now or by an earlier attempt): make the slot durable.
                    # Only then is it settled: until the fsync succeeds, the nonce
                    # stays pending so that the next EEXIST still knows it as ours.
                    if self._deferred is not None:  # in a batch: fsynced at its end
                        nonces = self._deferred.setdefault(directory, [])
                        nonces.append(nonce)
                        self._in_batch.add(nonce)
                        if holder is not None:
                            nonces.append(_nonce_of(holder))
                            self._in_batch.add(_nonce_of(holder))
                        return True, holder
                    self._fs.fsync_dir(directory)
                    self._synced(directory)
                    self._pending.discard(nonce)
                    if holder is not None:
                        self._pending.discard(_nonce_of(holder))
                        self._in_batch.discard(_nonce_of(holder))
                    return True, holder
                except OSError as error:
                    if not linked_once:  # nothing published: a plain failure
                        self._pending.discard(nonce)
                        raise StoreIOError(
                            f"{action}: writing a temp record", self._tmp, error
                        ) from error
                    last_error = error
            raise OutcomeUnknown(action, path, last_error)
        finally:
            for leftover in temps:
                with contextlib.suppress(OSError):  # a leftover temp is garbage, never data
                    self._fs.unlink(leftover)

    def _write_temp(self, data: bytes, temps: list[str]) -> str:
        """A fsynced temp holding `data`, or, inside `_publish_many`, the
        group's one file (written once, then linked into every slot)."""
        shared = self._shared
        if shared is None:
            temp = self._fs.write_temp(self._tmp, data)
            temps.append(temp)
            return temp
        if shared.temp is None:
            shared.temp = self._fs.write_temp(self._tmp, shared.data)
            shared.temps.append(shared.temp)
        return shared.temp

    def _publish_many(
        self, chains: list[list[tuple[str, Record]]], action: str
    ) -> list[list[_Published | StoreError]]:
        """Publish records as their slots, all from ONE file: the records are
        written together and fsynced once, that inode is linked into each
        slot's name (each `link` is still its slot's compare-and-swap; a
        reader finds its record in the file by item and slot), and `slots/`
        is fsynced once at the end (or at the end of the enclosing `batch()`).

        `chains` holds, per item, records in slot order; an item's next record
        is published only while the one before it was ours. Returns, per item,
        what `_publish` returned for each record tried, or the `StoreError` it
        raised (which ends that item's list): one item's failure stops no
        other. Until this returns, nothing published here is durable."""
        results: list[list[_Published | StoreError]] = []
        for group, data in _groups_that_fit(chains):
            self._shared = _SharedFile(data)
            try:
                if self._deferred is not None:
                    results.extend(self._publish_each(group, action))
                else:
                    first = len(results)
                    try:
                        with self.batch():
                            results.extend(self._publish_each(group, action))
                    except OutcomeUnknown as error:
                        # Linked, not durable: unknown until each is settled.
                        for index in range(first, len(results)):
                            results[index] = [error]
            finally:
                shared, self._shared = self._shared, None
                for leftover in shared.temps:
                    with contextlib.suppress(OSError):  # garbage, never data
                        self._fs.unlink(leftover)
        return results

    def _publish_each(
        self, group: list[list[tuple[str, Record]]], action: str
    ) -> list[list[_Published | StoreError]]:
        results: list[list[_Published | StoreError]] = []
        for chain in group:
            published: list[_Published | StoreError] = []
            for key, record in chain:
                try:
                    one = self._publish(key, record, action)
                except StoreError as error:
                    published.append(error)
                    break
                published.append(one)
                if not one.ours or one.record.nonce != record.nonce:
                    break  # the slot holds another record: what follows would not fit
            results.append(published)
        return results

    def _settle(self, key: str, record: Record, action: str) -> None:
        """Our earlier ambiguous publication turned up: make it durable before
        anyone acts on it, then forget that it was pending."""
        error = self._fsync_dir_retried(self._slots)
        if error is not None:
            raise OutcomeUnknown(action, self._slot_path(key, record.slot), error)
        self._pending.discard(record.nonce)
        self._in_batch.discard(record.nonce)

    # -- expiry --------------------------------------------------------------------

    def _stalled(self, key: str, token: int, now: float) -> bool:
        """Whether this store has seen claim `token`'s heartbeat stand still for
        `ttl + margin` of its own monotonic time. Every call is an observation;
        a changed counter restarts the watch."""
        seen = self._read_heartbeat(key, token)
        watched = self._watch.get(key)
        if watched is None or watched[0] != token:
            self._watch[key] = (token, seen, now)
            return False
        if seen != watched[1]:
            if seen is None:
                # "Absent" may be a stale negative look-up (NFS, or a fault):
                # it is no sign of life, and it must not restart the watch,
                # or a dead holder's claim could never be taken over.
                pass
            elif watched[1] is None:
                # The counter shows up after an absent look-up: still the
                # first value seen, no beat.
                self._watch[key] = (token, seen, watched[2])
            else:
                self._watch[key] = (token, seen, now)  # it beat: alive
                return False
        return now - watched[2] >= self._ttl + self._margin

    def _read_heartbeat(self, key: str, token: int) -> object:
        """What the counter file shows: (session, count) when intact, the raw
        bytes when torn (still a sign of life if it changes), None if absent."""
        path = self._heartbeat_path(key, token)
        try:
            data = self._fs.read(path)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StoreIOError("reading a heartbeat", path, error) from error
        body, _, checksum = data.rstrip(b"\n").rpartition(b" ")
        parts = body.split(b" ")
        intact = hashlib.sha256(body).hexdigest()[:16].encode("ascii") == checksum
        if intact and len(parts) == 3 and parts[0] == f"{token:010d}".encode("ascii"):
            return (parts[2], parts[1])
        return data

    # -- paths and small helpers -----------------------------------------------------

    def _key(self, work_id: object) -> str:
        return item_key(work_id, self._max_work_id_bytes)

    def _now(self, now: float | None) -> float:
        return self._clock.monotonic() if now is None else now

    def _require_owner(self, action: str) -> Owner:
        if self._owner is None:
            raise NotRegistered(action)
        return self._owner

    # Plain concatenation: the directories never end in "/" and a key is 64
    # hex digits. Every item's slots share one directory, so a batch of
    # publications costs one directory fsync, not one per item.
    def _slot_path(self, key: str, slot: int) -> str:
        return f"{self._slots}/{key}.{_SLOT_PREFIX}{slot:010d}"

    def _heartbeat_path(self, key: str, token: int) -> str:
        # Beside the slots: the fsync that makes a claim durable covers its
        # counter's name too.
        return f"{self._slots}/{key}.{_HEARTBEAT_PREFIX}{token:010d}"

    def _ensure_dir(self, directory: str) -> None:
        """mkdir once per store, made durable by an fsync of the parent."""
        for needed in (self._root, directory):
            if needed in self._created:
                continue
            try:
                self._fs.mkdir(needed)
                self._fs.fsync_dir(os.path.dirname(needed) or ".")
            except OSError as error:
                raise StoreIOError("creating a directory", needed, error) from error
            self._created.add(needed)


class _SharedFile:
    """The one file a `_publish_many` group links into every slot."""

    __slots__ = ("data", "temp", "temps")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.temp: str | None = None
        self.temps: list[str] = []


def _groups_that_fit(
    chains: list[list[tuple[str, Record]]],
) -> Iterator[tuple[list[list[tuple[str, Record]]], bytes]]:
    """`chains` cut into runs whose records fit one readable file, each with
    that file's bytes."""
    group: list[list[tuple[str, Record]]] = []
    parts: list[bytes] = []
    size = 0
    for chain in chains:
        encoded = [record.encode() for _, record in chain]
        length = sum(map(len, encoded))
        if group and size + length > _MAX_RECORD_BYTES:
            yield group, b"".join(parts)
            group, parts, size = [], [], 0
        group.append(chain)
        parts.extend(encoded)
        size += length
    if group:
        yield group, b"".join(parts)


def _nonce_of(holder: object) -> str:
    if isinstance(holder, Record):
        return holder.nonce
    if isinstance(holder, str):
        return holder
    raise TypeError(f"cannot take a nonce from {type(holder).__name__}")
