"""The FS and Clock interface: RealFS on a real directory, SimulatedFS with
its durable and volatile images and faults, the simulated clocks, and
FaultyFS over the real disk (docs/design.md)."""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import posixpath
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchtx.fs import (
    FS,
    TEMP_PREFIX,
    AppendHandle,
    Call,
    Clock,
    CrashKind,
    DiskFaultPlan,
    Fault,
    FaultKind,
    FaultNotApplicable,
    FaultRule,
    FaultyFS,
    FiredFault,
    Op,
    RealClock,
    RealFS,
    SimulatedClock,
    SimulatedCrash,
    SimulatedFS,
    SimulatedTime,
    UnsyncedTail,
    is_temp_name,
)

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def only(
    fault: Fault, op: Op | None = None, nth: int | None = None, path: str = ""
) -> DiskFaultPlan:
    """A plan with one rule."""
    return DiskFaultPlan(FaultRule(fault, op=op, nth=nth, path_contains=path))


def publish(fs: FS, directory: str, name: str, data: bytes) -> bool:
    """The store's publish step: temp, fsync, link, fsync the directory,
    drop the temp. True if our link made the change."""
    temp = fs.write_temp(directory, data)
    try:
        fs.link(temp, posixpath.join(directory, name))
    except FileExistsError:
        return False
    finally:
        fs.fsync_dir(directory)
        fs.unlink(temp)
    return True


def names_without_temps(fs: FS, directory: str) -> list[str]:
    return [name for name in fs.listdir(directory) if not is_temp_name(name)]


@pytest.fixture
def sim() -> SimulatedFS:
    fs = SimulatedFS(seed=7)
    fs.mkdir("/store")
    return fs


# ---------------------------------------------------------------------------
# RealFS
# ---------------------------------------------------------------------------


def test_real_and_simulated_classes_satisfy_the_protocols(tmp_path: Path) -> None:
    real: FS = RealFS()
    simulated: FS = SimulatedFS()
    faulty: FS = FaultyFS(real)
    clocks: list[Clock] = [RealClock(), SimulatedClock()]
    for fs in (real, simulated, faulty):
        assert isinstance(fs, FS)
    for clock in clocks:
        assert isinstance(clock, Clock)
    simulated.mkdir("/d")
    for fs, path in (
        (real, str(tmp_path / "j")),
        (simulated, "/d/j"),
        (faulty, str(tmp_path / "k")),
    ):
        handle = fs.open_append(path)
        assert isinstance(handle, AppendHandle)
        assert handle.path == path
        handle.close()


def test_real_write_temp_creates_distinct_fsynced_temps_with_the_temp_prefix(
    tmp_path: Path,
) -> None:
    fs = RealFS()
    first = fs.write_temp(str(tmp_path), b"one")
    second = fs.write_temp(str(tmp_path), b"two")
    assert first != second
    assert os.path.dirname(first) == str(tmp_path)
    assert all(is_temp_name(os.path.basename(p)) for p in (first, second))
    assert (fs.read(first), fs.read(second)) == (b"one", b"two")


def test_real_write_temp_removes_its_temp_when_the_fsync_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError) as caught:
        RealFS().write_temp(str(tmp_path), b"data")
    assert caught.value.errno == errno.EIO
    assert os.listdir(tmp_path) == []


def test_real_link_publishes_once_and_refuses_an_existing_slot(tmp_path: Path) -> None:
    fs = RealFS()
    directory = str(tmp_path)
    assert publish(fs, directory, "s.0000000001", b"claim by A")
    assert not publish(fs, directory, "s.0000000001", b"claim by B")
    assert fs.read(str(tmp_path / "s.0000000001")) == b"claim by A"
    assert fs.listdir(directory) == ["s.0000000001"]  # temps unlinked


