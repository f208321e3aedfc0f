"""coordinator.audit: the one post-run audit of the simulator, the MPI job
and the campaign."""

from __future__ import annotations

import json

import pytest

from dispatchtx import DispatchTables
from dispatchtx.coordinator import Coordinator, CoordinatorConfig, DispatchTag, Workload
from dispatchtx.coordinator.audit import RunAudit, audit, unsettled_items
from dispatchtx.fs import SimulatedClock, SimulatedFS
from dispatchtx.jobs.workloads.hash import HashWorkload, hash_task
from dispatchtx.resources import Leak
from dispatchtx.resources.dispatch_log import DispatchLog
from dispatchtx.store import WorkStore, item_key
from dispatchtx.transport import SimulatedTransport


class Holding(HashWorkload):
    """A workload whose adapter keeps one reservation and breaks one rule."""

    attached: list[DispatchTables[DispatchTag]]

    def attach(self, tables: DispatchTables[DispatchTag], dispatch_log: DispatchLog | None) -> None:
        self.attached = [*getattr(self, "attached", []), tables]

    def leaks(self) -> list[Leak]:
        return [Leak("gpu", "slot", "gpu-0", 7)]

    def problems(self) -> list[str]:
        return ["an effect applied twice"]

    def figures(self) -> dict[str, int]:
        return {"gpu slots": 1}


def store() -> WorkStore:
    return WorkStore(SimulatedFS(), "/store", SimulatedClock(), ttl=5.0)


def test_a_clean_run_passes_and_a_held_resource_does_not() -> None:
    clean = Coordinator(
        CoordinatorConfig("coord-a"), SimulatedTransport(2, hash_task), store(), HashWorkload(4)
    )
    clean.run(max_steps=10_000)
    clean.shutdown()
    assert audit(clean, clean.store) == RunAudit()
    assert audit(clean, clean.store).passed

    workload = Holding(4)
    held = Coordinator(
        CoordinatorConfig("coord-a"), SimulatedTransport(2, hash_task), store(), workload
    )
    assert workload.attached == [held.tables]  # the coordinator set it up, once
    found = audit(held, held.store)  # before running: every item unsettled
    assert not found.passed
    assert found.leaks == (Leak("gpu", "slot", "gpu-0", 7),)
    assert found.problems == ("an effect applied twice",)
    assert found.figures == {"gpu slots": 1}
    assert found.unsettled == ()  # nothing claimed yet: the store holds no item
    assert found.leaks_per_resource() == {"gpu": 1}


def test_unsettled_items_are_those_neither_done_nor_quarantined() -> None:
    shared = store()
    shared.register("coord-a")
    assert shared.try_claim("item-0").token == 1
    assert [s.work_id for s in unsettled_items(shared)] == ["item-0"]


def test_the_audit_goes_through_json_and_back() -> None:
    original = RunAudit(
        (Leak("gpu", "slot", "gpu-0", 7), Leak("dispatch-log", "entry", "x", None)),
        ("a problem",),
        ("item-3",),
        {"gpu slots": 2},
        {"ab12": "a corrupt record"},
    )
    assert RunAudit.from_json(json.loads(json.dumps(original.as_json()))) == original


def test_an_item_no_one_can_read_fails_the_audit_without_crashing_it() -> None:
    shared = store()
    shared.register("coord-a")
    for work_id in ("item-0", "item-1"):
        assert shared.try_claim(work_id).token == 1
    key = item_key("item-0")
    shared_fs = shared._fs
    shared_fs.pwrite(f"/store/slots/{key}.s.0000000001", 0, b"rotted\n")
    reader = WorkStore(shared_fs, "/store", SimulatedClock(), ttl=5.0)  # nothing cached
    coordinator = Coordinator(
        CoordinatorConfig("coord-b"), SimulatedTransport(1, hash_task), store(), HashWorkload(0)
    )
    found = audit(coordinator, reader)
    assert not found.passed
    assert list(found.unreadable) == [key]
    assert found.unsettled == ("item-1",)
    assert [s.work_id for s in unsettled_items(reader)] == ["item-1"]


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        {"leaks": [], "problems": []},
        {"leaks": [{"resource": "r"}], "problems": [], "unsettled": [], "figures": {}},
        {
            "leaks": [{"resource": "r", "kind": "k", "key": "x", "dispatch_id": "7"}],
            "problems": [],
            "unsettled": [],
            "figures": {},
        },
        {"leaks": [], "problems": [], "unsettled": [], "figures": {"n": "many"}},
    ],
)
def test_a_malformed_audit_is_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="audit"):
        RunAudit.from_json(bad)


def test_the_protocol_defaults_set_up_nothing_and_hold_nothing() -> None:
    workload = HashWorkload(1)
    assert Workload in type(workload).__mro__
    assert workload.adopt("someone-elses") is False
    assert workload.leaks() == [] and workload.problems() == [] and workload.figures() == {}
