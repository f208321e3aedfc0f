"""The local work journal (docs/design.md "Local work journal", §6 fault points
4 and 6), run on the simulated disk: every test is named by the rule it checks."""

from __future__ import annotations

import copy
import errno
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchtx.errors import DispatchError
from dispatchtx.fs import (
    CrashKind,
    DiskFaultPlan,
    Fault,
    FaultKind,
    FaultRule,
    Op,
    RealFS,
    SimulatedCrash,
    SimulatedFS,
    UnsyncedTail,
)
from dispatchtx.journal import (
    Event,
    FsyncPolicy,
    Journal,
    JournalCorrupt,
    JournalModel,
    JSONValue,
    ReplayReport,
    json_model,
    replay,
)

DIRECTORY = "/coordinator"
PATH = DIRECTORY + "/journal.jsonl"
TEMP_DIRECTORY = PATH + ".tmp"

EVERY = FsyncPolicy.EVERY
GROUP = FsyncPolicy.GROUP
NONE = FsyncPolicy.NONE
ALL_POLICIES = (EVERY, GROUP, NONE)

State = list[JSONValue]


def append_payload(state: State, event: Event) -> State:
    if event.kind == "refuse":
        raise ValueError("this model refuses 'refuse' events")
    return [*state, event.payload]


EMPTY: State = []
#: The state is the list of payloads applied, in order: it shows exactly which
#: records a replay found.
MODEL: JournalModel[State] = json_model(EMPTY, append_payload)


def new_fs(seed: int = 0) -> SimulatedFS:
    fs = SimulatedFS(seed=seed)
    fs.mkdir(DIRECTORY)
    return fs


def open_journal(
    fs: SimulatedFS, policy: FsyncPolicy = EVERY, compact_every: int | None = None
) -> Journal[State]:
    return Journal(fs, PATH, MODEL, policy=policy, compact_every=compact_every)


def poisoned(journal: Journal[State]) -> bool:
    # A function, not the property, so that the type checker does not carry
    # one assert's narrowing over to the next look.
    return journal.poisoned


def in_group(journal: Journal[State]) -> bool:
    return journal.in_group


def compaction_error(journal: Journal[State]) -> Exception | None:
    return journal.last_compaction_error


def put(value: JSONValue) -> Event:
    return Event("put", value)


def lines_of(fs: SimulatedFS) -> list[dict[str, JSONValue]]:
    """The records of the volatile file, checked against their checksums."""
    records = []
    for line in fs.read(PATH).splitlines():
        checksum, _, body = line.partition(b" ")
        assert int(checksum, 16) == zlib.crc32(body)
        records.append(json.loads(body))
    return records


def after_crash(
    fs: SimulatedFS,
    kind: CrashKind,
    policy: FsyncPolicy = EVERY,
    tail: UnsyncedTail = UnsyncedTail.DROP,
) -> State:
    """What a replay would find after a crash now (on a copy of the disk)."""
    clone = copy.deepcopy(fs)
    clone.fault = None
    clone.crash(kind, unsynced_tail=tail)
    return replay(clone, PATH, MODEL, policy=policy)[0]


def is_prefix(short: Sequence[object], long: Sequence[object]) -> bool:
    return len(short) <= len(long) and list(long[: len(short)]) == list(short)


def kill_at(op: Op, nth: int = 0, kind: FaultKind = FaultKind.KILL_BEFORE) -> DiskFaultPlan:
    return DiskFaultPlan(FaultRule(Fault(kind), op=op, nth=nth))


def fail_at(op: Op, fault: Fault, nth: int = 0) -> DiskFaultPlan:
    return DiskFaultPlan(FaultRule(fault, op=op, nth=nth))


# -- records: one write each, a sequence number and a checksum ---------------


def test_each_record_is_one_write_of_one_line_with_sequence_number_and_checksum() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    values: list[JSONValue] = [{"lease": [1, "a"]}, None, 2.5]
    for value in values:
        appends = fs.calls[Op.APPEND]
        journal.append(put(value))
        assert fs.calls[Op.APPEND] == appends + 1
    assert lines_of(fs) == [
        {"seq": 1, "kind": "put", "payload": {"lease": [1, "a"]}},
        {"seq": 2, "kind": "put", "payload": None},
        {"seq": 3, "kind": "put", "payload": 2.5},
    ]


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
def test_process_kill_loses_no_written_record_under_any_policy(policy: FsyncPolicy) -> None:
    fs = new_fs()
    journal = open_journal(fs, policy)
    journal.append(put(1))
    with pytest.raises(SimulatedCrash), journal.group():
        journal.append(put(2))
        journal.append(put(3))
        fs.fault = kill_at(Op.APPEND)
        journal.append(put(4))
    fs.crash(CrashKind.PROCESS)
    assert open_journal(fs, policy).state == [1, 2, 3]


