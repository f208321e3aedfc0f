"""`python -m dispatchtx COMMAND`: the jobs of dispatchtx."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dispatchtx", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    example = commands.add_parser(
        "example", help="a self-checking coordinator loop over real MPI ranks, with faults"
    )
    example.add_argument("--ranks", type=int, default=3, help="MPI ranks (coordinator + workers)")
    example.add_argument("--tasks", type=int, default=500)
    example.add_argument("--fault-every", type=int, default=7)
    example.add_argument("--timeout", type=float, default=300.0)
    simulate = commands.add_parser(
        "simulate", help="randomized fault schedules over the simulated system"
    )
    simulate.add_argument("--schedules", type=int, default=1000)
    simulate.add_argument("--seed", type=int, default=0)
    simulate.add_argument("--json", help="write the report to this file")
    campaign = commands.add_parser(
        "campaign", help="the main job: a real MPI fault campaign with several coordinators"
    )
    campaign.add_argument("--out", default="campaign-out", help="directory for everything")
    campaign.add_argument("--coordinators", type=int, default=2)
    campaign.add_argument("--ranks", type=int, default=3, help="per coordinator (1 + workers)")
    campaign.add_argument("--items", type=int, default=200, help="the work budget")
    campaign.add_argument(
        "--batches-per-seed",
        type=int,
        default=2,
        help="fuzz: mutation batches per seed (more makes a longer campaign)",
    )
    campaign.add_argument("--max-in-flight", type=int, default=2)
    campaign.add_argument(
        "--faults",
        default="all",
        help="fault points fired by rate: 'all', 'none' or a comma list (kills are scheduled)",
    )
    campaign.add_argument("--rate", type=float, default=0.03, help="per visit, for each point")
    campaign.add_argument("--disk-fault-rate", type=float, default=0.002)
    campaign.add_argument("--simulate-schedules", type=int, default=200)
    campaign.add_argument("--seed", type=int, default=0)
    campaign.add_argument("--timeout", type=float, default=600.0)
    campaign.add_argument("--no-picture", action="store_true")
    campaign.add_argument(
        "--workload",
        choices=("fuzz", "hash"),
        default="fuzz",
        help="fuzz: coverage-guided fuzzing over bundled targets (every resource kind); "
        "hash: a small self-checking workload",
    )
    commands.add_parser(
        "bench",
        help="figures: core, scaling, real MPI, the durable path, journal and store "
        "(`dispatchtx bench --help` for its options)",
    )
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["bench"]:
        from dispatchtx.jobs import bench as benchmark

        return benchmark.main(arguments[1:])
    args = parser.parse_args(arguments)

    if args.command == "campaign":
        from pathlib import Path

        from dispatchtx.coordinator.faults import FaultPoint
        from dispatchtx.jobs.campaign.runner import (
            RATE_POINTS,
            CampaignConfig,
            print_report,
            run_campaign,
        )

        if args.faults == "all":
            faults = RATE_POINTS
        elif args.faults == "none":
            faults = ()
        else:
            try:
                faults = tuple(FaultPoint(name.strip()) for name in args.faults.split(","))
            except ValueError as error:
                parser.error(str(error))
        config = CampaignConfig(
            out=Path(args.out),
            coordinators=args.coordinators,
            ranks=args.ranks,
            items=args.items,
            max_in_flight=args.max_in_flight,
            rate=args.rate,
            faults=faults,
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

        if args.ranks < 2:
            parser.error("--ranks must be at least 2")
        return run_job(
            args.ranks,
            "dispatchtx.jobs.example",
            ["--tasks", str(args.tasks), "--fault-every", str(args.fault_every)],
            timeout=args.timeout,
        )
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
