"""The README's example job: a real coordinator loop over MPI ranks with
faults injected, checked for leaks and double commits by itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import require_mpi


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_example_job_commits_every_task_once_and_leaks_nothing(ranks: int) -> None:
    require_mpi()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatchtx",
            "example",
            "--ranks",
            str(ranks),
            "--tasks",
            "120",
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout[: out.stdout.rindex("}") + 1])
    assert report["passed"] is True
    assert report["committed"] == 120
    assert report["applied_twice"] == 0
    assert report["leaked"] == {"leases": 0, "pending_tokens": 0}
    # every kind of injected fault fired
    assert report["send_faults"] > 0
    assert report["build_faults"] > 0
    assert report["stale_results_fenced_out"] > 0
    # an unsent task is never counted: attempts = dispatches that really went out
    assert report["attempts_counted"] == report["committed"] + report["stale_results_fenced_out"]