def test_memory_is_what_replay_decodes_so_payloads_are_seen_as_json() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(Event("put", (1, 2)))  # type: ignore[arg-type]  # a tuple, on purpose
    assert journal.state == [[1, 2]]
    assert open_journal(fs).state == journal.state


@pytest.mark.parametrize("payload", [float("nan"), float("inf"), object()], ids=repr)
def test_an_event_that_is_not_json_writes_nothing_and_changes_nothing(payload: object) -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    appends = fs.calls[Op.APPEND]
    with pytest.raises((TypeError, ValueError)):
        journal.append(Event("put", payload))  # type: ignore[arg-type]
    assert fs.calls[Op.APPEND] == appends
    assert journal.state == [1]


def test_an_event_the_reducer_rejects_writes_nothing_and_changes_nothing() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    appends = fs.calls[Op.APPEND]
    with pytest.raises(ValueError, match="refuses"):
        journal.append(Event("refuse", None))
    assert fs.calls[Op.APPEND] == appends
    assert journal.state == [1]
    assert open_journal(fs).state == [1]


# -- order: append durably, then memory; failed appends cut back ------------


def test_failed_append_leaves_memory_as_it_was_and_the_file_at_its_last_record() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    good = fs.read(PATH)
    fs.fault = fail_at(Op.APPEND, Fault(FaultKind.EIO))
    with pytest.raises(OSError) as raised:
        journal.append(put(2))
    assert raised.value.errno == errno.EIO
    assert journal.state == [1]
    assert fs.read(PATH) == good
    assert not poisoned(journal)
    journal.append(put(2))
    assert [record["seq"] for record in lines_of(fs)] == [1, 2]
    assert after_crash(fs, CrashKind.POWER) == [1, 2]


@pytest.mark.parametrize(
    "fault", [Fault(FaultKind.ENOSPC, keep=7), Fault(FaultKind.SHORT_WRITE, keep=12)], ids=str
)
def test_enospc_partial_write_is_truncated_back_to_the_last_good_record(fault: Fault) -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put("first"))
    good = fs.read(PATH)
    fs.fault = fail_at(Op.APPEND, fault)
    with pytest.raises(OSError) as raised:
        journal.append(put("second"))
    assert raised.value.errno == errno.ENOSPC  # a short write is how a full disk starts
    assert journal.state == ["first"]
    assert fs.read(PATH) == good  # the prefix that landed was cut off
    assert not poisoned(journal)
    journal.append(put("second"))
    assert open_journal(fs).state == ["first", "second"]


def test_failed_append_that_cannot_be_cut_back_poisons_then_rewrites() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    fs.fault = DiskFaultPlan(
        FaultRule(Fault(FaultKind.ENOSPC, keep=9), op=Op.APPEND, nth=0),
        FaultRule(Fault(FaultKind.EIO), op=Op.TRUNCATE, nth=0),
    )
    with pytest.raises(OSError):
        journal.append(put(2))
    assert journal.state == [1]
    assert poisoned(journal)  # the file ends in a torn record now
    journal.append(put(2))
    assert not poisoned(journal)
    assert [record["seq"] for record in lines_of(fs)] == [2, 3]  # snapshot, then the record
    assert after_crash(fs, CrashKind.POWER) == [1, 2]


def test_fsync_eio_poisons_and_the_next_append_rewrites_from_memory_first() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    journal.append(put(2))
    fs.fault = fail_at(Op.FSYNC, Fault(FaultKind.EIO))
    with pytest.raises(OSError) as raised:
        journal.append(put(3))
    assert raised.value.errno == errno.EIO
    assert journal.state == [1, 2]  # a failed append leaves memory as it was
    assert poisoned(journal)
    assert after_crash(fs, CrashKind.POWER) == [1, 2]
    fs.log = []
    journal.append(put(3))
    ops = [call.op for call in fs.log]
    # The rewrite (as compaction does it) comes before the append.
    assert ops.index(Op.WRITE_TEMP) < ops.index(Op.RENAME) < ops.index(Op.FSYNC_DIR)
    assert ops.index(Op.FSYNC_DIR) < ops.index(Op.OPEN_APPEND) < ops.index(Op.APPEND)
    assert not poisoned(journal)
    assert lines_of(fs)[0] == {"seq": 3, "snapshot": [1, 2]}
    assert after_crash(fs, CrashKind.POWER) == [1, 2, 3]


def test_fsync_eio_poisons_and_sync_cures_by_rewriting_from_memory() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    with journal.group():
        journal.append(put(1))
    fs.fault = fail_at(Op.FSYNC, Fault(FaultKind.EIO))
    with pytest.raises(OSError), journal.group():
        journal.append(put(2))
        journal.append(put(3))
    # The group's records stay in memory, but the failed fsync dropped their
    # pages: nothing of the group may be acted on until a sync returns.
    assert journal.state == [1, 2, 3]
    assert poisoned(journal)
    assert after_crash(fs, CrashKind.POWER, GROUP) == [1]
    journal.sync()
    assert not poisoned(journal)
    assert after_crash(fs, CrashKind.POWER, GROUP) == [1, 2, 3]