def test_real_mkdir_creates_parents_tolerates_existing_and_refuses_a_file(
    tmp_path: Path,
) -> None:
    fs = RealFS()
    fs.mkdir(str(tmp_path / "a" / "b" / "c"))
    fs.mkdir(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b" / "c").is_dir()
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(FileExistsError):
        fs.mkdir(str(tmp_path / "f"))


def test_real_rename_replaces_the_destination(tmp_path: Path) -> None:
    fs = RealFS()
    old, new = str(tmp_path / "journal"), fs.write_temp(str(tmp_path), b"compacted")
    fs.pwrite(old, 0, b"long old journal")
    fs.rename(new, old)
    fs.fsync_dir(str(tmp_path))
    assert fs.read(old) == b"compacted"
    assert fs.listdir(str(tmp_path)) == ["journal"]


def test_real_listdir_is_sorted_and_exists_is_false_only_for_absent_paths(
    tmp_path: Path,
) -> None:
    fs = RealFS()
    for name in ("c", "a", "b"):
        fs.pwrite(str(tmp_path / name), 0, b"x")
    assert fs.listdir(str(tmp_path)) == ["a", "b", "c"]
    assert fs.exists(str(tmp_path / "a"))
    assert fs.exists(str(tmp_path))
    assert not fs.exists(str(tmp_path / "missing"))
    assert not fs.exists(str(tmp_path / "a" / "below-a-file"))
    with pytest.raises(FileNotFoundError):
        fs.read(str(tmp_path / "missing"))


def test_real_append_handle_appends_with_one_write_and_truncates(tmp_path: Path) -> None:
    fs = RealFS()
    path = str(tmp_path / "journal")
    handle = fs.open_append(path)
    assert handle.append(b"record-1\n") == 9
    assert handle.append(b"torn") == 4
    handle.fsync()
    assert handle.size() == 13
    handle.truncate(9)  # back to the last good record
    assert handle.append(b"record-2\n") == 9  # O_APPEND: at the new end
    handle.close()
    assert fs.read(path) == b"record-1\nrecord-2\n"
    again = fs.open_append(path)  # reopening appends, never truncates
    again.append(b"record-3\n")
    again.close()
    assert fs.read(path).count(b"\n") == 3


def test_real_append_handle_close_is_idempotent_and_use_after_close_is_ebadf(
    tmp_path: Path,
) -> None:
    handle = RealFS().open_append(str(tmp_path / "j"))
    handle.close()
    handle.close()
    with pytest.raises(OSError) as caught:
        handle.append(b"x")
    assert caught.value.errno == errno.EBADF


def test_real_pwrite_creates_overwrites_in_place_and_zero_fills(tmp_path: Path) -> None:
    fs = RealFS()
    path = str(tmp_path / "heartbeat")
    fs.pwrite(path, 2, b"ab")
    assert fs.read(path) == b"\0\0ab"
    fs.pwrite(path, 0, b"XYZ")
    assert fs.read(path) == b"XYZb"
    fs.pwrite(path, 3, b"!", sync=False)
    assert fs.read(path) == b"XYZ!"


def test_real_clock_reads_the_host_clocks() -> None:
    clock = RealClock()
    first = clock.monotonic()
    assert clock.monotonic() >= first
    assert abs(clock.wall() - time.time()) < 5.0


# ---------------------------------------------------------------------------
# RealFS and SimulatedFS agree (no faults)
# ---------------------------------------------------------------------------

_PATHS = ["a", "b", "d", "d/c", "d/e", "x/y"]
_STEP_OPS = [
    "read",
    "exists",
    "listdir",
    "pwrite",
    "append",
    "truncate",
    "link",
    "rename",
    "unlink",
    "mkdir",
    "fsync_dir",
    "write_temp",
    "link_temp",
]


@dataclass(frozen=True)
class Step:
    op: str
    path: str
    other: str
    data: bytes
    number: int


_steps = st.builds(
    Step,
    op=st.sampled_from(_STEP_OPS),
    path=st.sampled_from(_PATHS),
    other=st.sampled_from(_PATHS),
    data=st.binary(max_size=5),
    number=st.integers(0, 6),
)


class _Runner:
    """Runs steps on one FS rooted at `root`; temps are named T0, T1, ..."""

    def __init__(self, fs: FS, root: str) -> None:
        self.fs = fs
        self.root = root
        self.temps: list[str] = []

    def at(self, name: str) -> str:
        return posixpath.join(self.root, name)

    def rename_temps(self, names: list[str]) -> list[str]:
        basenames = {posixpath.basename(path): f"T{k}" for k, path in enumerate(self.temps)}
        return sorted(basenames.get(name, name) for name in names)

    def apply(self, step: Step) -> object:
        """Run one step; return what it answered (None for a call with no answer)."""
        fs, path, other = self.fs, self.at(step.path), self.at(step.other)
        if step.op == "read":
            return fs.read(path)
        if step.op == "exists":
            return fs.exists(path)
        if step.op == "listdir":
            return self.rename_temps(fs.listdir(path))
        if step.op == "write_temp":
            self.temps.append(fs.write_temp(path, step.data))
            return len(self.temps) - 1
        if step.op in ("append", "truncate"):
            handle = fs.open_append(path)
            try:
                if step.op == "append":
                    return handle.append(step.data)
                handle.truncate(step.number)
                return handle.size()
            finally:
                handle.close()
        if step.op == "pwrite":
            fs.pwrite(path, step.number, step.data)
        elif step.op == "link":
            fs.link(path, other)
        elif step.op == "rename":
            fs.rename(path, other)
        elif step.op == "unlink":
            fs.unlink(path)
        elif step.op == "mkdir":
            fs.mkdir(path)
        elif step.op == "fsync_dir":
            fs.fsync_dir(path)
        elif step.op == "link_temp" and self.temps:
            fs.link(self.temps[step.number % len(self.temps)], other)
        return None

    def outcome(self, step: Step) -> tuple[str, object]:
        try:
            return ("ok", self.apply(step))
        except OSError as error:
            return (type(error).__name__, error.errno)

    def tree(self, name: str = "") -> object:
        """Everything below `name`: {entry: subtree} for a directory, bytes for a file."""
        path = self.at(name) if name else self.root
        try:
            entries = self.fs.listdir(path)
        except NotADirectoryError:
            return self.fs.read(path)
        subtrees = {entry: self.tree(posixpath.join(name, entry)) for entry in entries}
        return {self.rename_temps([entry])[0]: sub for entry, sub in subtrees.items()}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(_steps, max_size=14))
