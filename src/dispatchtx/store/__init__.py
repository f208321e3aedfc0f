"""The shared exact-work store: one `link()`-published slot chain per item.

Several coordinators (processes, possibly on several hosts over a shared
filesystem) claim exact work items from one directory (docs/design.md). Every
change of an item's state is a compare-and-swap: the publisher writes the
record to a fsynced temp file and `link()`s it to the NEXT slot name of the
item's chain; whoever's link succeeds made the change, everyone else gets
EEXIST, reads the slot and learns what happened. Nothing is ever decided from
a read that says "absent" (a network filesystem may cache negative look-ups).

Layout under the store directory `root`::

    items/<sha256(work id)>/s.0000000000   the work id (checked when an item is loaded)
    items/<key>/s.0000000001, ...          immutable slot records, one per change
    items/<key>/hb.<token>                 the holder's heartbeat counter (advisory;
                                           written before the claim is linked)
    committing/<key>                       "maybe committing": a second link to slot 0,
                                           made before a commit slot is linked and
                                           removed once the item is final; roll-forward
                                           lists these, not items/
    incarnations/<coordinator>.<n>         one file per coordinator start
    objects/<aa>/<sha256>                  committed results (`objects`)
    tmp/.tmp.<random>                      temp files before they are linked

A slot record carries the change, the token (the slot number of the claim it
is about: the fencing token), the owner (coordinator id + incarnation), a
random nonce, and for a commit the result's object id and size. Records are
canonical JSON behind a sha256 checksum; a torn, corrupt or foreign record
(one written for another item or slot) raises `CorruptRecord`.

Expiry is judged by the CLAIMER's monotonic clock watching the holder's
heartbeat counter stand still for `ttl + margin`, never by comparing wall
clocks: a `WorkStore` keeps, per claim it has looked at, the last counter it
saw and when. A committing item is never claimable: its stored result is
rolled forward (`roll_forward_candidates`) and any coordinator may `complete`
it.

A `WorkStore` is one incarnation of one coordinator (see `register`). It is
not thread-safe: one coordinator thread owns it. It reaches the disk only
through `FS` and time only through `Clock` (or the `now` it is passed); the
only other use of time is the pause between retries of an ambiguous
publication (`retry_pause`, `time.sleep` unless given).

One module per part: `errors` (the error family), `records` (ids, records,
the chain grammar, the typed answers), `publication` (the slot chains and
their `link()` publication, `SlotChains`), `claims` (`WorkStore`), and
`objects` (the content-addressed `ObjectStore`).
"""

from __future__ import annotations

from dispatchtx.store.claims import WorkStore
from dispatchtx.store.errors import (
    CorruptObject,
    CorruptRecord,
    InvalidCoordinatorId,
    InvalidId,
    InvalidObjectId,
    InvalidToken,
    InvalidWorkId,
    NotOwner,
    NotRegistered,
    ObjectNotFound,
    OutcomeUnknown,
    StoreError,
    StoreIOError,
)
from dispatchtx.store.objects import ObjectStore, object_id_of, validate_object_id
from dispatchtx.store.publication import SlotChains
from dispatchtx.store.records import (
    DEFAULT_MAX_WORK_ID_BYTES,
    DEFAULT_QUARANTINE_AFTER,
    INLINE_RESULT_BYTES,
    MAX_INCARNATION,
    MAX_WORK_ID_BYTES_LIMIT,
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
    item_key,
    validate_coordinator_id,
)

__all__ = [
    "AbandonOutcome",
    "Change",
    "ClaimOutcome",
    "ClaimResult",
    "CommitOutcome",
    "CompleteOutcome",
    "CorruptObject",
    "CorruptRecord",
    "DEFAULT_MAX_WORK_ID_BYTES",
    "MAX_INCARNATION",
    "MAX_WORK_ID_BYTES_LIMIT",
    "DEFAULT_QUARANTINE_AFTER",
    "INLINE_RESULT_BYTES",
    "InvalidCoordinatorId",
    "InvalidId",
    "InvalidObjectId",
    "InvalidToken",
    "InvalidWorkId",
    "item_key",
    "ItemState",
    "ItemStatus",
    "NotOwner",
    "NotRegistered",
    "object_id_of",
    "ObjectNotFound",
    "ObjectStore",
    "OutcomeUnknown",
    "Owner",
    "Record",
    "RollForward",
    "SetAside",
    "Survey",
    "SlotChains",
    "StoreError",
    "StoreIOError",
    "validate_coordinator_id",
    "validate_object_id",
    "WorkStore",
]