# -- fsync policies ---------------------------------------------------------


def test_every_policy_fsyncs_each_record_before_append_returns() -> None:
    fs = new_fs()
    journal = open_journal(fs, EVERY)
    with journal.group():  # a group does not weaken `every`
        for value in range(3):
            fsyncs = fs.calls[Op.FSYNC]
            journal.append(put(value))
            assert fs.calls[Op.FSYNC] == fsyncs + 1
            assert after_crash(fs, CrashKind.POWER) == journal.state
    assert journal.unsynced == 0


def test_group_policy_block_fsyncs_once_when_it_ends() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    fsyncs = fs.calls[Op.FSYNC]
    with journal.group() as same:
        assert same is journal
        assert in_group(journal)
        for value in range(4):
            journal.append(put(value))
        assert fs.calls[Op.FSYNC] == fsyncs
        assert journal.unsynced == 4
        assert journal.state == [0, 1, 2, 3]  # the next dispatch sees the previous ones
    assert fs.calls[Op.FSYNC] == fsyncs + 1
    assert journal.unsynced == 0
    assert not in_group(journal)
    assert after_crash(fs, CrashKind.POWER, GROUP) == [0, 1, 2, 3]


def test_group_policy_append_outside_a_block_is_a_group_of_one() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    fsyncs = fs.calls[Op.FSYNC]
    journal.append(put(1))
    assert fs.calls[Op.FSYNC] == fsyncs + 1
    assert after_crash(fs, CrashKind.POWER, GROUP) == [1]


def test_group_policy_nested_blocks_fsync_at_the_outermost_end() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    fsyncs = fs.calls[Op.FSYNC]
    with journal.group():
        journal.append(put(1))
        with journal.group():
            journal.append(put(2))
        assert fs.calls[Op.FSYNC] == fsyncs
    assert fs.calls[Op.FSYNC] == fsyncs + 1


def test_group_policy_append_group_writes_in_order_under_one_fsync() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    fsyncs = fs.calls[Op.FSYNC]
    assert journal.append_group(put(value) for value in "abc") == ["a", "b", "c"]
    assert fs.calls[Op.FSYNC] == fsyncs + 1
    assert after_crash(fs, CrashKind.POWER, GROUP) == ["a", "b", "c"]


def test_group_policy_block_that_raises_still_syncs_what_it_appended() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    with pytest.raises(RuntimeError), journal.group():
        journal.append(put(1))
        raise RuntimeError("building the next message failed")
    assert journal.unsynced == 0
    assert after_crash(fs, CrashKind.POWER, GROUP) == [1]


@pytest.mark.parametrize("tail", [UnsyncedTail.DROP, UnsyncedTail.ZEROED], ids=str)
def test_group_policy_power_loss_before_the_groups_fsync_loses_only_that_whole_group(
    tail: UnsyncedTail,
) -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP)
    with journal.group():
        journal.append(put(1))
        journal.append(put(2))
    fs.fault = kill_at(Op.FSYNC)
    with pytest.raises(SimulatedCrash), journal.group():
        journal.append(put(3))
        journal.append(put(4))
    fs.crash(CrashKind.POWER, unsynced_tail=tail)
    reopened = open_journal(fs, GROUP)
    assert reopened.state == [1, 2]
    assert (reopened.replay_report.dropped is not None) == (tail is UnsyncedTail.ZEROED)


def test_group_policy_torn_power_loss_keeps_a_prefix_of_the_unsynced_group_only() -> None:
    for seed in range(8):
        fs = new_fs(seed)
        journal = open_journal(fs, GROUP)
        journal.append_group([put(1), put(2)])
        fs.fault = kill_at(Op.FSYNC)
        with pytest.raises(SimulatedCrash):
            journal.append_group([put(3), put(4), put(5)])
        fs.crash(CrashKind.POWER, unsynced_tail=UnsyncedTail.TORN)
        state = open_journal(fs, GROUP).state
        assert is_prefix([1, 2], state) and is_prefix(state, [1, 2, 3, 4, 5])


def test_none_policy_never_fsyncs_records_but_sync_does() -> None:
    fs = new_fs()
    journal = open_journal(fs, NONE)
    fsyncs = fs.calls[Op.FSYNC]
    journal.append(put(1))
    journal.append_group([put(2)])
    assert fs.calls[Op.FSYNC] == fsyncs
    assert journal.unsynced == 2
    assert after_crash(fs, CrashKind.POWER, NONE) == []
    journal.sync()
    assert fs.calls[Op.FSYNC] == fsyncs + 1
    assert after_crash(fs, CrashKind.POWER, NONE) == [1, 2]


# -- replay -----------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """A typed state (not JSON itself): how adapters keep theirs."""

    counts: tuple[tuple[str, int], ...] = ()
    last: JSONValue = None
    total: int = 0


