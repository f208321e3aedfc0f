"""The command line as a user meets it, run as subprocesses: bad input is
refused up front with one line and exit status 2, before any job starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dispatchtx
from dispatchtx.coordinator.faults import FaultPoint
from dispatchtx.jobs.campaign.runner import MARKER, RATE_POINTS, Campaign, CampaignConfig

from support import require_mpi


def run(*arguments: str, module: str = "dispatchtx", cwd: Path | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", module, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    return done.returncode, done.stderr + done.stdout


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["campaign", "--items", "-5"], "--items: must be at least 1, not -5"),
        (["campaign", "--ranks", "1"], "--ranks: must be at least 2, not 1"),
        (["campaign", "--coordinators", "0"], "--coordinators: must be at least 1"),
        (["campaign", "--max-in-flight", "0"], "--max-in-flight: must be at least 1"),
        (["campaign", "--rate", "1.5"], "--rate: must be between 0 and 1"),
        (["campaign", "--timeout", "0"], "--timeout: must be greater than 0"),
        (["campaign", "--items", "lots"], "'lots' is not a whole number"),
        (["simulate", "--schedules", "-5"], "--schedules: must be at least 1, not -5"),
        (["simulate", "--json", "/no/such/dir/x"], "directory /no/such/dir does not exist"),
        (["bench", "--dir", "/no/such/dir"], "--dir: /no/such/dir is not a directory"),
        (["bench", "--json", "/no/such/dir/x"], "directory /no/such/dir does not exist"),
        (["example", "--fault-every", "0"], "--fault-every: must be at least 1, not 0"),
        (["example", "--ranks", "1"], "--ranks: must be at least 2, not 1"),
    ],
)
def test_bad_input_is_refused_with_one_line_and_status_2(arguments: list[str], says: str) -> None:
    started = time.monotonic()
    status, output = run(*arguments)
    assert status == 2, output
    assert output.count("\n") == 1, output
    assert says in output, output
    assert "Traceback" not in output
    assert time.monotonic() - started < 30, "refused only after the work"


def test_an_unknown_fault_name_lists_the_valid_ones() -> None:
    status, output = run("campaign", "--faults", "send,bogus")
    assert status == 2, output
    assert "unknown fault point 'bogus'" in output
    for point in RATE_POINTS:
        assert point.value in output


def test_a_scheduled_fault_is_not_taken_for_a_rate() -> None:
    status, output = run("campaign", "--faults", FaultPoint.KILL_MID_TRIAGE.value)
    assert status == 2, output
    assert "not fired by rate" in output


def test_campaign_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "a-file"
    out.write_text("mine\n")
    status, output = run("campaign", "--out", str(out))
    assert status == 2, output
    assert "is a file" in output
    assert out.read_text() == "mine\n"


def test_campaign_out_that_holds_an_earlier_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "campaign-out"
    out.mkdir()
    (out / MARKER).write_text("")
    (out / "campaign.json").write_text("{}")
    status, output = run("campaign", "--out", str(out))
    assert status == 2, output
    assert "is not empty" in output and "--replace" in output
    assert (out / "campaign.json").exists(), "a refusal removes nothing"


def test_replace_never_removes_a_directory_no_campaign_made(tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    status, output = run("campaign", "--out", str(out), "--replace")
    assert status == 2, output
    assert "was not made by a campaign" in output
    assert (out / "thesis.tex").read_text() == "years of work"


def test_mpi_job_refuses_a_negative_budget_before_mpi_starts() -> None:
    status, output = run(
        *("--store", "/tmp/unused", "--report", "/tmp/unused.json", "--items", "-3"),
        module="dispatchtx.jobs.mpi_job",
    )
    assert status == 2, output
    assert "--items: must be at least 1, not -3" in output
    assert output.count("\n") == 1, output


def test_mpi_job_refuses_under_mpiexec_with_one_line_from_rank_0(tmp_path: Path) -> None:
    require_mpi()
    from dispatchtx.launch import find_mpiexec

    done = subprocess.run(
        [
            *(find_mpiexec(), "-n", "3", sys.executable, "-m", "dispatchtx.jobs.mpi_job"),
            *("--store", str(tmp_path / "s"), "--report", str(tmp_path / "r.json")),
            *("--items", "-3"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("must be at least 1") == 1, done.stderr
    assert not (tmp_path / "r.json").exists()


def test_version() -> None:
    status, output = run("--version")
    assert status == 0
    assert output.strip().startswith(f"dispatchtx {dispatchtx.__version__} (")


@pytest.mark.parametrize("command", ["campaign", "simulate", "example", "bench"])
def test_each_command_has_a_description_and_every_option_shows_its_default(command: str) -> None:
    status, output = run(command, "--help")
    assert status == 0, output
    head, options = output.split("options:", 1)
    # An option's entry starts on a line indented by two, its help goes on
    # in lines indented further.
    entries: list[str] = []
    for line in options.splitlines():
        if line.startswith("  -"):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line.strip()
    entries = [e for e in entries if not e.strip().startswith(("-h, --help", "--version"))]
    assert entries, output
    for entry in entries:
        assert "(default:" in entry, entry
    description = head.split("\n\n", 1)[1]
    assert len(description.split()) > 25, "a description says what the command does"


def test_a_job_that_refuses_its_configuration_is_not_restarted(tmp_path: Path) -> None:
    require_mpi()
    config = CampaignConfig(
        out=tmp_path / "out",
        coordinators=1,
        items=-5,  # past the CLI's check: the job itself refuses it
        simulate_schedules=0,
        picture=False,
        timeout=120.0,
        hang_a_worker=False,
        kill_one_for_good=False,
    )
    campaign = Campaign(config)
    report = campaign.run()
    assert not report["passed"]
    (slot,) = campaign.slots
    assert len(slot.launches) == 1, "restarted after refusing its configuration"
    assert any("refused its configuration" in p for p in report["consistency_problems"])
    assert os.path.exists(tmp_path / "out" / MARKER)
