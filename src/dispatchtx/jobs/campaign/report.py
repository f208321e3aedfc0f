"""The campaign's report: what must hold, re-derived from disk, and how it
is printed (the budget and why the run ended; the faults fired, grouped as
the fault points of docs/design.md are, real MPI beside simulated)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchtx.coordinator.audit import RunAudit
from dispatchtx.coordinator.faults import FaultPoint
from dispatchtx.fs import RealClock, RealFS
from dispatchtx.jobs.workloads.fuzz import check_campaign_dir, committed_slots
from dispatchtx.jobs.workloads.hash import HashWorkload, result_name
from dispatchtx.resources import Leak
from dispatchtx.store import ItemState, ItemStatus, WorkStore

if TYPE_CHECKING:
    from dispatchtx.jobs.campaign.runner import Campaign, CampaignConfig

__all__ = ["FAULT_GROUPS", "build_report", "budget_and_end", "group_faults", "print_report"]

TIME_GROUP = "7. time"
# The seven groups of fault points in docs/design.md, and the names under
# which the campaign's jobs and the simulator count what they fired.
FAULT_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "1. send fails after a reservation, or the message does not build",
        (
            FaultPoint.SEND_AFTER_CLAIM.value,
            FaultPoint.SEND_AFTER_JOURNAL.value,
            FaultPoint.SEND_AFTER_RESERVATIONS.value,
            FaultPoint.MESSAGE_BUILD.value,
            FaultPoint.SEND.value,
            "transport-send-failure",
        ),
    ),
    (
        "2. send delivered, but the coordinator sees an exception",
        (FaultPoint.AMBIGUOUS_SEND.value, "transport-ambiguous-send"),
    ),
    (
        "3. a worker's answer comes late, twice, garbled, out of order or never",
        (
            FaultPoint.STALE_RESULT.value,
            FaultPoint.DUPLICATE_RESULT.value,
            "results-reordered",
            "result-lost",
            "result-garbled",
            FaultPoint.WORKER_HUNG.value,
            "worker-crash",
        ),
    ),
    (
        "4. the commit path fails, or the coordinator dies between its steps",
        (
            FaultPoint.BEGIN_COMMIT_EIO.value,
            FaultPoint.TRIAGE_EIO.value,
            FaultPoint.COMPLETE_EIO.value,
            FaultPoint.KILL_AFTER_STORE_COMMIT.value,
            FaultPoint.KILL_MID_TRIAGE.value,
            FaultPoint.KILL_AFTER_TRIAGE.value,
            FaultPoint.KILL_AFTER_COMPLETE.value,
            "coordinator-killed",
            "process-kill",
            "killed-for-good",
            "stop-signal-mid-dispatch",
        ),
    ),
    (
        "5. the first transfer of an object's content fails",
        (FaultPoint.OBJECT_TRANSFER.value,),
    ),
    (
        "6. the disk",
        (
            "disk-eio",
            "disk-enospc",
            "disk-short-write",
            "disk-estale",
            "disk-stale-absent",
            "disk-lost-link-reply",
            "disk-kill-before",
            "disk-kill-after",
            "journal-disk-eio",
            "journal-disk-enospc",
            "journal-disk-short-write",
            "journal-disk-estale",
            "journal-disk-stale-absent",
            "power-loss",
        ),
    ),
    (TIME_GROUP, ("coordinator-paused-in-begin-commit", "coordinator-paused-in-complete")),
)
# Group 7 fires only in the simulator (pauses); when nothing fired, say why.
TIME_GROUP_NOTE = (
    "none fired: each simulated host runs on its own skewed clock, and the simulator pauses "
    "a coordinator past its TTL in two-coordinator schedules; two live incarnations are held "
    "by the tests"
)
OTHER_GROUP = "other"


def group_faults(real_mpi: Mapping[str, int], simulated: Mapping[str, int]) -> list[dict[str, Any]]:
    """The faults fired, group by group in the design's order, each with its
    real-MPI and its simulated count. A name no group knows goes to "other"
    (never dropped); a name neither run fired is left out."""
    placed: set[str] = set()
    groups: list[dict[str, Any]] = []

    def row(name: str) -> dict[str, int]:
        return {"real_mpi": real_mpi.get(name, 0), "simulated": simulated.get(name, 0)}

    for title, names in FAULT_GROUPS:
        placed.update(names)
        fired = {name: row(name) for name in names if real_mpi.get(name) or simulated.get(name)}
        groups.append({"group": title, "faults": fired})
    others = sorted(
        name
        for name in {*real_mpi, *simulated}
        if name not in placed and (real_mpi.get(name) or simulated.get(name))
    )
    if others:
        groups.append({"group": OTHER_GROUP, "faults": {name: row(name) for name in others}})
    return groups


def budget_and_end(
    config: CampaignConfig,
    made: int,
    settled: int,
    timed_out: bool,
    refused: bool,
) -> tuple[str, str]:
    """What the work budget is, and why the run ended where it did: `made`
    items reached the store, `settled` of them are done or quarantined."""
    if config.workload == "fuzz":
        budget = (
            f"up to {config.items} work items per coordinator: {config.batches_per_seed} "
            "mutation batches for each seed, made only when a result brings a new seed"
        )
    else:
        budget = f"{config.items} work items, each coordinator dispatching all of them"
    if refused:
        return budget, "a coordinator refused its configuration before it started"
    if timed_out:
        return budget, (
            f"--timeout {config.timeout:.0f} s ran out with {settled} of {made} items settled"
        )
    if config.workload == "fuzz" and made < config.items:
        return budget, (
            f"the fuzzer ran dry: the results of the {made} items made brought no further "
            "seed, and every coordinator still running finished its work"
        )
    return budget, (
        f"the budget was spent: {made} items made, and every coordinator still running "
        "finished its work"
    )


def build_report(campaign: Campaign, simulate_report: Path) -> dict[str, Any]:
    """What must hold, re-derived from disk, with the jobs' own counts."""
    config = campaign.config
    store = WorkStore(RealFS(), str(campaign.store_dir), RealClock(), ttl=config.ttl)
    states = {state.work_id: state for state in store.items()}
    statuses = Counter(state.status.value for state in states.values())
    problems: list[str] = []
    derived: dict[str, Any] = {}
    if config.workload == "fuzz":
        check = check_campaign_dir(
            RealFS(), str(campaign.results_dir), committed=committed_slots(states.values())
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
    applied_twice = _check_hash_results(campaign, states, problems)
    merged: Counter[str] = Counter()
    wasted_cpu = 0.0
    proposal_attempts: Counter[str] = Counter()
    fired: Counter[str] = Counter()
    leaks: list[Leak] = []
    recovery: list[dict[str, Any]] = []
    for slot in campaign.slots:
        for launch in slot.launches:
            status_path = Path(f"{launch.report_path}.status")
            source = launch.report
            if source is None:
                # Killed: what it left behind just before the kill.
                if not status_path.exists():
                    continue
                source = json.loads(status_path.read_text())
            merged.update(source["counts"])
            wasted_cpu += source.get("wasted_cpu_seconds", 0.0)
            fired.update(source["faults_fired"])
            fired.update(source.get("disk_faults_fired", {}))
            if launch.number > 1 and source.get("recovered_after_seconds") is not None:
                recovery.append(
                    {
                        "coordinator": slot.name,
                        "incarnation": source["incarnation"],
                        "recovered_after_seconds": source["recovered_after_seconds"],
                    }
                )
            if launch.report is None:
                continue
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
    kills = [e for e in campaign.events if e["event"] == "killed"]
    if any(slot.dead_for_good for slot in campaign.slots):
        fired["killed-for-good"] += 1
    if any(launch.told_hang for slot in campaign.slots for launch in slot.launches):
        fired[FaultPoint.WORKER_HUNG.value] += 1
    simulated: dict[str, Any] = {}
    if simulate_report.exists():
        simulated = json.loads(simulate_report.read_text())
        if simulated.get("violations"):
            problems.append(f"simulate found {simulated['violations']} violating schedules")
    elif config.simulate_schedules > 0:
        problems.append("the simulate run wrote no report")
    simulated_fired: dict[str, int] = dict(simulated.get("faults_fired", {}))
    requested = {point.value for point in config.faults} | {
        stage.value for stage in config.kill_stages
    }
    unfired = sorted(name for name in requested if not fired.get(name))
    problems.extend(campaign.crashes)
    elapsed = campaign.elapsed()
    done = statuses.get("done", 0)
    settled = done + statuses.get("quarantined", 0)
    timed_out = any(e["event"] == "timeout" for e in campaign.events)
    refused = any(e["event"] == "refused" for e in campaign.events)
    budget, ended = budget_and_end(config, len(states), settled, timed_out, refused)
    passed = not problems and not leaks and applied_twice == 0 and not unfired
    return {
        "passed": passed,
        "seconds": round(elapsed, 2),
        "coordinators": config.coordinators,
        "ranks_per_coordinator": config.ranks,
        "items": config.items,
        "budget": budget,
        "items_made": len(states),
        "ended_because": ended,
        "results_committed": done,
        "throughput_items_per_second": round(done / elapsed, 2) if elapsed else None,
        "dispatches": merged["dispatches"],
        "store": dict(sorted(statuses.items())),
        # Real MPI only; the simulator's are under "simulate", both under
        # "faults_by_group".
        "faults_fired": dict(sorted(fired.items())),
        "faults_by_group": group_faults(fired, simulated_fired),
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
        "simulate": {
            **{key: simulated.get(key) for key in ("schedules", "violations", "seconds")},
            "faults_fired": simulated_fired,
        },
        "logs": str(campaign.logs_dir),
        "events": campaign.events,
        "progress": campaign.progress,
        "note": "counts of a job killed before it reported died with it; "
        "store, results and consistency are re-derived from disk",
    }


def _check_hash_results(
    campaign: Campaign, states: Mapping[str, ItemState], problems: list[str]
) -> int:
    """The hash workload's results, each checked against its expected
    content; returns the results triaged more than once."""
    config = campaign.config
    expected = HashWorkload(config.items if config.workload == "hash" else 0)
    files = set(os.listdir(campaign.results_dir))
    applied_twice = 0
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
            content = (campaign.results_dir / name).read_bytes()
            if content != item.encode() + b"\n" + expected.expected(item):
                problems.append(f"{item}: the triaged result is wrong")
        prefix = name.rsplit(".", 1)[0] + "."
        applied_twice += sum(1 for f in files if f.startswith(prefix) and f != name)
    return applied_twice


def print_report(report: dict[str, Any]) -> None:
    print("dispatchtx campaign")
    print(f"  {'budget':<40}{report['budget']}")
    print(f"  {'ended':<40}{report['ended_because']}")
    for key in (
        "seconds",
        "coordinators",
        "items_made",
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
    schedules = report["simulate"].get("schedules") or 0
    print(f"  faults fired, by group of points (docs/design.md); simulated: {schedules} schedules")
    print(f"  {'':<48}{'real MPI':>10}{'simulated':>11}")
    for group in report["faults_by_group"]:
        print(f"    {group['group']}")
        if not group["faults"]:
            note = TIME_GROUP_NOTE if group["group"] == TIME_GROUP else "none fired"
            print(f"      ({note})")
        for name, counts in group["faults"].items():
            print(f"      {name:<42}{counts['real_mpi']:>10}{counts['simulated']:>11}")
    for entry in report["recovery"]:
        print(
            f"  recovery of {entry['coordinator']} incarnation {entry['incarnation']}: "
            f"{entry['recovered_after_seconds'] * 1000:.0f} ms"
        )
    for problem in report["consistency_problems"][:10]:
        print(f"  PROBLEM: {problem}")
    if report["requested_faults_not_fired"]:
        print(f"  requested but not fired: {', '.join(report['requested_faults_not_fired'])}")
    print(f"  each job's launcher output: {report['logs']}")
    if report.get("picture"):
        print(f"  picture: {report['picture']}")
    print("PASSED" if report["passed"] else "FAILED")