def tally(state: Tally, event: Event) -> Tally:
    counts = dict(state.counts)
    counts[event.kind] = counts.get(event.kind, 0) + 1
    return Tally(tuple(sorted(counts.items())), event.payload, state.total + 1)


def tally_snapshot(state: Tally) -> JSONValue:
    return {"counts": dict(state.counts), "last": state.last, "total": state.total}


def tally_restore(snapshot: JSONValue) -> Tally:
    assert isinstance(snapshot, dict)
    counts, total = snapshot["counts"], snapshot["total"]
    assert isinstance(counts, dict) and isinstance(total, int)
    pairs = [(kind, count) for kind, count in counts.items() if isinstance(count, int)]
    return Tally(tuple(sorted(pairs)), snapshot["last"], total)


TALLY = JournalModel(Tally(), tally, tally_snapshot, tally_restore)

json_values: st.SearchStrategy[JSONValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)
events = st.builds(Event, st.sampled_from(["pull", "reward", "reclaim", "pair"]), json_values)


@settings(max_examples=40, deadline=None)
@given(
    stream=st.lists(events, max_size=12),
    policy=st.sampled_from(ALL_POLICIES),
    compact_every=st.sampled_from([None, 1, 2, 5]),
)
def test_replay_after_every_prefix_equals_memory_at_that_point(
    stream: list[Event], policy: FsyncPolicy, compact_every: int | None
) -> None:
    fs = new_fs()
    journal = Journal(fs, PATH, TALLY, policy=policy, compact_every=compact_every)
    for event in stream:
        journal.append(event)
        assert replay(fs, PATH, TALLY, policy=policy)[0] == journal.state
        if policy is EVERY:
            clone = copy.deepcopy(fs)
            clone.crash(CrashKind.POWER)
            assert replay(clone, PATH, TALLY, policy=policy)[0] == journal.state
    reopened = Journal(fs, PATH, TALLY, policy=policy, compact_every=compact_every)
    assert reopened.state == journal.state


def write_file(fs: SimulatedFS, data: bytes) -> None:
    """Put `data` at PATH through the FS interface (a damaged journal)."""
    temp = fs.write_temp(DIRECTORY, data)
    fs.rename(temp, PATH)
    fs.fsync_dir(DIRECTORY)


def recorded_stream(count: int) -> tuple[bytes, list[int], list[State]]:
    """A journal's bytes, the offset where each line ends, and the state
    after each line."""
    fs = new_fs()
    journal = open_journal(fs)
    ends, states = [], [list(journal.state)]
    for value in range(count):
        journal.append(put({"n": value, "text": "x" * value}))
        ends.append(len(fs.read(PATH)))
        states.append(list(journal.state))
    return fs.read(PATH), ends, states


def test_replay_of_a_file_cut_at_any_byte_keeps_every_complete_record() -> None:
    data, ends, states = recorded_stream(6)
    for cut in range(len(data) + 1):
        fs = new_fs()
        write_file(fs, data[:cut])
        complete = sum(1 for end in ends if end <= cut)
        state, report = replay(fs, PATH, MODEL)
        assert state == states[complete]
        assert report.records_applied == complete and report.last_seq == complete
        torn = cut not in (0, *ends)
        assert (report.dropped is not None) == torn
        if report.dropped is not None:
            assert report.dropped.reason == "torn record: no end of line"
            assert report.dropped.offset + report.dropped.size == cut


def test_torn_tail_is_reported_and_cut_before_appending_again() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    for value in (1, 2, 3):
        journal.append(put(value))
    good = fs.read(PATH)
    write_file(fs, good + b'0badc0de {"seq":4,"kind":"pu')
    reopened = open_journal(fs)
    assert reopened.state == [1, 2, 3]
    report = reopened.replay_report
    assert report.dropped is not None
    assert (report.dropped.line, report.dropped.offset) == (4, len(good))
    assert report.dropped.reason == "torn record: no end of line"
    assert "dropped" in str(report)
    assert fs.read(PATH) == good  # cut before appending again
    reopened.append(put(4))
    assert [record["seq"] for record in lines_of(fs)] == [1, 2, 3, 4]


def test_zeroed_tail_after_power_loss_is_reported_and_cut() -> None:
    fs = new_fs()
    journal = open_journal(fs, NONE)
    journal.append(put(1))
    journal.sync()
    journal.append(put(2))
    fs.crash(CrashKind.POWER, unsynced_tail=UnsyncedTail.ZEROED)
    assert fs.read(PATH).endswith(b"\0\0\0\0")
    reopened = open_journal(fs, NONE)
    assert reopened.state == [1]
    assert reopened.replay_report.dropped is not None
    assert reopened.replay_report.dropped.reason == "zeroed tail"
    assert b"\0" not in fs.read(PATH)
    reopened.append(put(2))
    assert open_journal(fs, NONE).state == [1, 2]