def test_simulated_fs_answers_every_call_as_the_real_disk_does(steps: list[Step]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        real = _Runner(RealFS(), directory)
        simulated = _Runner(SimulatedFS(seed=1), "/")
        for step in steps:
            assert simulated.outcome(step) == real.outcome(step), step
        assert simulated.tree() == real.tree()


# ---------------------------------------------------------------------------
# SimulatedFS: durability, process kill and power loss
# ---------------------------------------------------------------------------


def test_power_loss_drops_appends_after_the_last_fsync_and_keeps_the_synced_ones(
    sim: SimulatedFS,
) -> None:
    handle = sim.open_append("/store/journal")
    sim.fsync_dir("/store")
    handle.append(b"synced\n")
    handle.fsync()
    handle.append(b"unsynced\n")
    assert sim.read("/store/journal") == b"synced\nunsynced\n"
    assert sim.is_dirty("/store/journal")
    sim.crash("power")
    assert sim.read("/store/journal") == b"synced\n"
    assert not sim.is_dirty("/store/journal")


def test_process_kill_keeps_unsynced_data_and_unsynced_directory_entries(
    sim: SimulatedFS,
) -> None:
    handle = sim.open_append("/store/journal")
    handle.append(b"never fsynced\n")
    sim.link(sim.write_temp("/store", b"slot"), "/store/s.1")
    sim.crash("process")
    assert sim.read("/store/journal") == b"never fsynced\n"
    assert sim.read("/store/s.1") == b"slot"
    assert sim.crashes[CrashKind.PROCESS] == 1


def test_power_loss_drops_a_linked_slot_until_its_directory_is_fsynced(
    sim: SimulatedFS,
) -> None:
    sim.link(sim.write_temp("/store", b"claim"), "/store/s.1")
    assert not sim.durable_exists("/store/s.1")
    sim.crash(CrashKind.POWER)
    assert sim.listdir("/store") == []  # the fsynced temp's name was never durable either
    assert publish(sim, "/store", "s.1", b"claim")
    assert sim.durable_read("/store/s.1") == b"claim"
    sim.crash("power")
    assert sim.read("/store/s.1") == b"claim"


def test_power_loss_brings_back_a_temp_whose_unlink_was_not_fsynced(sim: SimulatedFS) -> None:
    assert publish(sim, "/store", "s.1", b"claim")  # unlinks the temp after fsync_dir
    assert sim.listdir("/store") == ["s.1"]
    sim.crash("power")
    names = sim.listdir("/store")
    assert names_without_temps(sim, "/store") == ["s.1"]
    assert len(names) == 2 and is_temp_name(names[0])
    assert sim.read("/store/" + names[0]) == b"claim"  # a leftover for the store's GC


def test_power_loss_undoes_a_rename_not_covered_by_fsync_dir(sim: SimulatedFS) -> None:
    sim.pwrite("/store/journal", 0, b"old journal")
    sim.fsync_dir("/store")
    sim.rename(sim.write_temp("/store", b"compacted"), "/store/journal")
    sim.crash("power")
    assert sim.read("/store/journal") == b"old journal"
    sim.rename(sim.write_temp("/store", b"compacted"), "/store/journal")
    sim.fsync_dir("/store")
    sim.crash("power")
    assert sim.read("/store/journal") == b"compacted"
    assert sim.listdir("/store") == ["journal"]


def test_a_new_file_fsynced_but_not_its_directory_is_lost_on_power_loss(
    sim: SimulatedFS,
) -> None:
    handle = sim.open_append("/store/journal")
    handle.append(b"record\n")
    handle.fsync()
    sim.crash("power")
    assert not sim.exists("/store/journal")


def test_mkdir_is_durable_at_once_as_realfs_fsyncs_the_parents(sim: SimulatedFS) -> None:
    sim.mkdir("/store/items/ab/cd")
    assert sim.durable_listdir("/store/items/ab") == ["cd"]
    sim.crash("power")
    assert sim.listdir("/store/items/ab/cd") == []


def test_appends_after_a_rename_over_the_name_go_to_the_old_file(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    handle.append(b"a\n")
    sim.rename(sim.write_temp("/store", b"compacted\n"), "/store/journal")
    handle.append(b"lost\n")
    assert sim.read("/store/journal") == b"compacted\n"
    reopened = sim.open_append("/store/journal")
    reopened.append(b"b\n")
    assert sim.read("/store/journal") == b"compacted\nb\n"


def test_hard_links_share_one_content(sim: SimulatedFS) -> None:
    sim.pwrite("/store/a", 0, b"same")
    sim.link("/store/a", "/store/b")
    sim.pwrite("/store/b", 0, b"SAME")
    assert sim.read("/store/a") == b"SAME"
    sim.unlink("/store/a")
    assert sim.read("/store/b") == b"SAME"


def test_pwrite_is_durable_but_its_new_name_needs_fsync_dir(sim: SimulatedFS) -> None:
    sim.pwrite("/store/heartbeat", 0, b"0001")
    sim.fsync_dir("/store")
    sim.pwrite("/store/heartbeat", 2, b"99")
    assert sim.durable_read("/store/heartbeat") == b"0099"
    sim.pwrite("/store/other", 0, b"x")
    sim.crash("power")
    assert sim.read("/store/heartbeat") == b"0099"
    assert not sim.exists("/store/other")


def test_pwrite_without_sync_is_seen_at_once_but_lost_on_power_loss(sim: SimulatedFS) -> None:
    sim.pwrite("/store/heartbeat", 0, b"0001")
    sim.fsync_dir("/store")
    sim.pwrite("/store/heartbeat", 0, b"0002", sync=False)
    assert sim.read("/store/heartbeat") == b"0002"
    assert sim.durable_read("/store/heartbeat") == b"0001"
    sim.crash("process")  # the page cache survives a kill
    assert sim.read("/store/heartbeat") == b"0002"
    sim.crash("power")
    assert sim.read("/store/heartbeat") == b"0001"


def test_pwrite_without_sync_fails_plainly_on_eio(sim: SimulatedFS) -> None:
    sim.pwrite("/store/heartbeat", 0, b"0001")
    sim.fault = only(Fault(FaultKind.EIO), Op.PWRITE)
    with pytest.raises(OSError):
        sim.pwrite("/store/heartbeat", 0, b"0002", sync=False)
    assert sim.read("/store/heartbeat") == b"0001"


def test_truncate_below_the_synced_size_is_undone_by_power_loss(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    sim.fsync_dir("/store")
    handle.append(b"0123456789")
    handle.fsync()
    handle.truncate(4)
    handle.append(b"xy")
    assert sim.read("/store/journal") == b"0123xy"
    assert sim.durable_read("/store/journal") == b"0123456789"
    sim.crash("power")
    assert sim.read("/store/journal") == b"0123456789"


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (UnsyncedTail.DROP, {b"rec1\n"}),
        (UnsyncedTail.ZEROED, {b"rec1\n" + bytes(10)}),
        (UnsyncedTail.TORN, {b"rec1\n" + b"rec2\nrec3\n"[:k] for k in range(11)}),
    ],
)
def test_power_loss_leaves_the_chosen_tail_of_unsynced_appends(
    sim: SimulatedFS, tail: UnsyncedTail, expected: set[bytes]
) -> None:
    handle = sim.open_append("/store/journal")
    sim.fsync_dir("/store")
    handle.append(b"rec1\n")
    handle.fsync()
    handle.append(b"rec2\n")
    handle.append(b"rec3\n")
    sim.crash("power", unsynced_tail=tail)
    assert sim.read("/store/journal") in expected
    assert not sim.is_dirty("/store/journal")  # what survived is on disk now


def test_torn_tails_are_deterministic_for_a_seed_and_vary_across_seeds() -> None:
    def survivor(seed: int) -> bytes:
        fs = SimulatedFS(seed=seed)
        fs.mkdir("/d")
        handle = fs.open_append("/d/j")
        fs.fsync_dir("/d")
        handle.append(bytes(range(200)))
        fs.crash("power", unsynced_tail=UnsyncedTail.TORN)
        return fs.read("/d/j")

    assert survivor(3) == survivor(3)
    assert len({survivor(seed) for seed in range(8)}) > 1


def test_handles_opened_before_a_crash_are_invalid_after_it(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    sim.crash("process")
    with pytest.raises(OSError) as caught:
        handle.append(b"x")
    assert caught.value.errno == errno.EBADF
    handle.close()  # closing a dead descriptor is harmless


def test_a_close_that_fails_still_releases_the_handle(tmp_path: Path) -> None:
    simulated = SimulatedFS()
    faulty = FaultyFS(RealFS(), kill=_no_kill)
    for fs, path in ((simulated, "/j"), (faulty, str(tmp_path / "j"))):
        handle = fs.open_append(path)
        fs.fault = only(Fault(FaultKind.EIO), Op.CLOSE)
        with pytest.raises(OSError) as caught:
            handle.close()
        assert caught.value.errno == errno.EIO
        with pytest.raises(OSError) as reused:
            handle.append(b"x")
        assert reused.value.errno == errno.EBADF
        handle.close()  # a second close is a no-op, not another fault point
        assert fs.calls[Op.CLOSE] == 1


def test_a_deep_copy_is_an_independent_disk_to_crash_on_the_side(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    sim.fsync_dir("/store")
    handle.append(b"synced\n")
    handle.fsync()
    handle.append(b"unsynced\n")
    sim.link("/store/journal", "/store/alias")
    clone = copy.deepcopy(sim)
    clone.crash("power")
    assert clone.read("/store/journal") == b"synced\n"
    assert not clone.exists("/store/alias")
    assert sim.read("/store/alias") == b"synced\nunsynced\n"  # the original is untouched
    handle.append(b"more\n")  # and its handles still work
    assert sim.read("/store/journal").endswith(b"more\n")
    assert clone.read("/store/journal") == b"synced\n"


def test_same_seed_gives_the_same_temp_names() -> None:
    def names(seed: int) -> list[str]:
        fs = SimulatedFS(seed=seed)
        fs.mkdir("/d")
        return [fs.write_temp("/d", b"") for _ in range(3)]

    assert names(5) == names(5)
    assert names(5) != names(6)
    assert all(posixpath.basename(n).startswith(TEMP_PREFIX) for n in names(5))


_sim_steps = st.builds(
    Step,
    op=st.sampled_from([*_STEP_OPS, "fsync"]),
    path=st.sampled_from(_PATHS),
    other=st.sampled_from(_PATHS),
    data=st.binary(max_size=5),
    number=st.integers(0, 6),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_sim_steps, max_size=20), st.sampled_from(list(CrashKind)))
def test_a_crash_leaves_the_durable_image_on_power_loss_and_everything_on_a_kill(
    steps: list[Step], kind: CrashKind
) -> None:
    fs = SimulatedFS(seed=2)
    runner = _Runner(fs, "/")
    handles: dict[str, AppendHandle] = {}
    for step in steps:
        if step.op == "fsync":  # fsync through a handle kept open, as the journal does
            try:
                handle = handles.get(step.path) or fs.open_append(step.path)
                handles[step.path] = handle
                handle.append(step.data)
                handle.fsync()
            except OSError:
                pass
        else:
            runner.outcome(step)

    def durable_tree(path: str) -> object:
        try:
            return {n: durable_tree(posixpath.join(path, n)) for n in fs.durable_listdir(path)}
        except NotADirectoryError:
            return fs.durable_read(path)

    before_volatile, before_durable = runner.tree(), durable_tree("/")
    fs.crash(kind)
    after = durable_tree("/")
    if kind is CrashKind.POWER:
        assert _Runner(fs, "/").tree() == before_durable
    else:
        assert runner.tree() == before_volatile
    assert durable_tree("/") == after  # a crash syncs nothing, and power loss is idempotent
    fs.crash("power")
    assert durable_tree("/") == after


# ---------------------------------------------------------------------------
# SimulatedFS: faults
# ---------------------------------------------------------------------------


def test_eio_fails_the_call_without_effect(sim: SimulatedFS) -> None:
    temp = sim.write_temp("/store", b"claim")
    sim.fault = only(Fault(FaultKind.EIO), Op.LINK)
    with pytest.raises(OSError) as caught:
        sim.link(temp, "/store/s.1")
    assert caught.value.errno == errno.EIO
    assert not sim.exists("/store/s.1")


def test_fsync_eio_drops_the_dirty_pages_and_reports_eio(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    handle.append(b"good\n")
    handle.fsync()
    handle.append(b"dirty\n")
    sim.fault = only(Fault(FaultKind.EIO), Op.FSYNC)
    with pytest.raises(OSError) as caught:
        handle.fsync()
    assert caught.value.errno == errno.EIO
    assert sim.read("/store/journal") == b"good\n"  # gone before any crash
    assert handle.size() == 5


def test_pwrite_eio_loses_the_write(sim: SimulatedFS) -> None:
    sim.pwrite("/store/heartbeat", 0, b"0001")
    sim.fault = only(Fault(FaultKind.EIO), Op.PWRITE)
    with pytest.raises(OSError):
        sim.pwrite("/store/heartbeat", 0, b"0002")
    assert sim.read("/store/heartbeat") == b"0001"


def test_fsync_dir_eio_makes_nothing_durable(sim: SimulatedFS) -> None:
    sim.link(sim.write_temp("/store", b"claim"), "/store/s.1")
    sim.fault = only(Fault(FaultKind.EIO), Op.FSYNC_DIR)
    with pytest.raises(OSError):
        sim.fsync_dir("/store")
    assert not sim.durable_exists("/store/s.1")


def test_lost_link_reply_links_and_then_raises_file_exists(sim: SimulatedFS) -> None:
    sim.fault = only(Fault(FaultKind.LOST_LINK_REPLY))
    assert not publish(sim, "/store", "s.1", b"nonce=ours")  # we believe we lost ...
    assert sim.read("/store/s.1") == b"nonce=ours"  # ... but the slot holds our nonce


def test_stale_absent_hides_an_existing_file_from_read_and_exists(sim: SimulatedFS) -> None:
    sim.pwrite("/store/s.1", 0, b"claim")
    sim.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.READ),
        FaultRule(Fault(FaultKind.STALE_ABSENT), op=Op.EXISTS),
    )
    with pytest.raises(FileNotFoundError):
        sim.read("/store/s.1")
    assert not sim.exists("/store/s.1")
    with pytest.raises(FileExistsError):  # only link tells the truth
        sim.link(sim.write_temp("/store", b"claim 2"), "/store/s.1")


def test_estale_fails_the_call_without_effect(sim: SimulatedFS) -> None:
    sim.pwrite("/store/s.1", 0, b"claim")
    sim.fault = only(Fault(FaultKind.ESTALE), Op.UNLINK)
    with pytest.raises(OSError) as caught:
        sim.unlink("/store/s.1")
    assert caught.value.errno == errno.ESTALE
    assert sim.exists("/store/s.1")


def test_enospc_on_append_lands_a_prefix_then_raises(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    sim.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.ENOSPC, keep=3), op=Op.APPEND, nth=0),
        FaultRule(Fault(FaultKind.ENOSPC), op=Op.APPEND, nth=1),
    )
    with pytest.raises(OSError) as caught:
        handle.append(b"record\n")
    assert caught.value.errno == errno.ENOSPC
    assert sim.read("/store/journal") == b"rec"
    handle.truncate(0)  # what the journal does after a failed append
    with pytest.raises(OSError):
        handle.append(b"12345678")
    assert sim.read("/store/journal") == b"1234"  # half by default


