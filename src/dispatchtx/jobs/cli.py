"""`python -m dispatchtx COMMAND`: the jobs of dispatchtx."""

from __future__ import annotations

import argparse
import shutil
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

from dispatchtx.coordinator.faults import FaultPoint
from dispatchtx.jobs.arguments import (
    DefaultsFormatter,
    JobParser,
    float_between,
    int_at_least,
    new_file,
    positive_float,
    refuse,
)


def fault_points(text: str) -> tuple[FaultPoint, ...]:
    """`all`, `none` or a comma list of the points fired by rate."""
    from dispatchtx.jobs.campaign.runner import RATE_POINTS

    if text == "all":
        return RATE_POINTS
    if text == "none":
        return ()
    points = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        try:
            point = FaultPoint(name)
        except ValueError:
            known = ", ".join(p.value for p in RATE_POINTS)
            raise argparse.ArgumentTypeError(
                f"unknown fault point {name!r}; the points fired by rate are: {known}"
            ) from None
        if point not in RATE_POINTS:
            raise argparse.ArgumentTypeError(
                f"{name!r} is not fired by rate (the campaign schedules kills and the hung "
                "worker itself)"
            )
        points.append(point)
    if not points:
        raise argparse.ArgumentTypeError("name at least one fault point, or 'none'")
    return tuple(points)


def parser() -> argparse.ArgumentParser:
    from dispatchtx import COMPILED, __version__

    top = JobParser(prog="dispatchtx", description=__doc__)
    top.add_argument(
        "--version",
        action="version",
        version=f"dispatchtx {__version__} ({'compiled' if COMPILED else 'pure'} core)",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=f"{summary}.\n\n{textwrap.fill(description, 79)}",
            formatter_class=DefaultsFormatter,
        )

    example = command(
        "example",
        "a self-checking coordinator loop over real MPI ranks, with faults",
        "Rank 0 dispatches --tasks tasks to the other ranks through the core alone, "
        "makes every --fault-every-th send fail, and checks that every task was "
        "committed once and every reservation given back.",
    )
    example.add_argument(
        "--ranks", type=int_at_least(2), default=3, help="MPI ranks (coordinator + workers)"
    )
    example.add_argument("--tasks", type=int_at_least(1), default=500, help="tasks to dispatch")
    example.add_argument(
        "--fault-every", type=int_at_least(1), default=7, help="every N-th send fails"
    )
    example.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds before the job is killed"
    )
    simulate = command(
        "simulate",
        "randomized fault schedules over the simulated system",
        "Each schedule runs coordinators, workers, the store and the journal on a "
        "simulated disk, network and clock, draws faults at every fault point (power "
        "loss, stale look-ups, kills, hung workers, ...) and checks the invariants after.",
    )
    simulate.add_argument(
        "--schedules", type=int_at_least(1), default=1000, help="how many schedules to run"
    )
    simulate.add_argument("--seed", type=int, default=0, help="the first schedule's seed")
    simulate.add_argument("--json", type=new_file, help="also write the report to this file")
    campaign = command(
        "campaign",
        "the main job: a real MPI fault campaign with several coordinators",
        "Coordinators share one store on the real disk, each its own mpiexec job; the "
        "campaign fires fault points by rate, kills coordinators at each commit stage "
        "and restarts them, kills one for good, hangs a worker, then re-derives from "
        "disk what must hold and writes a report and a picture under --out.",
    )
    campaign.add_argument(
        "--out",
        default="campaign-out",
        help="directory for everything (absent or empty, unless --replace)",
    )
    campaign.add_argument(
        "--replace",
        action="store_true",
        help="remove an earlier campaign's --out before starting",
    )
    campaign.add_argument(
        "--coordinators", type=int_at_least(1), default=2, help="coordinators on the one store"
    )
    campaign.add_argument(
        "--ranks",
        type=int_at_least(2),
        default=3,
        help="MPI ranks per coordinator (the coordinator and its workers)",
    )
    campaign.add_argument(
        "--items", type=int_at_least(1), default=200, help="the work budget: items to dispatch"
    )
    campaign.add_argument(
        "--batches-per-seed",
        type=int_at_least(1),
        default=2,
        help="fuzz: mutation batches per seed (more makes a longer campaign)",
    )
    campaign.add_argument(
        "--max-in-flight", type=int_at_least(1), default=2, help="dispatches per worker at once"
    )
    campaign.add_argument(
        "--faults",
        type=fault_points,
        default="all",
        help="fault points fired by rate: 'all', 'none' or a comma list (kills are scheduled)",
    )
    campaign.add_argument(
        "--rate", type=float_between(0.0, 1.0), default=0.03, help="per visit, for each point"
    )
    campaign.add_argument(
        "--disk-fault-rate",
        type=float_between(0.0, 1.0),
        default=0.002,
        help="share of the store's and journals' FS calls that fail",
    )
    campaign.add_argument(
        "--simulate-schedules",
        type=int_at_least(0),
        default=200,
        help="simulated schedules run beside the campaign (0: none)",
    )
    campaign.add_argument("--seed", type=int, default=0, help="seeds every random choice")
    campaign.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds before the campaign ends"
    )
    campaign.add_argument("--no-picture", action="store_true", help="do not draw campaign.png")
    campaign.add_argument(
        "--workload",
        choices=("fuzz", "hash"),
        default="fuzz",
        help="fuzz: coverage-guided fuzzing over bundled targets (every resource kind); "
        "hash: a small self-checking workload",
    )
    command(
        "bench",
        "figures: core, scaling, real MPI, the durable path, journal and store",
        "`dispatchtx bench --help` shows its options.",
    )
    return top