def damaged(line_number: int, damage: Callable[[bytes], bytes]) -> SimulatedFS:
    """A five-record journal whose line `line_number` went through `damage`."""
    fs = new_fs()
    journal = open_journal(fs)
    for value in range(1, 6):
        journal.append(put(value))
    lines = fs.read(PATH).split(b"\n")
    lines[line_number - 1] = damage(lines[line_number - 1])
    write_file(fs, b"\n".join(lines))
    return fs


def flip_a_payload_byte(line: bytes) -> bytes:
    return line[:-2] + b"7" + line[-1:]


def test_corrupt_middle_under_every_raises_naming_file_line_and_reason() -> None:
    fs = damaged(3, flip_a_payload_byte)
    with pytest.raises(JournalCorrupt) as raised:
        open_journal(fs, EVERY)
    error = raised.value
    assert isinstance(error, DispatchError)
    assert (error.path, error.line) == (PATH, 3)
    assert error.reason.startswith("checksum mismatch")
    assert PATH in str(error) and "line 3" in str(error) and "checksum mismatch" in str(error)


def test_zeroed_middle_under_every_is_corruption_not_a_lost_tail() -> None:
    fs = damaged(2, lambda line: bytes(len(line)))
    with pytest.raises(JournalCorrupt, match="line 2: zeroed bytes, followed by 3 valid"):
        replay(fs, PATH, MODEL, policy=EVERY)


@pytest.mark.parametrize("policy", [GROUP, NONE], ids=lambda p: p.value)
def test_bad_record_followed_by_good_ones_without_every_is_a_lost_unsynced_suffix(
    policy: FsyncPolicy,
) -> None:
    # A power loss may keep a later page and lose an earlier one when records
    # are not fsynced one by one: everything from the hole on was unsynced.
    fs = damaged(3, flip_a_payload_byte)
    journal = open_journal(fs, policy)
    assert journal.state == [1, 2]
    dropped = journal.replay_report.dropped
    assert dropped is not None and dropped.line == 3
    assert "unsynced suffix" in dropped.reason
    assert [record["seq"] for record in lines_of(fs)] == [1, 2]


def test_sequence_numbers_must_be_consecutive() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    for value in (1, 2, 3):
        journal.append(put(value))
    lines = fs.read(PATH).splitlines(keepends=True)
    write_file(fs, lines[0] + lines[1] + lines[1] + lines[2])  # a record twice
    with pytest.raises(JournalCorrupt, match="line 3: sequence number 2, expected 3"):
        open_journal(fs, EVERY)


def test_a_snapshot_is_only_valid_as_line_one() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    journal.compact()
    snapshot = fs.read(PATH)
    write_file(fs, snapshot + snapshot)
    state, report = replay(fs, PATH, MODEL, policy=NONE)
    assert state == [1]
    assert report.dropped is not None and report.dropped.reason == "snapshot record after line 1"


def test_a_record_the_model_rejects_on_replay_is_corruption() -> None:
    fs = new_fs()
    journal = Journal(fs, PATH, json_model(EMPTY, lambda state, event: [*state, 0]))
    journal.append(Event("refuse", None))
    with pytest.raises(JournalCorrupt, match="line 1: the model rejects the event 'refuse'"):
        open_journal(fs)


def test_replay_report_counts_records_after_the_snapshot() -> None:
    fs = new_fs()
    journal = open_journal(fs, compact_every=3)
    for value in range(5):
        journal.append(put(value))
    report = open_journal(fs).replay_report
    assert report == ReplayReport(PATH, 2, True, 6, None)
    assert str(report) == f"{PATH}: replayed a snapshot and 2 record(s)"


def test_replay_of_an_absent_journal_is_the_initial_state() -> None:
    assert replay(new_fs(), PATH, MODEL) == ([], ReplayReport(PATH, 0, False, 0, None))


# -- compaction -------------------------------------------------------------


def test_compaction_writes_a_temp_snapshot_renames_it_and_fsyncs_the_directory() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    for value in (1, 2, 3):
        journal.append(put(value))
    fs.log = []
    journal.compact()
    assert [call.op for call in fs.log] == [
        Op.WRITE_TEMP,  # fsynced by write_temp
        Op.RENAME,
        Op.CLOSE,
        Op.FSYNC_DIR,
        Op.OPEN_APPEND,
    ]
    assert fs.log[3].path == DIRECTORY
    assert lines_of(fs) == [{"seq": 4, "snapshot": [1, 2, 3]}]  # the snapshot and nothing else
    assert fs.durable_read(PATH) == fs.read(PATH)
    assert fs.listdir(TEMP_DIRECTORY) == []


def test_appends_after_compaction_land_in_the_new_file() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    journal.compact()
    journal.append(put(2))  # would vanish with the old inode if the handle were not reopened
    assert lines_of(fs) == [
        {"seq": 2, "snapshot": [1]},
        {"seq": 3, "kind": "put", "payload": 2},
    ]
    assert after_crash(fs, CrashKind.POWER) == [1, 2]
    assert after_crash(fs, CrashKind.PROCESS) == [1, 2]


