"""`dispatchtx bench` at tiny sizes: the structure of its figures, and that
each is a positive finite number. No timing assertions: this machine is
shared and noisy, and the bench reports ratios, it does not gate on them."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from dispatchtx.fs import RealFS
from dispatchtx.jobs import bench
from dispatchtx.jobs.bench.fs_timing import TimedFS
from dispatchtx.launch import MPIExecNotFound, find_mpiexec
from dispatchtx.store import object_id_of

TINY = dataclasses.replace(
    bench.QUICK,
    core_dispatches=300,
    core_repetitions=2,
    core_in_flight=256,
    scaling_items=30,
    scaling_repetitions=2,
    scaling_workers=(4, 64),
    tables_dispatches=300,
)


def positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def assert_spread(figure: dict[str, Any]) -> None:
    assert positive(figure["median"])
    assert figure["min"] <= figure["median"] <= figure["max"]


def quiet(text: str) -> None:
    return None


def test_lifecycle_timings_of_both_builds_are_positive() -> None:
    builds = bench.load_builds(quiet)
    assert "pure" in builds
    for module in builds.values():
        for _, rollback, callables in bench.CORE_FIGURES:
            assert positive(bench.time_lifecycles(module, 200, rollback, callables))
        assert positive(bench.time_lifecycles_across(module, 1_000, 200))
        per_dispatch, per_worker = bench.bytes_in_flight(module, 128)
        assert positive(per_dispatch)
        assert per_worker >= 0


def test_core_run_has_every_figure_and_the_ratio() -> None:
    results = bench.core_run(200, 1, in_flight=128, progress=quiet, warn=quiet)
    assert results["in_flight"] == 128
    for row in results["builds"].values():
        for key, _, _ in bench.CORE_FIGURES:
            assert_spread(row[key])
        assert positive(row["bytes_per_in_flight_dispatch"])
    if "compiled" in results["builds"]:
        assert set(results["speedup"]) == {key for key, _, _ in bench.CORE_FIGURES}
        assert all(positive(ratio) for ratio in results["speedup"].values())


def test_refillable_workload_keeps_its_count_without_scanning() -> None:
    workload = bench.RefillableWorkload()
    workload.add(["a", "b"])
    assert workload.remaining() == 2
    assert workload.take() == "a"
    workload.give_back("a")
    assert workload.take() == "b"
    workload.done("b")
    workload.done("b")  # idempotent
    assert workload.remaining() == 1
    assert workload.take() == "a"
    workload.drop("a", "quarantined")
    assert workload.remaining() == 0
    assert workload.take() is None
    workload.add(["c"])
    assert workload.remaining() == 1
    with pytest.raises(ValueError):
        workload.add(["a"])


def test_coordinator_scaling_commits_every_item_and_leaks_nothing() -> None:
    row = bench.coordinator_scaling(workers=16, items=40, reps=2)
    assert row["workers"] == 16
    assert_spread(row["us_per_item"])
    assert len(row["us_per_item"]["samples"]) == 2
    assert row["objects_shipped_per_dispatch"] == 1.0  # each item ships its own object
    assert row["leaks"] == []
    assert row["counts"]["committed"] == 40 * 3  # the warm-up run too


def test_a_timed_scaling_run_counts_the_disk_calls_of_each_committed_item(
    tmp_path: Path,
) -> None:
    row = bench.coordinator_scaling(
        workers=4, items=30, reps=1, store_dir=str(tmp_path), timed=True
    )
    assert row["counts"]["committed"] == 30 * 2 and row["leaks"] == []
    calls = row["fs"]["calls_per_item"]
    # Each committed item's slots are linked (first record, claim, commit,
    # done) and the journal appends its dispatch and its done: a run whose
    # calls were not counted, or not per item, cannot show these.
    assert calls["link"] >= 4
    # The journal: each done on its own, the dispatches of a pass together.
    assert 1 <= calls["append"] < 2
    assert 0 < row["fs"]["us_per_item"] < row["us_per_item"]["median"]
    assert 0 < row["fs"]["transport_us_per_item"] < row["us_per_item"]["median"]
    assert set(row["fs"]["us_per_item_by_kind"]) >= set(calls)


def test_timed_fs_times_every_call_and_counts_failed_ones(tmp_path: Path) -> None:
    timed = TimedFS(RealFS())
    with pytest.raises(FileNotFoundError):
        timed.read(str(tmp_path / "absent"))
    temp = timed.write_temp(str(tmp_path), b"x")
    timed.link(temp, str(tmp_path / "linked"))
    handle = timed.open_append(str(tmp_path / "journal"))
    handle.append(b"record\n")
    handle.fsync()
    handle.close()
    assert timed.read(str(tmp_path / "linked")) == b"x"
    assert dict(timed.calls) == {
        "read": 2,
        "write_temp": 1,
        "link": 1,
        "open_append": 1,
        "append": 1,
        "fsync": 1,
    }
    assert set(timed.seconds) == set(timed.calls)
    assert timed.total_seconds() == pytest.approx(sum(timed.seconds.values()))


def test_periodic_scans_are_timed() -> None:
    scans = bench.periodic_scans(20)
    assert positive(scans["workload_remaining_us_per_call"])
    assert positive(scans["store_roll_forward_candidates_us_per_call"])
    assert positive(scans["store_full_look_us_per_call"])


def test_a_refillable_workload_can_give_each_item_its_own_object() -> None:
    workload = bench.RefillableWorkload(n_objects=None)
    workload.add(["a", "b"])
    txn: Any = None  # reserve() registers nothing in it
    payload_a, ids_a = workload.reserve(txn, 0, "a")
    payload_b, ids_b = workload.reserve(txn, 0, "b")
    assert payload_a == ["a", *ids_a] and payload_b == ["b", *ids_b]
    assert len(ids_a) == 1 and ids_a != ids_b
    assert object_id_of(workload.object_content(ids_a[0])) == ids_a[0]


def test_fsyncs_per_item_of_the_durable_path_are_counted(tmp_path: Path) -> None:
    figure = bench.durable_counts(str(tmp_path / "store"), items=4, workers=2, commit_batch=1)
    assert positive(figure["rate"])
    counts = figure["fsyncs_per_op"]
    assert set(counts) == set(bench.KINDS)
    # One at a time, every item writes its first record, claim, commit (its
    # result inside) and done, and fsyncs slots/ for each but the first record.
    assert counts["new"] == 4 and counts["dir"] >= 3
    grouped = bench.durable_counts(str(tmp_path / "grouped"), items=4, workers=2)
    assert grouped["fsyncs_per_op"]["new"] < counts["new"]
    latency = {kind: 1e-3 for kind in bench.KINDS}
    bound = bench.fsync_bound(figure, latency)
    assert bound is not None and positive(bound)


def test_message_sizes_of_dispatchtx() -> None:
    sizes = bench.dispatchtx_message_sizes()
    assert sizes["dispatchtx_work_first"] > sizes["dispatchtx_work"] > 0
    assert positive(sizes["dispatchtx_result"])


def test_targets_are_judged_from_the_figures() -> None:
    figures: dict[str, Any] = {
        "core": {
            "builds": {
                "pure": {},
                "compiled": {
                    "lifecycle_ns": {"median": 900.0},
                    "bytes_per_in_flight_dispatch": 600.0,
                },
            },
            "speedup": {"lifecycle_ns": 3.5},
        },
        "scaling": {
            "rows": [
                {"workers": 64, "ratio_to_first": 1.0},
                {"workers": 65_536, "ratio_to_first": 1.3},
            ],
            "real_fs_row": {"workers": 64, "us_per_item": {"median": 55.0}},
        },
        "mpi": {
            "rows": [
                {
                    "max_in_flight": 1,
                    "dispatchtx_over_raw": 0.95,
                    "dispatchtx_over_raw_best": 0.6,
                    "dispatchtx_over_futures": 2.0,  # not judged: depth 1
                },
                {
                    "max_in_flight": 4,
                    "dispatchtx_over_raw": None,
                    "dispatchtx_over_raw_best": 0.4,
                    "dispatchtx_over_futures": 6.0,
                },
            ]
        },
        "durable": {
            "fraction_of_bound": 0.6,
            "batching": {
                "max_in_flight": 4,
                "tmpfs": {"median": 1000.0},
                "default_fsyncs_per_item": 1.5,
                "default_over_tmpfs": 0.7,
            },
        },
    }
    found = bench.targets(figures)
    verdicts = [target["met"] for target in found]
    # 3x, 1 us, 512 B, scaling, 60 us on tmpfs; raw (one cell unknown),
    # futures at depth 4, raw at its best; durable bound, 1 fsync, tmpfs.
    assert verdicts == [True, True, False, False, True, False, True, False, True, False, True]
    assert "depth 4" in found[6]["target"]
    assert found[9]["measured"] == "1.50 (counted in the process)"


def test_a_tiny_run_prints_its_table_and_its_json_is_plain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = bench.run(TINY, quiet, sections=("core", "scaling"))
    bench.print_table(results)
    table = capsys.readouterr().out
    for heading in ("1. core", "2. scaling", "targets", "wall time"):
        assert heading in table
    scaling = results["sections"]["scaling"]
    assert [row["workers"] for row in scaling["rows"]] == [4, 64]
    assert scaling["rows"][0]["ratio_to_first"] == 1.0
    assert scaling["notes"]  # 1,048,576 workers skipped in a quick configuration
    assert results["versions"]["dispatchtx"]
    assert positive(results["wall_seconds"])
    json.loads(json.dumps(results))


def _mpiexec() -> str:
    try:
        return find_mpiexec()
    except MPIExecNotFound:
        pytest.skip("no mpiexec")


def test_the_raw_loop_and_the_futures_pool_report_results_per_second(tmp_path: Path) -> None:
    _mpiexec()
    runner = bench.JobRunner(str(tmp_path), timeout=90.0)
    raw = runner.run(
        2,
        [
            "-m",
            "dispatchtx.jobs.bench.raw_mpi",
            "--items",
            "20",
            "--max-in-flight",
            "1",
            "2",
            "--repetitions",
            "2",
        ],
        "raw",
    )
    assert raw.error is None and raw.report is not None
    for depth in ("1", "2"):
        rates = raw.report["by_max_in_flight"][depth]["results_per_second"]
        assert len(rates) == 2 and all(positive(rate) for rate in rates)
    assert positive(raw.report["work_message_bytes"])
    futures = runner.run(
        2,
        ["-m", "mpi4py.futures", "-m", "dispatchtx.jobs.bench.futures_mpi", "--items", "20"],
        "futures",
    )
    assert futures.error is None and futures.report is not None
    assert all(positive(rate) for rate in futures.report["results_per_second"])
    rate, error = runner.dispatchtx(2, 1, 10, "memory", "dtx")
    assert error is None and rate is not None and positive(rate)


@pytest.mark.parametrize("policy", ["yield", "block"])
def test_the_raw_loop_runs_with_each_waiting_policy(tmp_path: Path, policy: str) -> None:
    _mpiexec()
    runner = bench.JobRunner(str(tmp_path), timeout=90.0)
    args = ["-m", "dispatchtx.jobs.bench.raw_mpi", "--items", "30", "--max-in-flight", "1", "3"]
    raw = runner.run(3, [*args, "--repetitions", "1", "--policy", policy], policy)
    assert raw.error is None and raw.report is not None
    assert raw.report["policy"] == policy and raw.report["spin"] is None
    for depth in ("1", "3"):
        (rate,) = raw.report["by_max_in_flight"][depth]["results_per_second"]
        assert positive(rate)


def test_a_dispatchtx_job_on_a_store_in_memory_leaves_no_store_behind(tmp_path: Path) -> None:
    _mpiexec()
    runner = bench.JobRunner(str(tmp_path / "jobs"), timeout=90.0)
    (tmp_path / "jobs").mkdir()
    memory = tmp_path / "memory"
    memory.mkdir()
    rate, error = runner.dispatchtx(2, 1, 10, "real", "dtx", store_parent=str(memory))
    assert error is None and rate is not None and positive(rate)
    assert list(memory.iterdir()) == []


def test_a_job_past_its_timeout_is_killed_as_a_group(tmp_path: Path) -> None:
    _mpiexec()
    started = time.monotonic()
    outcome = bench.run_mpi_job(
        2,
        ["-c", "import time; time.sleep(60)"],
        str(tmp_path / "never.json"),
        timeout=2.0,
        log=str(tmp_path / "job.log"),
    )
    assert outcome.report is None
    assert outcome.error is not None and "killed" in outcome.error
    assert time.monotonic() - started < 30
