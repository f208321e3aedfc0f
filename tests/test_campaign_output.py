"""What the campaign shows a user: one line per kill and restart on the
terminal with each job's launcher output in its own log, a report that says
what the budget is and why the run ended, the faults grouped as the design's
fault points are (real MPI beside simulated), and the picture's stalls."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchtx.jobs.campaign.picture import fault_intervals, find_stalls
from dispatchtx.jobs.campaign.report import FAULT_GROUPS, budget_and_end, group_faults
from dispatchtx.jobs.campaign.runner import CampaignConfig

from support import require_mpi


def test_faults_are_grouped_with_both_columns_and_nothing_dropped() -> None:
    groups = group_faults(
        {"send-after-claim": 3, "disk-eio": 2, "something-new": 1},
        {"send-after-claim": 7, "power-loss": 4, "result-lost": 0},
    )
    by_title = {group["group"]: group["faults"] for group in groups}
    assert [group["group"] for group in groups][: len(FAULT_GROUPS)] == [
        title for title, _ in FAULT_GROUPS
    ]
    assert by_title[FAULT_GROUPS[0][0]] == {"send-after-claim": {"real_mpi": 3, "simulated": 7}}
    assert by_title["6. the disk"] == {
        "disk-eio": {"real_mpi": 2, "simulated": 0},
        "power-loss": {"real_mpi": 0, "simulated": 4},
    }
    assert by_title["other"] == {"something-new": {"real_mpi": 1, "simulated": 0}}
    assert all("result-lost" not in faults for faults in by_title.values())


def test_the_report_says_why_the_run_ended(tmp_path: Path) -> None:
    config = CampaignConfig(out=tmp_path, items=200)
    budget, ended = budget_and_end(config, made=124, settled=124, timed_out=False, refused=False)
    assert "up to 200" in budget and "ran dry" in ended and "124" in ended
    _, ended = budget_and_end(config, made=200, settled=200, timed_out=False, refused=False)
    assert "budget was spent" in ended
    _, ended = budget_and_end(config, made=150, settled=90, timed_out=True, refused=False)
    assert "--timeout" in ended and "90 of 150" in ended
    _, ended = budget_and_end(config, made=0, settled=0, timed_out=False, refused=True)
    assert "refused its configuration" in ended


def test_a_stall_is_found_with_what_was_pending() -> None:
    progress = [(0.0, 0, 0), (1.0, 5, 1), (2.0, 5, 2), (3.0, 5, 3), (4.0, 5, 3), (5.0, 9, 4)]
    events = [
        {"t": 0.5, "event": "killed", "coordinator": "coord-0", "detail": "kill-mid-triage"},
        {"t": 3.5, "event": "recovered", "coordinator": "coord-0", "detail": "incarnation 2"},
    ]
    (stall,) = find_stalls(progress, events)
    assert (stall.start, stall.end) == (1.0, 4.0)
    assert "coord-0 restarting" in stall.cause
    assert find_stalls(progress[:3], events) == []


@pytest.mark.slow
def test_the_terminal_shows_kills_and_restarts_not_launcher_banners(tmp_path: Path) -> None:
    require_mpi()
    out = tmp_path / "campaign"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "dispatchtx", "campaign", "--out", str(out)),
            *("--coordinators", "1", "--ranks", "3", "--items", "80", "--no-picture"),
            *("--simulate-schedules", "10", "--timeout", "240"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BAD TERMINATION" not in done.stdout + done.stderr
    restarts = re.findall(
        r"coord-0 killed (after store commit|mid triage|after triage|after complete) "
        r"\(planned\), restarted as incarnation \d+, (recovered in \d+ ms|which ended while)",
        done.stderr,
    )
    assert len(restarts) == 4, done.stderr
    assert "hung (planned SIGSTOP), found by its deadline" in done.stderr
    logs = sorted(path.name for path in (out / "logs").iterdir())
    assert "coord-0.1.log" in logs and "simulate.log" in logs
    assert "BAD TERMINATION" in "".join((out / "logs" / name).read_text() for name in logs)
    assert re.search(r"^  budget +up to 80 work items", done.stdout, re.M)
    assert re.search(r"^  ended +", done.stdout, re.M)
    assert re.search(r"real MPI +simulated", done.stdout)
    assert re.search(r"^      kill-mid-triage +\d+ +\d+$", done.stdout, re.M)


def test_the_fault_strip_spreads_each_count_over_its_own_interval() -> None:
    progress = [(0.0, 0, 0), (1.0, 5, 10), (2.0, 9, 20), (3.0, 9, 50)]
    assert fault_intervals(progress) == [(0.0, 1.0, 10.0), (1.0, 1.0, 10.0), (2.0, 1.0, 30.0)]


def test_a_last_sample_just_after_the_one_before_is_no_burst() -> None:
    # The final sample comes 0.1 s after the last one, with the faults a
    # job's lagging status had not shown yet: they belong to the last second.
    progress = [(0.0, 0, 0), (1.0, 5, 10), (2.0, 9, 20), (2.1, 9, 60)]
    intervals = fault_intervals(progress)
    assert [(start, round(width, 3)) for start, width, _ in intervals] == [(0.0, 1.0), (1.0, 1.1)]
    assert intervals[-1][2] == pytest.approx(50 / 1.1)
    assert fault_intervals([(0.0, 0, 0), (0.1, 0, 5)]) == [(0.0, 0.1, 50.0)]


def test_faults_counted_at_a_repeated_moment_are_not_lost() -> None:
    progress = [(0.0, 0, 0), (1.0, 0, 10), (1.0, 0, 14), (2.0, 0, 20)]
    assert fault_intervals(progress) == [(0.0, 1.0, 14.0), (1.0, 1.0, 6.0)]