def test_enospc_on_write_temp_leaves_an_unsynced_orphan_holding_a_prefix(
    sim: SimulatedFS,
) -> None:
    sim.fault = only(Fault(FaultKind.ENOSPC, keep=2), Op.WRITE_TEMP)
    with pytest.raises(OSError) as caught:
        sim.write_temp("/store", b"claim")
    assert caught.value.errno == errno.ENOSPC
    (orphan,) = sim.listdir("/store")
    assert is_temp_name(orphan)
    assert sim.read("/store/" + orphan) == b"cl"
    sim.fsync_dir("/store")
    sim.crash("power")
    assert sim.read("/store/" + orphan) == b""  # its data was never fsynced


def test_enospc_on_pwrite_lands_a_prefix_unsynced(sim: SimulatedFS) -> None:
    sim.pwrite("/store/heartbeat", 0, b"0000")
    sim.fsync_dir("/store")
    sim.fault = only(Fault(FaultKind.ENOSPC, keep=2), Op.PWRITE)
    with pytest.raises(OSError):
        sim.pwrite("/store/heartbeat", 0, b"1111")
    assert sim.read("/store/heartbeat") == b"1100"
    assert sim.durable_read("/store/heartbeat") == b"0000"


def test_enospc_on_link_fails_without_effect(sim: SimulatedFS) -> None:
    temp = sim.write_temp("/store", b"x")
    sim.fault = only(Fault(FaultKind.ENOSPC), Op.LINK)
    with pytest.raises(OSError) as caught:
        sim.link(temp, "/store/s.1")
    assert caught.value.errno == errno.ENOSPC
    assert not sim.exists("/store/s.1")


