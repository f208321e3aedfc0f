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
    args = parser.parse_args(argv)

    if args.command == "simulate":
        from dispatchtx import simulate as simulation

        return simulation.main(args.schedules, args.seed, args.json)

    if args.command == "example":
        from dispatchtx.launch import run_job

        if args.ranks < 2:
            parser.error("--ranks must be at least 2")
        return run_job(
            args.ranks,
            "dispatchtx.example",
            ["--tasks", str(args.tasks), "--fault-every", str(args.fault_every)],
            timeout=args.timeout,
        )
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
