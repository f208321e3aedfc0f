"""The content-addressed object store (dispatchtx.store.objects)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx.errors import DispatchError
from dispatchtx.fs import (
    DiskFaultPlan,
    Fault,
    FaultKind,
    FaultRule,
    FaultyFS,
    Op,
    RealFS,
    SimulatedCrash,
    SimulatedFS,
)
from dispatchtx.store import (
    CorruptObject,
    InvalidObjectId,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    StoreIOError,
    object_id_of,
    validate_object_id,
)

ROOT = "/store"


def test_put_get_has_round_trip_on_the_real_disk(tmp_path: Path) -> None:
    objects = ObjectStore(RealFS(), str(tmp_path / "store"))
    content = b"a result\x00with bytes\xff"
    object_id = objects.put(content)
    assert object_id == hashlib.sha256(content).hexdigest() == object_id_of(content)
    assert objects.has(object_id)
    assert objects.get(object_id) == content
    path = tmp_path / "store" / "objects" / object_id[:2] / object_id
    assert path.read_bytes() == content
    assert objects.path_of(object_id) == str(path)
    # The temp file was unlinked after the link.
    assert os.listdir(tmp_path / "store" / "tmp") == []


def test_put_is_idempotent_and_empty_content_works(tmp_path: Path) -> None:
    objects = ObjectStore(RealFS(), str(tmp_path))
    first = objects.put(b"same")
    again = ObjectStore(RealFS(), str(tmp_path)).put(b"same")  # another writer: EEXIST
    assert first == again
    empty = objects.put(b"")
    assert objects.get(empty) == b""
    assert sorted(os.listdir(tmp_path / "objects")) == sorted({first[:2], empty[:2]})


def test_missing_object_is_a_clear_error(tmp_path: Path) -> None:
    objects = ObjectStore(RealFS(), str(tmp_path))
    missing = "0" * 64
    assert not objects.has(missing)
    with pytest.raises(ObjectNotFound, match=missing) as caught:
        objects.get(missing)
    assert isinstance(caught.value, StoreError)
    assert isinstance(caught.value, DispatchError)


def test_corrupt_object_is_detected(tmp_path: Path) -> None:
    objects = ObjectStore(RealFS(), str(tmp_path))
    object_id = objects.put(b"the true content")
    Path(objects.path_of(object_id)).write_bytes(b"something else")
    with pytest.raises(CorruptObject, match="hashes to"):
        objects.get(object_id)


@pytest.mark.parametrize("rotted", [b"something else", b"", b"the true cont"])
def test_put_replaces_a_rotted_object_instead_of_trusting_its_name(
    tmp_path: Path, rotted: bytes
) -> None:
    objects = ObjectStore(RealFS(), str(tmp_path))
    object_id = objects.put(b"the true content")
    Path(objects.path_of(object_id)).write_bytes(rotted)
    assert objects.put(b"the true content") == object_id
    assert objects.get(object_id) == b"the true content"
    assert os.listdir(tmp_path / "tmp") == []  # the temp was renamed into place


BAD_OBJECT_IDS: list[object] = [
    "",
    "0" * 63,
    "0" * 65,
    "A" * 64,  # uppercase
    "g" * 64,
    "0" * 63 + "\n",
    "0" * 64 + "\n",  # a `$` regex would accept this one
    "../" + "0" * 61,
    "/" + "0" * 63,
    "0" * 32 + "\x00" + "0" * 31,
    " " + "0" * 63,
    None,
    64,
    b"0" * 64,
    ["0" * 64],
]


@pytest.mark.parametrize("bad", BAD_OBJECT_IDS, ids=repr)
def test_bad_object_ids_are_refused_before_any_fs_call(bad: object) -> None:
    fs = SimulatedFS()
    objects = ObjectStore(fs, ROOT)
    for call in (objects.get, objects.has, objects.path_of):
        with pytest.raises(InvalidObjectId, match="64 lowercase hex"):
            call(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidObjectId):
        validate_object_id(bad)
    assert fs.total_calls == 0
    assert isinstance(InvalidObjectId(bad), ValueError)


def test_put_refuses_non_bytes() -> None:
    objects = ObjectStore(SimulatedFS(), ROOT)
    with pytest.raises(TypeError, match="bytes"):
        objects.put("text")  # type: ignore[arg-type]


def test_put_is_durable_when_it_returns() -> None:
    fs = SimulatedFS()
    objects = ObjectStore(fs, ROOT)
    object_id = objects.put(b"durable")
    assert fs.durable_exists(objects.path_of(object_id))
    fs.crash("power")
    assert ObjectStore(fs, ROOT).get(object_id) == b"durable"


def test_put_after_a_peer_died_before_its_fsync_makes_the_object_durable() -> None:
    fs = SimulatedFS()
    content = b"linked by a peer, never fsynced"
    # The peer dies right after its link: the name is volatile only.
    fs.fault = DiskFaultPlan(FaultRule(Fault(FaultKind.KILL_AFTER), op=Op.LINK))
    with pytest.raises(SimulatedCrash):
        ObjectStore(fs, ROOT).put(content)
    fs.crash("process")
    fs.fault = None
    objects = ObjectStore(fs, ROOT)
    path = objects.path_of(object_id_of(content))
    assert fs.exists(path) and not fs.durable_exists(path)
    objects.put(content)  # EEXIST, and still the fsync of the directory
    assert fs.durable_exists(path)


def _put_calls(content: bytes) -> int:
    fs = SimulatedFS()
    ObjectStore(fs, ROOT).put(content)
    return fs.total_calls


@pytest.mark.parametrize("crash", ["process", "power"])
@pytest.mark.parametrize("kill", [FaultKind.KILL_BEFORE, FaultKind.KILL_AFTER])
def test_a_kill_at_every_call_of_put_leaves_the_object_whole_or_absent(
    crash: str, kill: FaultKind
) -> None:
    content = b"x" * 1000
    object_id = object_id_of(content)
    for nth in range(_put_calls(content)):
        fs = SimulatedFS(seed=nth)
        fs.fault = DiskFaultPlan(FaultRule(Fault(kill), nth=nth))
        with pytest.raises(SimulatedCrash):
            ObjectStore(fs, ROOT).put(content)
        fs.crash(crash)
        fs.fault = None
        objects = ObjectStore(fs, ROOT)
        with contextlib.suppress(ObjectNotFound):  # whole, or absent
            assert objects.get(object_id) == content
        # A retry always gets there, durably.
        assert objects.put(content) == object_id
        assert fs.durable_exists(objects.path_of(object_id))
        assert objects.get(object_id) == content


def test_eio_on_link_is_retried() -> None:
    fs = SimulatedFS()
    plan = DiskFaultPlan(FaultRule(Fault(FaultKind.EIO), op=Op.LINK, nth=0))
    fs.fault = plan
    objects = ObjectStore(fs, ROOT)
    object_id = objects.put(b"retried")
    assert len(plan.fired) == 1
    assert objects.get(object_id) == b"retried"


def test_lost_link_reply_is_fine() -> None:
    fs = FaultyFS(SimulatedFS(), DiskFaultPlan(FaultRule(Fault(FaultKind.LOST_LINK_REPLY))))
    objects = ObjectStore(fs, ROOT)
    assert objects.get(objects.put(b"lost reply")) == b"lost reply"


def test_enospc_on_write_is_a_store_io_error() -> None:
    fs = SimulatedFS()
    fs.fault = DiskFaultPlan(FaultRule(Fault(FaultKind.ENOSPC), op=Op.WRITE_TEMP))
    objects = ObjectStore(fs, ROOT)
    with pytest.raises(StoreIOError, match="No space") as caught:
        objects.put(b"does not fit")
    assert isinstance(caught.value.__cause__, OSError)
    assert not objects.has(object_id_of(b"does not fit"))


def test_a_persistent_link_failure_gives_up_with_a_store_io_error() -> None:
    fs = SimulatedFS()
    fs.fault = DiskFaultPlan(FaultRule(Fault(FaultKind.EIO), op=Op.LINK))
    with pytest.raises(StoreIOError, match="linking"):
        ObjectStore(fs, ROOT).put(b"never")


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4096))
def test_any_content_round_trips_and_stays_under_the_root(content: bytes) -> None:
    fs = SimulatedFS()
    fs.log = []
    objects = ObjectStore(fs, ROOT)
    object_id = objects.put(content)
    assert objects.get(object_id) == content
    assert objects.has(object_id)
    for call in fs.log:
        assert call.path == ROOT or call.path.startswith(ROOT + "/") or call.path == "/"