def test_short_write_returns_the_prefix_length_without_an_error(sim: SimulatedFS) -> None:
    handle = sim.open_append("/store/journal")
    sim.fault = only(Fault(FaultKind.SHORT_WRITE, keep=4), Op.APPEND)
    assert handle.append(b"record\n") == 4
    assert sim.read("/store/journal") == b"reco"


def test_kill_before_a_call_leaves_no_effect_and_raises_simulated_crash(
    sim: SimulatedFS,
) -> None:
    temp = sim.write_temp("/store", b"claim")
    sim.fault = only(Fault(FaultKind.KILL_BEFORE), Op.LINK)
    with pytest.raises(SimulatedCrash) as caught:
        sim.link(temp, "/store/s.1")
    assert (caught.value.op, caught.value.path, caught.value.when) == (
        Op.LINK,
        "/store/s.1",
        "before",
    )
    sim.crash("process")
    assert not sim.exists("/store/s.1")


def test_kill_after_a_call_keeps_its_effect(sim: SimulatedFS) -> None:
    temp = sim.write_temp("/store", b"claim")
    sim.fault = only(Fault(FaultKind.KILL_AFTER), Op.LINK)
    with pytest.raises(SimulatedCrash) as caught:
        sim.link(temp, "/store/s.1")
    assert caught.value.when == "after"
    sim.crash("process")
    assert sim.read("/store/s.1") == b"claim"