def test_compaction_is_due_every_n_records_and_sequence_numbers_continue() -> None:
    fs = new_fs()
    journal = open_journal(fs, compact_every=3)
    seqs = []
    for value in range(7):
        journal.append(put(value))
        seqs.append([record["seq"] for record in lines_of(fs)])
    assert seqs == [[1], [1, 2], [4], [4, 5], [4, 5, 6], [8], [8, 9]]
    assert open_journal(fs).state == list(range(7))


def test_compaction_when_due_waits_for_the_end_of_a_group() -> None:
    fs = new_fs()
    journal = open_journal(fs, GROUP, compact_every=2)
    with journal.group():
        for value in range(3):
            journal.append(put(value))
        assert len(lines_of(fs)) == 3
    assert lines_of(fs) == [{"seq": 4, "snapshot": [0, 1, 2]}]


def test_failed_automatic_compaction_does_not_fail_the_append() -> None:
    fs = new_fs()
    journal = open_journal(fs, compact_every=2)
    journal.append(put(1))
    fs.fault = fail_at(Op.WRITE_TEMP, Fault(FaultKind.ENOSPC, keep=5))
    assert journal.append(put(2)) == [1, 2]  # the record is durable: the append succeeded
    assert isinstance(compaction_error(journal), OSError)
    assert fs.listdir(TEMP_DIRECTORY) == []  # the partial temp was removed
    assert after_crash(fs, CrashKind.POWER) == [1, 2]
    journal.append(put(3))
    assert len(lines_of(fs)) == 3  # retried only after another compact_every records
    journal.append(put(4))
    assert compaction_error(journal) is None
    assert lines_of(fs) == [{"seq": 5, "snapshot": [1, 2, 3, 4]}]


def test_interrupted_compaction_leaves_temps_that_opening_removes() -> None:
    fs = new_fs()
    journal = open_journal(fs)
    journal.append(put(1))
    fs.fault = kill_at(Op.WRITE_TEMP, kind=FaultKind.KILL_AFTER)
    with pytest.raises(SimulatedCrash):
        journal.compact()
    fs.crash(CrashKind.PROCESS)
    assert len(fs.listdir(TEMP_DIRECTORY)) == 1
    assert open_journal(fs).state == [1]
    assert fs.listdir(TEMP_DIRECTORY) == []


def test_typed_state_survives_compaction_and_replay() -> None:
    fs = new_fs()
    journal = Journal(fs, PATH, TALLY, compact_every=2)
    journal.append(Event("pull", [1, 2]))
    journal.append(Event("reward", 0.5))
    journal.append(Event("pull", {"arm": 3}))
    assert journal.state == Tally((("pull", 2), ("reward", 1)), {"arm": 3}, 3)
    assert Journal(fs, PATH, TALLY).state == journal.state


# -- opening ----------------------------------------------------------------


def test_opening_a_new_journal_makes_its_name_durable() -> None:
    fs = new_fs()
    open_journal(fs).append(put(1))
    assert fs.durable_exists(PATH)
    fs.crash(CrashKind.POWER)
    assert open_journal(fs).state == [1]


def test_opening_makes_records_a_killed_predecessor_left_unsynced_durable() -> None:
    fs = new_fs()
    journal = open_journal(fs, NONE)
    journal.append(put(1))
    journal.append(put(2))
    fs.crash(CrashKind.PROCESS)
    assert fs.is_dirty(PATH)
    reopened = open_journal(fs, EVERY)  # nobody may act on replayed state that is not durable
    assert reopened.state == [1, 2]
    assert not fs.is_dirty(PATH)
    assert after_crash(fs, CrashKind.POWER) == [1, 2]


def test_a_fault_at_every_call_of_opening_loses_nothing() -> None:
    def prepared() -> SimulatedFS:
        fs = new_fs()
        journal = open_journal(fs)
        for value in (1, 2, 3):
            journal.append(put(value))
        fs.crash(CrashKind.PROCESS)
        handle = fs.open_append(PATH)
        handle.append(b"0000")  # a torn tail: opening truncates
        fs.write_temp(TEMP_DIRECTORY, b"leftover")  # opening removes it
        return fs

    fs = prepared()
    fs.log = []
    open_journal(fs)
    calls = len(fs.log)
    assert calls >= 8
    for nth in range(calls):
        for kind in (FaultKind.EIO, FaultKind.KILL_BEFORE, FaultKind.KILL_AFTER):
            for crash in (CrashKind.PROCESS, CrashKind.POWER):
                fs = prepared()
                fs.fault = DiskFaultPlan(FaultRule(Fault(kind), nth=nth))
                with pytest.raises((OSError, SimulatedCrash)):
                    open_journal(fs)
                fs.fault = None
                fs.crash(crash)
                assert open_journal(fs).state == [1, 2, 3]