def campaign_out(out: Path, replace: bool) -> None:
    """Refuse an --out that would mix an earlier run into this one's report."""
    from dispatchtx.jobs.campaign.runner import MARKER

    def error(message: str) -> NoReturn:
        refuse("dispatchtx campaign", message)

    if out.exists() and not out.is_dir():
        error(f"--out {out} is a file, not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not replace:
        error(
            f"--out {out} is not empty (an earlier run?): pass --replace to start it afresh, "
            "or choose another --out"
        )
    if not (out / MARKER).exists():
        error(f"--out {out} was not made by a campaign: not removing it, choose another")
    shutil.rmtree(out)


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["bench"]:
        from dispatchtx.jobs import bench as benchmark

        return benchmark.main(arguments[1:])
    top = parser()
    args = top.parse_args(arguments)

    if args.command == "campaign":
        from dispatchtx.jobs.campaign.report import print_report
        from dispatchtx.jobs.campaign.runner import CampaignConfig, run_campaign

        campaign_out(Path(args.out), args.replace)
        config = CampaignConfig(
            out=Path(args.out),
            coordinators=args.coordinators,
            ranks=args.ranks,
            items=args.items,
            max_in_flight=args.max_in_flight,
            rate=args.rate,
            faults=args.faults,
            disk_fault_rate=args.disk_fault_rate,
            simulate_schedules=args.simulate_schedules,
            seed=args.seed,
            timeout=args.timeout,
            picture=not args.no_picture,
            kill_one_for_good=args.coordinators > 1,
            workload=args.workload,
            batches_per_seed=args.batches_per_seed,
        )
        report = run_campaign(config)
        print_report(report)
        return 0 if report["passed"] else 1

    if args.command == "simulate":
        from dispatchtx.jobs import simulate as simulation

        return simulation.main(args.schedules, args.seed, args.json)

    if args.command == "example":
        from dispatchtx.launch import run_job

        return run_job(
            args.ranks,
            "dispatchtx.jobs.example",
            ["--tasks", str(args.tasks), "--fault-every", str(args.fault_every)],
            timeout=args.timeout,
        )
    top.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