def test_kill_after_fires_even_when_the_call_itself_fails(sim: SimulatedFS) -> None:
    sim.fault = only(Fault(FaultKind.KILL_AFTER), Op.READ)
    with pytest.raises(SimulatedCrash) as caught:
        sim.read("/store/missing")
    assert isinstance(caught.value.__context__, FileNotFoundError)


def test_simulated_crash_escapes_except_exception_and_later_calls_are_refused(
    sim: SimulatedFS,
) -> None:
    sim.fault = only(Fault(FaultKind.KILL_BEFORE), Op.WRITE_TEMP)
    handle = sim.open_append("/store/journal")

    def store_code_that_swallows_errors() -> None:
        with contextlib.suppress(Exception):  # the point: this must not catch a kill
            sim.write_temp("/store", b"x")

    with pytest.raises(SimulatedCrash):
        store_code_that_swallows_errors()
    assert sim.killed
    calls_before = sim.total_calls
    for call in (lambda: sim.read("/store/journal"), lambda: handle.append(b"x"), handle.close):
        with pytest.raises(SimulatedCrash) as caught:
            call()
        assert caught.value.when == "dead"
    assert sim.total_calls == calls_before  # a dead process makes no calls
    sim.crash("process")
    assert sim.read("/store/journal") == b""  # calls are accepted again


def test_a_fault_hook_can_be_any_callable_and_an_impossible_fault_is_refused(
    sim: SimulatedFS,
) -> None:
    seen: list[tuple[Op, str]] = []

    def hook(op: Op, path: str) -> Fault | None:
        seen.append((op, path))
        return Fault(FaultKind.LOST_LINK_REPLY) if op == "read" else None

    sim.fault = hook
    sim.pwrite("/store/a", 0, b"x")
    with pytest.raises(FaultNotApplicable):
        sim.read("/store/a")
    assert seen == [(Op.PWRITE, "/store/a"), (Op.READ, "/store/a")]


def test_fault_descriptions_refuse_nonsense() -> None:
    with pytest.raises(FaultNotApplicable):
        FaultRule(Fault(FaultKind.LOST_LINK_REPLY), op=Op.READ)
    with pytest.raises(ValueError):
        Fault(FaultKind.EIO, keep=3)
    with pytest.raises(ValueError):
        Fault(FaultKind.ENOSPC, keep=-1)
    with pytest.raises(ValueError):
        FaultRule(Fault(FaultKind.EIO), nth=-1)
    assert Fault(FaultKind.ENOSPC, keep=10).kept(4) == 4
    assert Fault(FaultKind.SHORT_WRITE).kept(7) == 3


def test_fault_plan_fires_only_at_the_nth_matching_call(sim: SimulatedFS) -> None:
    plan = only(Fault(FaultKind.EIO), Op.PWRITE, nth=2)
    sim.fault = plan
    outcomes = []
    for n in range(4):
        try:
            sim.pwrite(f"/store/f{n}", 0, b"x")
            outcomes.append("ok")
        except OSError:
            outcomes.append("eio")
    assert outcomes == ["ok", "ok", "eio", "ok"]
    assert plan.fired == [FiredFault(Op.PWRITE, "/store/f2", Fault(FaultKind.EIO))]
    assert plan.seen == [4]


def test_fault_plan_without_nth_fires_at_every_matching_call_and_filters_paths(
    sim: SimulatedFS,
) -> None:
    sim.fault = only(Fault(FaultKind.ESTALE), Op.READ, path="/s.")
    sim.pwrite("/store/s.1", 0, b"x")
    sim.pwrite("/store/heartbeat", 0, b"y")
    for _ in range(3):
        with pytest.raises(OSError):
            sim.read("/store/s.1")
    assert sim.read("/store/heartbeat") == b"y"


def test_fault_plan_counts_every_rule_and_the_first_firing_rule_wins(sim: SimulatedFS) -> None:
    plan = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.EXISTS, nth=1),
        FaultRule(Fault(FaultKind.STALE_ABSENT), nth=1),  # any op where it can happen
    )
    sim.fault = plan
    sim.pwrite("/store/a", 0, b"x")  # matches neither: ENOSPC-free op for rule 2
    assert sim.exists("/store/a")  # rule 1 call 0, rule 2 call 0
    with pytest.raises(OSError) as caught:  # rule 1 call 1 (EIO) beats rule 2 call 1
        sim.exists("/store/a")
    assert caught.value.errno == errno.EIO
    assert plan.seen == [2, 2]
    assert sim.read("/store/a") == b"x"  # rule 2 call 2: nth was 1, spent


def test_a_global_kill_rule_counts_calls_of_every_op(sim: SimulatedFS) -> None:
    sim.fault = only(Fault(FaultKind.KILL_BEFORE), nth=2)
    sim.exists("/store")
    sim.listdir("/store")
    with pytest.raises(SimulatedCrash) as caught:
        sim.write_temp("/store", b"x")
    assert caught.value.op is Op.WRITE_TEMP


def test_calls_are_counted_per_operation_and_optionally_logged(sim: SimulatedFS) -> None:
    sim.reset_calls()
    sim.log = []
    assert publish(sim, "/store", "s.1", b"claim")
    handle = sim.open_append("/store/j")
    handle.append(b"x")
    handle.close()
    assert sim.calls[Op.WRITE_TEMP] == 1
    assert sim.calls[Op.LINK] == 1
    assert sim.calls[Op.FSYNC_DIR] == 1
    assert sim.calls[Op.UNLINK] == 1
    assert sim.calls[Op.APPEND] == 1
    assert sim.total_calls == 7
    assert sim.log[:2] == [Call(Op.WRITE_TEMP, "/store"), Call(Op.LINK, "/store/s.1")]
    sim.reset_calls()
    assert sim.total_calls == 0 and sim.log == []