def test_closed_journal_refuses_appends() -> None:
    fs = new_fs()
    with open_journal(fs) as journal:
        journal.append(put(1))
    assert journal.closed
    with pytest.raises(ValueError, match="closed"):
        journal.append(put(2))
    journal.close()  # twice is fine


def test_journal_works_the_same_on_the_real_disk(tmp_path: object) -> None:
    path = f"{tmp_path}/journal.jsonl"
    fs = RealFS()
    with Journal(fs, path, MODEL, compact_every=2) as journal:
        for value in range(5):
            journal.append(put(value))
    with Journal(fs, path, MODEL) as reopened:
        assert reopened.state == [0, 1, 2, 3, 4]
        assert reopened.replay_report.from_snapshot


# -- a fault at every FS call of append, fsync and compaction ------------------

StepKind = Literal["append", "group", "compact", "sync"]
Step = tuple[StepKind, tuple[int, ...]]

#: A workload per policy, with compact_every=3 so that compaction when due
#: happens inside it, besides an explicit one.
WORKLOADS: dict[FsyncPolicy, tuple[Step, ...]] = {
    EVERY: (
        ("append", (1,)),
        ("append", (2,)),
        ("append", (3,)),
        ("append", (4,)),
        ("compact", ()),
        ("group", (5, 6)),
    ),
    GROUP: (
        ("group", (1, 2)),
        ("append", (3,)),
        ("group", (4, 5, 6)),
        ("compact", ()),
        ("group", (7,)),
    ),
    NONE: (
        ("append", (1,)),
        ("append", (2,)),
        ("append", (3,)),
        ("append", (4,)),
        ("sync", ()),
        ("compact", ()),
        ("append", (5,)),
    ),
}
COMPACT_EVERY = 3


def perform(journal: Journal[State], step: Step, applied: list[JSONValue]) -> None:
    """Run one step; `applied` collects each payload whose append returned."""
    kind, values = step
    if kind == "compact":
        journal.compact()
    elif kind == "sync":
        journal.sync()
    elif kind == "append":
        journal.append(put(values[0]))
        applied.append(values[0])
    else:
        with journal.group():
            for value in values:
                journal.append(put(value))
                applied.append(value)


def started(policy: FsyncPolicy, plan: DiskFaultPlan | None) -> tuple[SimulatedFS, Journal[State]]:
    fs = new_fs()
    journal = open_journal(fs, policy, COMPACT_EVERY)
    fs.fault = plan  # faults only in the workload, after opening
    return fs, journal


def workload_calls(policy: FsyncPolicy) -> list[tuple[Op, str]]:
    fs, journal = started(policy, None)
    fs.log = []
    for step in WORKLOADS[policy]:
        perform(journal, step, [])
    return [(call.op, call.path) for call in fs.log]


def fault_points(policy: FsyncPolicy, faults: Sequence[Fault]) -> list[FaultRule]:
    """One rule per (fault, call of the workload at which it can happen)."""
    calls = workload_calls(policy)
    rules = []
    for fault in faults:
        matching = sum(FaultRule(fault).matches(op, path) for op, path in calls)
        rules += [FaultRule(fault, nth=nth) for nth in range(matching)]
    return rules


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
def test_a_kill_at_every_fs_call_never_advances_memory_past_disk(policy: FsyncPolicy) -> None:
    crashes = [
        (CrashKind.PROCESS, UnsyncedTail.DROP),
        (CrashKind.POWER, UnsyncedTail.DROP),
        (CrashKind.POWER, UnsyncedTail.TORN),
        (CrashKind.POWER, UnsyncedTail.ZEROED),
    ]
    kills = [Fault(FaultKind.KILL_BEFORE), Fault(FaultKind.KILL_AFTER)]
    rules = fault_points(policy, kills)
    assert len(rules) > 20  # the workload really reaches append, fsync and compaction
    for rule in rules:
        for crash, tail in crashes:
            plan = DiskFaultPlan(rule)
            fs, journal = started(policy, plan)
            floor: State = []  # what must survive a power loss
            for step in WORKLOADS[policy]:
                before = list(journal.state)
                full = before + list(step[1])
                try:
                    perform(journal, step, [])
                except SimulatedCrash:
                    break
                if policy is not NONE or step[0] != "append":
                    floor = list(journal.state)
            else:
                pytest.fail(f"{plan} never fired")
            memory = list(journal.state)
            fs.crash(crash, unsynced_tail=tail)
            recovered = open_journal(fs, policy).state
            where = f"{plan.fired}, {crash} {tail}: memory {memory}, recovered {recovered}"
            # Nothing past the interrupted step; nothing before it lost if durable.
            assert is_prefix(recovered, full), where
            assert is_prefix(floor, recovered), where
            if crash is CrashKind.PROCESS:
                # A kill loses nothing written: memory is never ahead of the file.
                assert is_prefix(before, recovered) and is_prefix(memory, recovered), where
            elif policy is EVERY:
                assert is_prefix(before, recovered) and is_prefix(memory, recovered), where
            elif policy is GROUP and tail is UnsyncedTail.DROP:
                # The interrupted group is lost or kept whole.
                assert recovered in (before, full), where


