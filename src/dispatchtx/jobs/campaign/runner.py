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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatchtx.coordinator.audit import RunAudit
from dispatchtx.coordinator.faults import FaultPoint
from dispatchtx.fs import RealClock, RealFS
from dispatchtx.jobs.arguments import CONFIGURATION_ERROR
from dispatchtx.jobs.workloads.fuzz import check_campaign_dir, committed_slots
from dispatchtx.jobs.workloads.hash import HashWorkload, result_name
from dispatchtx.launch import kill_job, start_job
from dispatchtx.resources import Leak
from dispatchtx.store import ItemStatus, WorkStore

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
    ended: float | None = None
    report: dict[str, Any] | None = None


@dataclass
class Slot:
    """One coordinator across its incarnations."""

    name: str
    kills_planned: list[FaultPoint]
    dies_for_good: bool
    launches: list[Launch] = field(default_factory=list)
    finished: bool = False
    dead_for_good: bool = False


class Campaign:
    def __init__(self, config: CampaignConfig) -> None:
        self.config = config
        out = config.out
        self.store_dir = out / "store"
        self.results_dir = out / "results"
        self.reports_dir = out / "reports"
        for directory in (self.store_dir, self.results_dir, self.reports_dir, out / "journals"):
            directory.mkdir(parents=True, exist_ok=True)
        (out / MARKER).write_text("a dispatchtx campaign's directory\n")
        self.started = time.monotonic()
        self.events: list[dict[str, Any]] = []
        self.progress: list[tuple[float, int]] = []
        self.slots = [self._plan(index) for index in range(config.coordinators)]
        self.crashes: list[str] = []

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
        hang = config.hang_a_worker and slot is self.slots[-1] and number == 1
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
            args += ["--hang-rank", str(config.ranks - 1), "--hang-after", "3", "--strikes", "1"]
        job = start_job(config.ranks, "dispatchtx.jobs.mpi_job", args)
        slot.launches.append(Launch(slot.name, number, self.elapsed(), job, report, kill_at, hang))
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
            slot.finished = True
            self.event("finished", slot.name, "passed" if launch.report.get("passed") else "FAILED")
            return
        if launch.job.poll() is None:
            status_path = Path(f"{launch.report_path}.status")
            quiet = self.elapsed() - launch.started
            if status_path.exists():
                quiet = time.time() - status_path.stat().st_mtime
            if quiet < STALL_SECONDS:
                return
            # It writes its status every second: silent this long, it hangs.
            kill_job(launch.job)
            launch.job.wait()
        # The job died without a report: a kill at a commit stage (or a crash).
        kill_job(launch.job)
        launch.ended = self.elapsed()
        status_path = Path(f"{launch.report_path}.status")
        if launch.job.returncode == CONFIGURATION_ERROR and not status_path.exists():
            # The job refused its own arguments before it started: a restart
            # would refuse them again.
            self.crashes.append(
                f"{slot.name} attempt {launch.number} refused its configuration "
                f"(exit {CONFIGURATION_ERROR}): not restarted"
            )
            self.event("refused", slot.name, "its configuration")
            slot.dead_for_good = True
            return
        status = json.loads(status_path.read_text()) if status_path.exists() else {}
        fired = status.get("faults_fired", {})
        planned = launch.kill_at is not None and bool(fired.get(launch.kill_at.value))
        if planned and launch.kill_at is not None:
            self.event("killed", slot.name, launch.kill_at.value)
            slot.kills_planned.pop(0)
        else:
            self.crashes.append(
                f"{slot.name} attempt {launch.number} exited "
                f"{launch.job.returncode} without a report"
            )
            self.event("crashed", slot.name, f"exit {launch.job.returncode}")
        if slot.dies_for_good:
            slot.dead_for_good = True
            self.event("killed for good", slot.name)
            return
        self.launch(slot)

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
            simulation = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dispatchtx", "simulate"),
                    *("--schedules", str(config.simulate_schedules)),
                    *("--seed", str(config.seed), "--json", str(simulate_report)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
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
        self.show_progress()
        print(file=sys.stderr)
        if simulation is not None:
            try:
                simulation.wait(timeout=max(60.0, config.timeout - self.elapsed()))
            except subprocess.TimeoutExpired:
                simulation.kill()
        report = self.report(simulate_report)
        self.out_path("campaign.json").write_text(json.dumps(report, indent=2))
        if config.picture:
            report["picture"] = self.picture()
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

    def show_progress(self) -> None:
        done = self.done_items()
        now = self.elapsed()
        self.progress.append((round(now, 2), done))
        kills = sum(1 for e in self.events if e["event"] == "killed")
        rate = done / now if now else 0.0
        print(
            f"\r{now:6.1f} s  results triaged {done:5d}/{self.config.items}  "
            f"{rate:6.1f}/s  faults fired {self.faults_so_far():5d}  kills {kills}  restarts "
            f"{sum(len(s.launches) - 1 for s in self.slots)}",
            end="",
            file=sys.stderr,
            flush=True,
        )

    # -- what must hold, re-derived from disk ----------------------------------------

    def report(self, simulate_report: Path) -> dict[str, Any]:
        config = self.config
        store = WorkStore(RealFS(), str(self.store_dir), RealClock(), ttl=config.ttl)
        states = {state.work_id: state for state in store.items()}
        statuses = Counter(state.status.value for state in states.values())
        problems: list[str] = []
        applied_twice = 0
        derived: dict[str, Any] = {}
        if config.workload == "fuzz":
            check = check_campaign_dir(
                RealFS(), str(self.results_dir), committed=committed_slots(states.values())
            )
            problems.extend(check.problems)
            derived = {
                "corpus_entries": check.corpus_entries,
                "crash_files": check.crash_files,
                "crash_signatures": sorted(check.signatures),
                "coverage_deltas": check.deltas,
                "coverage_edges": len(check.coverage),
                "temp_files_left": check.temp_files,
            }
            problems.extend(
                f"{unsettled.work_id} left {unsettled.status.value}"
                for unsettled in states.values()
                if unsettled.status not in (ItemStatus.DONE, ItemStatus.QUARANTINED)
            )
        expected = HashWorkload(config.items if config.workload == "hash" else 0)
        files = set(os.listdir(self.results_dir))
        for item in expected.items:
            state = states.get(item)
            if state is None:
                problems.append(f"{item} never reached the store")
                continue
            if state.status is ItemStatus.QUARANTINED:
                continue
            if state.status is not ItemStatus.DONE:
                problems.append(f"{item} left {state.status.value}")
                continue
            assert state.token is not None
            name = result_name(item, state.token)
            if name not in files:
                problems.append(f"{item} is done but its result was never triaged")
            else:
                content = (self.results_dir / name).read_bytes()
                if content != item.encode() + b"\n" + expected.expected(item):
                    problems.append(f"{item}: the triaged result is wrong")
            prefix = name.rsplit(".", 1)[0] + "."
            others = [f for f in files if f.startswith(prefix) and f != name]
            applied_twice += len(others)
        merged: Counter[str] = Counter()
        wasted_cpu = 0.0
        proposal_attempts: Counter[str] = Counter()
        fired: Counter[str] = Counter()
        leaks: list[Leak] = []
        recovery: list[dict[str, Any]] = []
        for slot in self.slots:
            for launch in slot.launches:
                status_path = Path(f"{launch.report_path}.status")
                if launch.report is None:
                    # Killed: what it left behind just before the kill.
                    if status_path.exists():
                        status = json.loads(status_path.read_text())
                        merged.update(status["counts"])
                        wasted_cpu += status.get("wasted_cpu_seconds", 0.0)
                        fired.update(status["faults_fired"])
                        fired.update(status.get("disk_faults_fired", {}))
                        if launch.number > 1 and status.get("recovered_after_seconds") is not None:
                            recovery.append(
                                {
                                    "coordinator": slot.name,
                                    "incarnation": status["incarnation"],
                                    "recovered_after_seconds": status["recovered_after_seconds"],
                                }
                            )
                    continue
                merged.update(launch.report["counts"])
                wasted_cpu += launch.report.get("wasted_cpu_seconds", 0.0)
                fired.update(launch.report["faults_fired"])
                fired.update(launch.report.get("disk_faults_fired", {}))
                try:
                    run_audit = RunAudit.from_json(launch.report.get("audit"))
                except ValueError as error:
                    problems.append(f"{slot.name} #{launch.number}: {error}")
                    run_audit = RunAudit()
                leaks.extend(run_audit.leaks)
                problems.extend(launch.report["violations"])
                applied_twice += launch.report.get("effects_applied_twice", 0)
                for name in ("counted", "sent"):
                    proposal_attempts[name] += run_audit.figures.get(f"proposal attempts {name}", 0)
                if launch.number > 1:
                    recovery.append(
                        {
                            "coordinator": slot.name,
                            "incarnation": launch.report["incarnation"],
                            "recovered_after_seconds": launch.report["recovered_after_seconds"],
                        }
                    )
        kills = [e for e in self.events if e["event"] == "killed"]
        if any(slot.dead_for_good for slot in self.slots):
            fired["killed-for-good"] += 1
        if any(launch.hang for slot in self.slots for launch in slot.launches):
            fired[FaultPoint.WORKER_HUNG.value] += 1
        simulated: dict[str, Any] = {}
        if simulate_report.exists():
            simulated = json.loads(simulate_report.read_text())
            for name, count in simulated.get("faults_fired", {}).items():
                fired[f"simulated {name}"] += count
            if simulated.get("violations"):
                problems.append(f"simulate found {simulated['violations']} violating schedules")
        elif config.simulate_schedules > 0:
            problems.append("the simulate run wrote no report")
        requested = {point.value for point in config.faults} | {
            stage.value for stage in config.kill_stages
        }
        unfired = sorted(name for name in requested if not fired.get(name))
        problems.extend(self.crashes)
        elapsed = self.elapsed()
        done = statuses.get("done", 0)
        passed = not problems and not leaks and applied_twice == 0 and not unfired
        return {
            "passed": passed,
            "seconds": round(elapsed, 2),
            "coordinators": config.coordinators,
            "ranks_per_coordinator": config.ranks,
            "items": config.items,
            "results_committed": done,
            "throughput_items_per_second": round(done / elapsed, 2) if elapsed else None,
            "dispatches": merged["dispatches"],
            "store": dict(sorted(statuses.items())),
            "faults_fired": dict(sorted(fired.items())),
            "requested_faults_not_fired": unfired,
            "leaks": [str(leak) for leak in leaks],
            # Per resource kind (leases, targets, shards, bandit tokens,
            # algorithm tokens, pairings, proposal states, dispatch log, ...).
            "leaks_per_resource": dict(Counter(leak.resource for leak in leaks)),
            "duplicate_execution_cpu_seconds": round(wasted_cpu, 4),
            "worker_object_misses_or_task_errors": merged["task errors"],
            "leaked_claims_in_store": statuses.get("claimed", 0),
            "left_committing_in_store": statuses.get("committing", 0),
            "stale_or_duplicate_results_dropped": merged["stale or duplicate results dropped"],
            "effects_applied_twice": applied_twice,
            "triage_reruns": merged["triage retries"],
            "items_rolled_forward_by_a_peer": merged["rolled forward for a peer"],
            "items_rolled_forward_by_a_restart": merged["rolled forward"],
            "recovery": recovery,
            "proposal_attempts_of_finished_incarnations": dict(proposal_attempts),
            "derived_from_disk": derived,
            "kills": kills,
            "consistency_problems": problems,
            "coordinator_counts": dict(sorted(merged.items())),
            "simulate": {key: simulated.get(key) for key in ("schedules", "violations", "seconds")},
            "events": self.events,
            "progress": self.progress,
            "note": "counts of a job killed before it reported died with it; "
            "store, results and consistency are re-derived from disk",
        }

    def picture(self) -> str | None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            from matplotlib.lines import Line2D
        except ImportError:
            return None
        times = [t for t, _ in self.progress]
        done = [d for _, d in self.progress]
        rates = [0.0] + [
            (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0
            for (t0, d0), (t1, d1) in zip(self.progress, self.progress[1:], strict=False)
        ]
        figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        top.plot(times, done, color="tab:blue")
        top.set_ylabel("results triaged")
        top.set_title("dispatchtx campaign: progress, faults and recovery")
        bottom.plot(times, rates, color="tab:green")
        bottom.set_ylabel("results/s")
        bottom.set_xlabel("seconds")
        colors = {
            "killed": "tab:red",
            "start": "tab:gray",
            "killed for good": "black",
            "finished": "tab:purple",
        }
        for event in self.events:
            color = colors.get(event["event"])
            if color is None:
                continue
            for axis in (top, bottom):
                axis.axvline(event["t"], color=color, alpha=0.5, linewidth=1)
        handles = [Line2D([0], [0], color=color, label=label) for label, color in colors.items()]
        top.legend(handles=handles, loc="lower right", fontsize="small")
        path = self.out_path("campaign.png")
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return str(path)


def run_campaign(config: CampaignConfig) -> dict[str, Any]:
    return Campaign(config).run()


def print_report(report: dict[str, Any]) -> None:
    print("dispatchtx campaign")
    for key in (
        "seconds",
        "coordinators",
        "items",
        "results_committed",
        "throughput_items_per_second",
        "dispatches",
        "leaked_claims_in_store",
        "left_committing_in_store",
        "stale_or_duplicate_results_dropped",
        "effects_applied_twice",
        "triage_reruns",
        "items_rolled_forward_by_a_peer",
        "items_rolled_forward_by_a_restart",
        "duplicate_execution_cpu_seconds",
        "worker_object_misses_or_task_errors",
    ):
        print(f"  {key:<40}{report[key]}")
    print(f"  {'leaks':<40}{len(report['leaks'])}")
    print("  faults fired:")
    for name, count in report["faults_fired"].items():
        print(f"    {name:<44}{count}")
    for entry in report["recovery"]:
        print(
            f"  recovery of {entry['coordinator']} incarnation {entry['incarnation']}: "
            f"{entry['recovered_after_seconds']} s"
        )
    for problem in report["consistency_problems"][:10]:
        print(f"  PROBLEM: {problem}")
    if report["requested_faults_not_fired"]:
        print(f"  requested but not fired: {', '.join(report['requested_faults_not_fired'])}")
    if report.get("picture"):
        print(f"  picture: {report['picture']}")
    print("PASSED" if report["passed"] else "FAILED")