@pytest.mark.parametrize("crash", list(CrashKind))
@pytest.mark.parametrize("kill", [FaultKind.KILL_BEFORE, FaultKind.KILL_AFTER])
def test_a_kill_at_every_call_of_publish_never_leaves_a_partial_or_foreign_slot(
    crash: CrashKind, kill: FaultKind
) -> None:
    def fresh() -> SimulatedFS:
        fs = SimulatedFS(seed=11)
        fs.mkdir("/item")
        fs.reset_calls()
        return fs

    counting = fresh()
    counting.log = []
    publish(counting, "/item", "s.1", b"the whole record")
    rule_for = [FaultRule(Fault(kill), nth=i) for i in range(counting.total_calls)]
    assert len(rule_for) == 4
    assert all(sum(rule.matches(*call) for call in counting.log) == 4 for rule in rule_for)
    for rule in rule_for:
        fs = fresh()
        fs.fault = DiskFaultPlan(rule)
        with pytest.raises(SimulatedCrash):
            publish(fs, "/item", "s.1", b"the whole record")
        fs.crash(crash)
        fs.fault = None
        if fs.exists("/item/s.1"):
            assert fs.read("/item/s.1") == b"the whole record"
        else:  # the publish did not happen: a retry can make it
            assert publish(fs, "/item", "s.1", b"the whole record")


def test_an_io_error_at_every_call_of_publish_is_reported_and_leaves_no_partial_slot() -> None:
    for i in range(4):
        fs = SimulatedFS(seed=11)
        fs.mkdir("/item")
        fs.fault = only(Fault(FaultKind.EIO), nth=i)
        with pytest.raises(OSError):
            publish(fs, "/item", "s.1", b"record")
        fs.crash("power")
        slots = names_without_temps(fs, "/item")  # a temp may come back: GC's business
        assert slots in ([], ["s.1"])
        if slots:
            assert fs.read("/item/s.1") == b"record"


# ---------------------------------------------------------------------------
# Simulated clocks
# ---------------------------------------------------------------------------


def test_advance_moves_both_clocks_and_refuses_to_go_backwards() -> None:
    clock = SimulatedClock(monotonic_start=100.0, wall_start=5_000.0)
    clock.advance(2.5)
    assert (clock.monotonic(), clock.wall()) == (102.5, 5_002.5)
    with pytest.raises(ValueError):
        clock.advance(-1.0)


def test_step_wall_moves_the_wall_clock_only() -> None:
    clock = SimulatedClock()
    monotonic, wall = clock.monotonic(), clock.wall()
    clock.step_wall(-3600.0)
    assert clock.monotonic() == monotonic
    assert clock.wall() == wall - 3600.0
    clock.advance(1.0)
    assert clock.wall() == wall - 3599.0


def test_hosts_on_one_simulated_time_advance_together_with_their_own_readings() -> None:
    time_ = SimulatedTime()
    host_a = time_.clock(monotonic_start=10.0)
    time_.advance(5.0)
    host_b = time_.clock(monotonic_start=1_000.0, wall_start=7.0)  # joins late
    assert (host_a.monotonic(), host_b.monotonic(), host_b.wall()) == (15.0, 1_000.0, 7.0)
    host_b.advance(1.0)  # one time for all: a's clock moves too
    assert (host_a.monotonic(), host_b.monotonic()) == (16.0, 1_001.0)
    host_a.step_wall(30.0)
    assert host_b.wall() == 8.0
    assert host_a.time is host_b.time is time_


def test_reboot_restarts_the_monotonic_clock_only() -> None:
    clock = SimulatedClock()
    clock.advance(50.0)
    wall = clock.wall()
    clock.reboot()
    assert clock.monotonic() == 0.0
    assert clock.wall() == wall


# ---------------------------------------------------------------------------
# FaultyFS over the real disk
# ---------------------------------------------------------------------------


class _Killed(Exception):
    """Stands for the process dying, in tests of a custom kill action."""


@pytest.fixture
def kills() -> list[tuple[Op, str]]:
    return []


@pytest.fixture
def faulty(tmp_path: Path, kills: list[tuple[Op, str]]) -> Iterator[FaultyFS]:
    fs = FaultyFS(RealFS(), kill=lambda op, path: kills.append((op, path)))
    yield fs
    fs.revive()  # closes handles left open by a kill


def test_faulty_fs_without_faults_passes_every_call_through(
    tmp_path: Path, faulty: FaultyFS
) -> None:
    directory = str(tmp_path / "item")
    faulty.mkdir(directory)
    assert publish(faulty, directory, "s.1", b"claim")
    handle = faulty.open_append(directory + "/journal")
    assert handle.append(b"rec\n") == 4
    handle.fsync()
    assert handle.size() == 4
    handle.close()
    faulty.pwrite(directory + "/hb", 0, b"1")
    assert faulty.listdir(directory) == ["hb", "journal", "s.1"]
    assert faulty.exists(directory + "/hb")
    faulty.rename(directory + "/hb", directory + "/hb2")
    assert faulty.read(directory + "/hb2") == b"1"
    assert faulty.calls[Op.LINK] == 1 and faulty.total_calls == 15


def test_faulty_lost_link_reply_links_on_the_real_disk_then_raises(
    tmp_path: Path, faulty: FaultyFS
) -> None:
    faulty.fault = only(Fault(FaultKind.LOST_LINK_REPLY))
    assert not publish(faulty, str(tmp_path), "s.1", b"nonce=ours")
    assert (tmp_path / "s.1").read_bytes() == b"nonce=ours"


