"""The coordinator and workers on real MPI ranks (mpiexec from the `mpich`
wheel), the store on the real disk: normal flow, send failures, stale and
duplicate results, a hung worker found by its deadline, shutdown and
pipelining, each ending with nothing leaked. Every job is ended by killing
its process group, and a job that runs too long is killed, never waited for."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dispatchtx.launch import kill_job, start_job

from support import require_mpi

JOB_TIMEOUT = 90.0


def run_job(tmp_path: Path, ranks: int, *options: str) -> dict[str, Any]:
    require_mpi()
    report = tmp_path / "report.json"
    job = start_job(
        ranks,
        "dispatchtx.jobs.mpi_job",
        ["--store", str(tmp_path / "store"), "--report", str(report), *options],
    )
    deadline = time.monotonic() + JOB_TIMEOUT
    try:
        while not report.exists():
            if job.poll() is not None and not report.exists():
                pytest.fail(f"the job exited with {job.returncode} and wrote no report")
            if time.monotonic() > deadline:
                pytest.fail(f"no report after {JOB_TIMEOUT} s: the job was killed")
            time.sleep(0.05)
        # Give the job a moment to stop its workers; a hung rank never exits.
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(timeout=5.0)
    finally:
        kill_job(job)
        job.wait()
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def assert_passed(report: dict[str, Any], items: int) -> None:
    assert report["passed"], report
    assert report["counts"]["committed"] == items
    assert report["leaks_after_shutdown"] == []
    assert report["items_not_done_in_store"] == []
    assert report["violations"] == []


@pytest.mark.parametrize("ranks", [3, 5])
def test_normal_flow_commits_every_item(tmp_path: Path, ranks: int) -> None:
    report = run_job(tmp_path, ranks, "--items", "60")
    assert_passed(report, 60)
    assert report["counts"]["dispatches"] == 60
    assert report["lost_workers"] == []


@pytest.mark.parametrize("ranks", [3, 5])
def test_send_failures_are_compensated(tmp_path: Path, ranks: int) -> None:
    report = run_job(
        tmp_path,
        ranks,
        "--items",
        "40",
        "--faults",
        "send=0.2,ambiguous-send=0.1,message-build=0.1",
    )
    assert_passed(report, 40)
    fired = report["faults_fired"]
    assert fired["send"] >= 1 and fired["ambiguous-send"] >= 1 and fired["message-build"] >= 1
    assert report["counts"]["dispatch failures"] >= 3


def test_stale_and_duplicate_results_are_dropped(tmp_path: Path) -> None:
    report = run_job(
        tmp_path,
        3,
        "--items",
        "30",
        "--deadline",
        "0.3",
        "--faults",
        "stale-result=0.1,duplicate-result=0.2",
    )
    assert_passed(report, 30)
    fired = report["faults_fired"]
    assert fired["stale-result"] >= 1 and fired["duplicate-result"] >= 1
    assert report["counts"]["stale or duplicate results dropped"] >= fired["duplicate-result"]
    assert report["reruns"] == 0  # nothing was triaged twice


def test_a_hung_worker_is_found_by_its_deadline(tmp_path: Path) -> None:
    report = run_job(
        tmp_path,
        3,
        *("--items", "30", "--deadline", "0.5", "--strikes", "1"),
        *("--hang-rank", "2", "--hang-after", "2"),
    )
    assert_passed(report, 30)
    assert report["lost_workers"] == [1]  # rank 2 is worker 1
    assert report["counts"]["workers lost"] == 1


@pytest.mark.parametrize("ranks", [3, 5])
def test_pipelining_with_four_in_flight_per_worker(tmp_path: Path, ranks: int) -> None:
    report = run_job(tmp_path, ranks, "--items", "80", "--max-in-flight", "4")
    assert_passed(report, 80)
    assert report["max_in_flight"] == 4


@pytest.mark.parametrize("strikes", ["1", "3"])
def test_a_job_with_a_hung_worker_ends_on_its_own(tmp_path: Path, strikes: str) -> None:
    # strikes 1: the worker is declared lost; strikes 3: the run can finish
    # on the other worker first. Either way mpiexec must exit by itself.
    require_mpi()
    report = tmp_path / "report.json"
    job = start_job(
        3,
        "dispatchtx.jobs.mpi_job",
        [
            *("--store", str(tmp_path / "store"), "--report", str(report)),
            *("--items", "30", "--deadline", "0.5", "--strikes", strikes),
            *("--hang-rank", "2", "--hang-after", "2"),
        ],
    )
    try:
        status = job.wait(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpiexec did not exit within {JOB_TIMEOUT} s with a hung worker")
    finally:
        kill_job(job)
        job.wait()
    result = json.loads(report.read_text())
    assert_passed(result, 30)
    assert status == 0
