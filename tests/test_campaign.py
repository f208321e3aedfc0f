"""The main job end to end: coordinators as separate mpiexec jobs sharing
one store on the real disk, every fault point on, kills at every commit
stage with restarts, one coordinator killed for good, a hung worker, and a
short simulation merged; the report re-derived from disk must pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import require_mpi


def run_campaign(tmp_path: Path, *options: str) -> dict[str, object]:
    require_mpi()
    out = tmp_path / "campaign"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatchtx",
            "campaign",
            "--out",
            str(out),
            "--no-picture",
            "--simulate-schedules",
            "40",
            "--timeout",
            "240",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    report: dict[str, object] = json.loads((out / "campaign.json").read_text())
    assert done.returncode == (0 if report["passed"] else 1), done.stdout + done.stderr
    return report


def assert_campaign_passed(report: dict[str, object]) -> None:
    assert report["consistency_problems"] == [], report["consistency_problems"]
    assert report["leaks"] == []
    assert report["leaked_claims_in_store"] == 0
    assert report["left_committing_in_store"] == 0
    assert report["effects_applied_twice"] == 0
    assert report["requested_faults_not_fired"] == []
    assert report["passed"] is True


@pytest.mark.slow
def test_one_coordinator_with_two_workers_every_fault_point(tmp_path: Path) -> None:
    report = run_campaign(tmp_path, "--coordinators", "1", "--ranks", "3", "--items", "80")
    assert_campaign_passed(report)
    fired = report["faults_fired"]
    assert isinstance(fired, dict)
    for stage in (
        "kill-after-store-commit",
        "kill-mid-triage",
        "kill-after-triage",
        "kill-after-complete",
    ):
        assert fired[stage] >= 1, stage
    kills = report["kills"]
    assert isinstance(kills, list) and len(kills) >= 4  # each commit stage, then a restart
    recovery = report["recovery"]
    assert isinstance(recovery, list) and recovery  # a restart killed while recovering has none
    assert all(0 <= entry["recovered_after_seconds"] < 60 for entry in recovery)


@pytest.mark.slow
def test_two_coordinators_with_three_workers_one_killed_for_good(tmp_path: Path) -> None:
    report = run_campaign(tmp_path, "--coordinators", "2", "--ranks", "4", "--items", "120")
    assert_campaign_passed(report)
    fired = report["faults_fired"]
    assert isinstance(fired, dict)
    assert fired["killed-for-good"] == 1
    assert fired["worker-hung"] == 1
    simulate = report["simulate"]
    assert isinstance(simulate, dict) and simulate["violations"] == 0
