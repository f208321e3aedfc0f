"""The whole-system simulator: randomized fault schedules over the very
same coordinator and store code, checked after every schedule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchtx.jobs import simulate
from dispatchtx.jobs.workloads.hash import HashWorkload


def test_a_short_simulation_shows_no_violation() -> None:
    summary = simulate.run_schedules(seed=11, schedules=60)
    assert summary.failed == []
    assert summary.counts["committed"] > 0
    assert summary.fired["coordinator-killed"] > 0
    # Most schedules draw group commit, and their groups are made.
    assert summary.grouped >= 30 and summary.counts["results in group commits"] > 0
    assert summary.as_json()["schedules_with_group_commit"] == summary.grouped


@pytest.mark.slow
def test_a_ci_sized_simulation_of_2000_schedules_shows_no_violation() -> None:
    summary = simulate.run_schedules(seed=0, schedules=2000)
    assert summary.failed == [], summary.failed[:5]
    # every kind of fault was scheduled and fired
    for name in (
        "ambiguous-send",
        "begin-commit-eio",
        "complete-eio",
        "kill-after-store-commit",
        "kill-mid-triage",
        "kill-after-triage",
        "kill-after-complete",
        "killed-for-good",
        "message-build",
        "object-transfer",
        "send",
        "send-after-claim",
        "send-after-reservations",
        "triage-eio",
        "stale-result",
        "duplicate-result",
        "worker-crash",
        "power-loss",
        "process-kill",
        "disk-eio",
        "disk-enospc",
        "disk-estale",
        "disk-lost-link-reply",
        "disk-stale-absent",
    ):
        assert summary.fired[name] > 0, name
    assert summary.counts["rolled forward"] > 0
    assert summary.counts["rolled forward for a peer"] > 0


def test_the_checks_catch_a_local_effect_applied_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    def careless_triage(
        self: HashWorkload, work_id: str, token: int, result: bytes, *, owner: bool
    ) -> None:
        self.ledger.triage_runs[(work_id, token)] += 1
        self.ledger.digests[work_id] = result
        if owner:
            self.ledger.local_applied[(work_id, token)] += 1  # no once-only check

    monkeypatch.setattr(HashWorkload, "triage", careless_triage)
    summary = simulate.run_schedules(seed=11, schedules=60)
    assert any(
        "applied twice" in violation for _, violations in summary.failed for violation in violations
    )


def test_the_simulate_command_writes_its_report_and_exits_zero(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatchtx",
            "simulate",
            "--schedules",
            "20",
            "--seed",
            "5",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["schedules"] == 20
    assert report["violations"] == 0
    assert "violations: 0" in done.stdout
