"""The main job: a real MPI fault campaign (docs/design.md).

Several coordinators share one store directory on the real disk; each runs
with its workers as its own `mpiexec` job (`dispatchtx.jobs.mpi_job`), so that
one can be killed and restarted while the others go on. The campaign:

- injects the coordinator's fault points at the requested rates, and disk
  faults through the fault-injecting FS wrapper;
- SIGKILLs a coordinator's whole job at each commit stage in turn and
  restarts it (a new incarnation rolls its commits forward);
- kills one coordinator for good, so that a peer must roll its COMMITTING
  items forward once its heartbeat has stalled, and take over its claims;
- hangs one worker (SIGSTOP): the deadline must find it;
- runs a short `simulate` for the faults only a simulated disk and clock
  can produce (power loss, stale look-ups, ESTALE) and merges its report;
- shows progress, then re-derives from disk what must hold: every item done
  (or quarantined), no claim or commit left behind, each result triaged
  under its committed token only; writes a JSON report and a picture.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatchtx.coordinator.faults import FaultPoint
from dispatchtx.jobs.arguments import CONFIGURATION_ERROR
from dispatchtx.jobs.campaign.picture import draw_picture, stage_words
from dispatchtx.jobs.campaign.report import build_report
from dispatchtx.launch import kill_job, start_job

__all__ = ["CampaignConfig", "run_campaign"]

KILL_STAGES: tuple[FaultPoint, ...] = (
    FaultPoint.KILL_AFTER_STORE_COMMIT,
    FaultPoint.KILL_MID_TRIAGE,
    FaultPoint.KILL_AFTER_TRIAGE,
    FaultPoint.KILL_AFTER_COMPLETE,
)
# A job that has not written its status for this long is hung: killed, and
# counted as a crash (a campaign never waits on one forever).
STALL_SECONDS = 60.0
# Points a coordinator fires by rate (kills are scheduled by the campaign).
RATE_POINTS: tuple[FaultPoint, ...] = tuple(
    point
    for point in FaultPoint
    if point not in KILL_STAGES and point is not FaultPoint.WORKER_HUNG
)


# Written into --out when a campaign starts: `dispatchtx campaign --replace`
# removes only a directory that holds it.
MARKER = ".dispatchtx-campaign"


@dataclass
class CampaignConfig:
    out: Path
    coordinators: int = 2
    ranks: int = 3  # per coordinator: the coordinator and its workers
    items: int = 200
    max_in_flight: int = 2
    rate: float = 0.03
    faults: tuple[FaultPoint, ...] = RATE_POINTS
    kill_stages: tuple[FaultPoint, ...] = KILL_STAGES
    kill_one_for_good: bool = True
    hang_a_worker: bool = True
    disk_fault_rate: float = 0.002
    ttl: float = 2.0
    deadline: float = 2.0
    simulate_schedules: int = 200
    seed: int = 0
    timeout: float = 600.0
    picture: bool = True
    workload: str = "fuzz"  # or "hash", the small self-checking one
    batches_per_seed: int = 2


@dataclass
class Launch:
    coordinator: str
    number: int
    started: float
    job: subprocess.Popen[bytes]
    report_path: Path
    kill_at: FaultPoint | None
    hang: bool
    log_path: Path
    ended: float | None = None
    report: dict[str, Any] | None = None
    told_hang: bool = False  # the terminal was told its hung worker was found


@dataclass
class Slot:
    """One coordinator across its incarnations."""

    name: str
    kills_planned: list[FaultPoint]
    dies_for_good: bool
    launches: list[Launch] = field(default_factory=list)
    finished: bool = False
    dead_for_good: bool = False
    # Why the last incarnation ended, until its restart says how it recovered.
    ended_because: str | None = None


class Campaign:
    def __init__(self, config: CampaignConfig) -> None:
        self.config = config
        out = config.out
        self.store_dir = out / "store"
        self.results_dir = out / "results"
        self.reports_dir = out / "reports"
        # Each job's launcher output (MPICH prints a banner for every kill).
        self.logs_dir = out / "logs"
        directories = (self.store_dir, self.results_dir, self.reports_dir, self.logs_dir)
        for directory in (*directories, out / "journals"):
            directory.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("a dispatchtx campaign's directory\n")
        self.started = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.progress: list[tuple[float, int, int]] = []  # seconds, triaged, faults
        self.slots = [self._plan(index) for index in range(config.coordinators)]
        self.crashes: list[str] = []
        self.interactive = sys.stderr.isatty()
        self.progress_shown = False  # a progress line waits on the terminal

    def _plan(self, index: int) -> Slot:
        config = self.config
        stages = list(config.kill_stages)
        # Coordinator 0 is killed at every commit stage in turn; the others once.
        kills = stages if index == 0 else stages[index % len(stages) :][:1] if stages else []
        dies = config.kill_one_for_good and index == config.coordinators - 1 and index > 0
        return Slot(f"coord-{index}", kills, dies)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def event(self, kind: str, coordinator: str, detail: str = "") -> None:
        self.events.append(
            {
                "t": round(self.elapsed(), 3),
                "event": kind,
                "coordinator": coordinator,
                "detail": detail,
            }
        )

    # -- jobs ----------------------------------------------------------------------

    def launch(self, slot: Slot) -> None:
        config = self.config
        number = len(slot.launches) + 1
        kill_at = slot.kills_planned[0] if slot.kills_planned else None
        # A worker of coordinator 0 hangs once its kills are all done: that
        # incarnation runs to its end, so the deadline must find the worker.
        hang = (
            config.hang_a_worker
            and slot is self.slots[0]
            and not slot.kills_planned
            and not any(launch.hang for launch in slot.launches)
        )
        report = self.reports_dir / f"{slot.name}.{number}.json"
        rates = ",".join(f"{point.value}={config.rate}" for point in config.faults)
        args = [
            *("--store", str(self.store_dir), "--report", str(report)),
            *("--coordinator-id", slot.name, "--items", str(config.items)),
            *("--workload", config.workload),
            *("--batches-per-seed", str(config.batches_per_seed)),
            *("--journal", str(config.out / "journals" / f"{slot.name}.journal")),
            *("--results", str(self.results_dir)),
            *("--max-in-flight", str(config.max_in_flight)),
            *("--ttl", str(config.ttl), "--deadline", str(config.deadline)),
            *("--disk-fault-rate", str(config.disk_fault_rate)),
            *("--seed", str(config.seed * 1000 + number * 10 + len(self.slots))),
        ]
        if rates:
            args += ["--faults", rates]
        if kill_at is not None:
            args += ["--kill-at", kill_at.value, "--kill-rate", "0.15"]
        if hang:
            args += ["--hang-rank", str(config.ranks - 1), "--hang-after", "1", "--strikes", "1"]
        log_path = self.logs_dir / f"{slot.name}.{number}.log"
        with open(log_path, "wb") as log:
            job = start_job(config.ranks, "dispatchtx.jobs.mpi_job", args, output=log)
        slot.launches.append(
            Launch(slot.name, number, self.elapsed(), job, report, kill_at, hang, log_path)
        )
        self.event("start", slot.name, f"incarnation attempt {number}")

    def poll(self, slot: Slot) -> None:
        if slot.finished or slot.dead_for_good or not slot.launches:
            return
        launch = slot.launches[-1]
        if launch.report_path.exists():
            # Done: stop what is left of the job (a hung rank never exits).
            with contextlib.suppress(subprocess.TimeoutExpired):
                launch.job.wait(timeout=3.0)
            kill_job(launch.job)
            launch.job.wait()
            launch.ended = self.elapsed()
            launch.report = json.loads(launch.report_path.read_text())
            self.tell_recovery(slot, launch, launch.report)
            # The report can come before any status that named the lost worker.
            self.tell_hung_worker(slot, launch, launch.report)
            if launch.hang and not launch.told_hang:
                self.say(
                    f"{slot.name}: its planned hung worker got no task to hang on "
                    "(the work ran out first)"
                )
            slot.finished = True
            verdict = "passed" if launch.report.get("passed") else "FAILED"
            self.event("finished", slot.name, verdict)
            self.say(
                f"{slot.name} finished as incarnation {launch.report.get('incarnation')}: {verdict}"
            )
            return
        status = read_status(launch)
        self.tell_recovery(slot, launch, status)
        self.tell_hung_worker(slot, launch, status)
        reason = ""
        if launch.job.poll() is None:
            quiet = self.elapsed() - launch.started
            status_path = Path(f"{launch.report_path}.status")
            if status_path.exists():
                quiet = time.time() - status_path.stat().st_mtime
            if quiet < STALL_SECONDS:
                return
            # It writes its status every second: silent this long, it hangs.
            kill_job(launch.job)
            launch.job.wait()
            self.event("stalled", slot.name, f"silent for {quiet:.0f} s")
            reason = f"silent for {quiet:.0f} s, so killed as hung (not planned)"
        # The job died without a report: a kill at a commit stage (or a crash).
        kill_job(launch.job)
        launch.ended = self.elapsed()
        status = read_status(launch)
        if launch.job.returncode == CONFIGURATION_ERROR and not status:
            # The job refused its own arguments before it started: a restart
            # would refuse them again.
            self.crashes.append(
                f"{slot.name} attempt {launch.number} refused its configuration "
                f"(exit {CONFIGURATION_ERROR}): not restarted"
            )
            self.event("refused", slot.name, "its configuration")
            self.say(f"{slot.name} refused its configuration: not restarted ({launch.log_path})")
            slot.dead_for_good = True
            return
        fired = status.get("faults_fired", {})
        planned = launch.kill_at is not None and bool(fired.get(launch.kill_at.value))
        if planned and launch.kill_at is not None and not reason:
            self.event("killed", slot.name, launch.kill_at.value)
            reason = f"killed {stage_words(launch.kill_at.value)} (planned)"
            slot.kills_planned.pop(0)
        else:
            self.crashes.append(
                f"{slot.name} attempt {launch.number} exited "
                f"{launch.job.returncode} without a report"
            )
            self.event("crashed", slot.name, f"exit {launch.job.returncode}")
            reason = reason or (
                f"exited {launch.job.returncode} without a report (not planned; "
                f"see {launch.log_path})"
            )
        if slot.ended_because is not None:
            # This incarnation never said it recovered: told with its end.
            incarnation = status.get("incarnation", "?")
            self.say(
                f"{slot.name} {slot.ended_because}, restarted as incarnation {incarnation}, "
                "which ended while it recovered"
            )
        if slot.dies_for_good:
            slot.dead_for_good = True
            slot.ended_because = None
            stage = stage_words(launch.kill_at.value) if planned and launch.kill_at else "unplanned"
            self.event("killed for good", slot.name, stage)
            self.say(
                f"{slot.name} {reason}, not restarted: killed for good, its peers roll its "
                "items forward"
            )
            return
        slot.ended_because = reason
        self.launch(slot)

    def tell_recovery(self, slot: Slot, launch: Launch, status: dict[str, Any]) -> None:
        """One line per restart, once the new incarnation has recovered."""
        recovered = status.get("recovered_after_seconds")
        if slot.ended_because is None or launch.number == 1 or recovered is None:
            return
        self.event("recovered", slot.name, f"incarnation {status.get('incarnation')}")
        self.say(
            f"{slot.name} {slot.ended_because}, restarted as incarnation "
            f"{status.get('incarnation')}, recovered in {recovered * 1000:.0f} ms"
        )
        slot.ended_because = None

    def tell_hung_worker(self, slot: Slot, launch: Launch, status: dict[str, Any]) -> None:
        lost = status.get("lost_workers") or []
        if not launch.hang or launch.told_hang or not lost:
            return
        launch.told_hang = True
        ranks = ", ".join(str(worker + 1) for worker in lost)
        self.event("worker lost", slot.name, f"rank {ranks}")
        self.say(
            f"{slot.name}: worker rank {ranks} hung (planned SIGSTOP), found by its deadline "
            f"{self.elapsed() - launch.started:.1f} s after the job started"
        )

    def say(self, line: str) -> None:
        """A line of its own, above the progress line."""
        if self.progress_shown and self.interactive:
            print("\r\x1b[K", end="", file=sys.stderr)
        elif self.progress_shown:
            print(file=sys.stderr)
        self.progress_shown = False
        print(f"{self.elapsed():6.1f} s  {line}", file=sys.stderr, flush=True)

    # -- the run ------------------------------------------------------------------------

    def done_items(self) -> int:
        """Results triaged so far, counted on disk."""
        directory = self.results_dir
        if self.config.workload == "fuzz":
            directory = directory / "coverage" / "deltas"
        try:
            return len(os.listdir(directory))
        except OSError:
            return 0

    def run(self) -> dict[str, Any]:
        config = self.config
        simulate_report = self.out_path("simulate.json")
        simulation = None
        if config.simulate_schedules > 0:
            with open(self.logs_dir / "simulate.log", "wb") as simulate_log:
                simulation = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "dispatchtx", "simulate"),
                        *("--schedules", str(config.simulate_schedules)),
                        *("--seed", str(config.seed), "--json", str(simulate_report)),
                    ],
                    stdout=simulate_log,
                    stderr=subprocess.STDOUT,
                )
        for slot in self.slots:
            self.launch(slot)
        last_print = 0.0
        try:
            while not all(slot.finished or slot.dead_for_good for slot in self.slots):
                if self.elapsed() > config.timeout:
                    self.event("timeout", "campaign", f"{config.timeout:.0f} s")
                    break
                for slot in self.slots:
                    self.poll(slot)
                now = self.elapsed()
                if now - last_print >= 1.0:
                    last_print = now
                    self.show_progress()
                time.sleep(0.05)
        finally:
            for slot in self.slots:
                for launch in slot.launches:
                    kill_job(launch.job)
                    launch.job.wait()
        self.show_progress(final=True)
        if self.interactive:
            print(file=sys.stderr)
        if simulation is not None:
            try:
                simulation.wait(timeout=max(60.0, config.timeout - self.elapsed()))
            except subprocess.TimeoutExpired:
                simulation.kill()
        report = build_report(self, simulate_report)
        self.out_path("campaign.json").write_text(json.dumps(report, indent=2))
        if config.picture:
            report["picture"] = draw_picture(self, report, self.out_path("campaign.png"))
            self.out_path("campaign.json").write_text(json.dumps(report, indent=2))
        return report

    def out_path(self, name: str) -> Path:
        return self.config.out / name

    def faults_so_far(self) -> int:
        """Faults fired so far, from what every job wrote about itself."""
        total = 0
        for slot in self.slots:
            for launch in slot.launches:
                path = Path(f"{launch.report_path}.status")
                try:
                    status = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                total += sum(status.get("faults_fired", {}).values())
                total += sum(status.get("disk_faults_fired", {}).values())
        return total

    def show_progress(self, final: bool = False) -> None:
        done = self.done_items()
        now = self.elapsed()
        faults = self.faults_so_far()
        self.progress.append((round(now, 2), done, faults))
        # Not a terminal (a log, CI): a plain line every ten seconds.
        if not (self.interactive or final or len(self.progress) % 10 == 0):
            return
        kills = sum(1 for e in self.events if e["event"] == "killed")
        rate = done / now if now else 0.0
        line = (
            f"{now:6.1f} s  results triaged {done:5d}  {rate:6.1f}/s  faults fired {faults:5d}  "
            f"kills {kills}  restarts {sum(len(s.launches) - 1 for s in self.slots)}"
        )
        if self.interactive:
            print(f"\r\x1b[K{line}", end="", file=sys.stderr, flush=True)
            self.progress_shown = True
        else:
            print(line, file=sys.stderr, flush=True)


def read_status(launch: Launch) -> dict[str, Any]:
    """What a job last wrote about itself ({} before its first status)."""
    try:
        status: dict[str, Any] = json.loads(Path(f"{launch.report_path}.status").read_text())
    except (OSError, ValueError):
        return {}
    return status


def run_campaign(config: CampaignConfig) -> dict[str, Any]:
    return Campaign(config).run()