@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
def test_an_io_error_at_every_fs_call_leaves_memory_and_disk_consistent(
    policy: FsyncPolicy,
) -> None:
    errors = [
        Fault(FaultKind.EIO),
        Fault(FaultKind.ENOSPC),
        Fault(FaultKind.SHORT_WRITE),
        Fault(FaultKind.ESTALE),
    ]
    for rule in fault_points(policy, errors):
        plan = DiskFaultPlan(rule)
        fs, journal = started(policy, plan)
        failures = 0
        for step in WORKLOADS[policy]:
            before = list(journal.state)
            applied: list[JSONValue] = []
            try:
                perform(journal, step, applied)
            except OSError:
                failures += 1
            where = f"{plan.fired} at {step}"
            # A failed append leaves memory as it was; nothing else moves it.
            assert journal.state == before + applied, where
            durable = after_crash(fs, CrashKind.POWER, policy)
            if not journal.poisoned:
                assert after_crash(fs, CrashKind.PROCESS, policy) == journal.state, where
            if policy is EVERY:
                assert durable == journal.state, where  # every acknowledged record, no more
            elif policy is GROUP:
                assert durable in (before, journal.state), where
            else:
                assert is_prefix(durable, journal.state), where
        assert plan.fired and failures <= 1
        journal.sync()  # the one fault is gone: the journal must cure itself
        assert not poisoned(journal)
        assert after_crash(fs, CrashKind.POWER, policy) == journal.state
        fs.crash(CrashKind.POWER)
        assert open_journal(fs, policy).state == journal.state


def test_a_planted_line_nested_too_deep_is_corruption_not_a_recursion_error() -> None:
    # The checksum is no MAC: whoever can write the journal can plant a valid
    # line whose JSON nests deeper than the decoder recurses.
    body = b"[" * 100_000 + b"]" * 100_000
    fs = damaged(3, lambda line: b"%08x %s" % (zlib.crc32(body), body))
    with pytest.raises(JournalCorrupt) as raised:
        open_journal(fs, EVERY)
    assert raised.value.line == 3
    assert "nested too deep" in raised.value.reason


def test_a_compaction_whose_snapshot_does_not_encode_does_not_fail_the_append() -> None:
    # The record that made the compaction due is durable and applied: the
    # append succeeded, and a caller that retried it would apply it twice.
    def snapshot(state: State) -> JSONValue:
        if "unencodable" in state:
            raise ValueError("injected: this state has no snapshot")
        return state

    model: JournalModel[State] = JournalModel(EMPTY, append_payload, snapshot, MODEL.restore)
    fs = new_fs()
    journal = Journal(fs, PATH, model, compact_every=2)
    journal.append(put("unencodable"))
    assert journal.append(put(2)) == ["unencodable", 2]
    assert isinstance(compaction_error(journal), ValueError)
    assert journal.append(put(3)) == ["unencodable", 2, 3]  # later appends work too
    assert not poisoned(journal)
    assert Journal(fs, PATH, MODEL).state == ["unencodable", 2, 3]  # each applied once


@pytest.mark.parametrize("policy", [FsyncPolicy.GROUP, FsyncPolicy.NONE])
def test_a_damaged_snapshot_on_line_1_is_corruption_not_an_unsynced_tail(
    policy: FsyncPolicy,
) -> None:
    fs = new_fs()
    journal = open_journal(fs, policy)
    for value in range(5):
        journal.append(put(value))
    journal.compact()  # line 1: a snapshot, fsynced before its rename
    for value in range(5, 8):
        journal.append(put(value))
    journal.sync()
    data = bytearray(fs.read(PATH))
    first_line_end = data.index(b"\n")
    assert data.startswith(b"%08x" % zlib.crc32(bytes(data[9:first_line_end])))
    data[first_line_end - 3] ^= 0x01  # one flipped bit inside the snapshot's state
    fs.pwrite(PATH, 0, bytes(data))
    with pytest.raises(JournalCorrupt, match="damaged snapshot"):
        open_journal(fs, policy)
    assert fs.read(PATH) == bytes(data), "the journal was cut: every synced record gone"


@pytest.mark.parametrize("policy", [FsyncPolicy.GROUP, FsyncPolicy.NONE])
def test_a_lost_first_event_under_a_weak_policy_is_still_an_unsynced_tail(
    policy: FsyncPolicy,
) -> None:
    fs = new_fs()
    journal = open_journal(fs, policy)
    for value in range(3):
        journal.append(put(value))
    data = bytearray(fs.read(PATH))
    data[12] ^= 0x01  # line 1 is an event (never compacted): may be unsynced
    fs.pwrite(PATH, 0, bytes(data))
    reopened = open_journal(fs, policy)
    assert reopened.state == []