def test_faulty_enospc_and_short_write_land_a_prefix_on_the_real_disk(
    tmp_path: Path, faulty: FaultyFS
) -> None:
    path = str(tmp_path / "journal")
    handle = faulty.open_append(path)
    faulty.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.ENOSPC, keep=3), op=Op.APPEND, nth=0),
        FaultRule(Fault(FaultKind.SHORT_WRITE, keep=1), op=Op.APPEND, nth=1),
        FaultRule(Fault(FaultKind.ENOSPC, keep=2), op=Op.PWRITE),
    )
    with pytest.raises(OSError) as caught:
        handle.append(b"record\n")
    assert caught.value.errno == errno.ENOSPC
    assert handle.append(b"XYZ") == 1
    handle.close()
    assert (tmp_path / "journal").read_bytes() == b"recX"
    with pytest.raises(OSError):
        faulty.pwrite(str(tmp_path / "hb"), 0, b"1234")
    assert (tmp_path / "hb").read_bytes() == b"12"


def test_faulty_enospc_on_write_temp_leaves_an_orphan_prefix_on_the_real_disk(
    tmp_path: Path, faulty: FaultyFS
) -> None:
    faulty.fault = only(Fault(FaultKind.ENOSPC, keep=2))
    with pytest.raises(OSError) as caught:
        faulty.write_temp(str(tmp_path), b"claim")
    assert caught.value.errno == errno.ENOSPC
    (orphan,) = os.listdir(tmp_path)
    assert is_temp_name(orphan)
    assert (tmp_path / orphan).read_bytes() == b"cl"


def test_faulty_eio_estale_and_stale_absent_do_not_reach_the_real_disk(
    tmp_path: Path, faulty: FaultyFS
) -> None:
    path = str(tmp_path / "s.1")
    faulty.pwrite(path, 0, b"claim")
    handle = faulty.open_append(path)
    faulty.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.EIO), op=Op.FSYNC),
        FaultRule(Fault(FaultKind.ESTALE), op=Op.UNLINK),
        FaultRule(Fault(FaultKind.STALE_ABSENT)),
    )
    with pytest.raises(OSError) as caught:
        handle.fsync()
    assert caught.value.errno == errno.EIO
    with pytest.raises(OSError) as caught:
        faulty.unlink(path)
    assert caught.value.errno == errno.ESTALE
    assert not faulty.exists(path)
    with pytest.raises(FileNotFoundError):
        faulty.read(path)
    assert (tmp_path / "s.1").read_bytes() == b"claim"
    handle.close()


def test_faulty_kill_runs_the_kill_action_refuses_calls_and_revive_closes_handles(
    tmp_path: Path, faulty: FaultyFS, kills: list[tuple[Op, str]]
) -> None:
    path = str(tmp_path / "hb")
    handle = faulty.open_append(str(tmp_path / "journal"))
    faulty.fault = only(Fault(FaultKind.KILL_AFTER), Op.PWRITE)
    with pytest.raises(SimulatedCrash) as caught:
        faulty.pwrite(path, 0, b"beat")
    assert caught.value.when == "after"
    assert kills == [(Op.PWRITE, path)]
    assert (tmp_path / "hb").read_bytes() == b"beat"  # it took effect
    with pytest.raises(SimulatedCrash):
        faulty.read(path)
    faulty.revive()
    faulty.fault = None
    assert faulty.read(path) == b"beat"
    with pytest.raises(OSError) as stale:
        handle.append(b"x")
    assert stale.value.errno == errno.EBADF
    handle.close()


def test_faulty_kill_action_may_raise_its_own_exception(tmp_path: Path) -> None:
    def die(op: Op, path: str) -> None:
        raise _Killed(op)

    faulty = FaultyFS(RealFS(), only(Fault(FaultKind.KILL_BEFORE), Op.MKDIR), kill=die)
    with pytest.raises(_Killed):
        faulty.mkdir(str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()
    assert faulty.killed


def test_faulty_fs_default_kill_is_a_real_sigkill(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from dispatchtx.fs import Fault, FaultKind, DiskFaultPlan, FaultRule, FaultyFS, Op, RealFS
        fs = FaultyFS(RealFS(), DiskFaultPlan(FaultRule(Fault(FaultKind.KILL_AFTER), op=Op.APPEND)))
        handle = fs.open_append(sys.argv[1])
        try:
            handle.append(b"written before the kill\\n")
        finally:
            handle.append(b"a finally block must not run\\n")
        """
    )
    journal = tmp_path / "journal"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(journal)], env=env, capture_output=True, timeout=30
    )
    assert done.returncode == -9, done.stderr
    assert journal.read_bytes() == b"written before the kill\n"


def test_faulty_fs_wraps_a_simulated_fs_and_each_layer_counts_its_calls() -> None:
    inner = SimulatedFS()
    inner.mkdir("/d")
    outer = FaultyFS(inner, only(Fault(FaultKind.LOST_LINK_REPLY)), kill=_no_kill)
    assert not publish(outer, "/d", "s.1", b"x")
    assert inner.read("/d/s.1") == b"x"
    assert outer.calls[Op.LINK] == inner.calls[Op.LINK] == 1


def _no_kill(op: Op, path: str) -> None:
    """A kill action that does nothing: FaultyFS still raises SimulatedCrash."""


def test_kill_action_that_returns_still_raises_simulated_crash() -> None:
    fs = FaultyFS(SimulatedFS(), only(Fault(FaultKind.KILL_BEFORE)), kill=_no_kill)
    with pytest.raises(SimulatedCrash):
        fs.exists("/")
