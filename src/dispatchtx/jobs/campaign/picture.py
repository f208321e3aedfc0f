"""The campaign's picture (campaign.png): progress against the budget, one
lane per coordinator with its incarnations, where each was killed and at
which commit stage, the hung worker, the stalls and their causes, and a
strip of the faults fired per second. Needs matplotlib (the `campaign`
extra); without it there is no picture and nothing else changes."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatchtx.jobs.campaign.runner import Campaign

__all__ = ["STALL_AFTER_SECONDS", "Stall", "draw_picture", "find_stalls", "stage_words"]

# No result triaged for this long, while work is left, is a stall.
STALL_AFTER_SECONDS = 2.0


def stage_words(stage: str) -> str:
    """A kill's fault point as words: "kill-after-store-commit" -> "after store commit"."""
    return stage.removeprefix("kill-").replace("-", " ")


# A last sample closer than this to the one before it is merged into that
# interval: a job's status lags by up to a second, so the faults of that second
# would read as a burst over a sliver of time.
SHORTEST_LAST_INTERVAL = 0.5


def fault_intervals(progress: Sequence[tuple[float, int, int]]) -> list[tuple[float, float, float]]:
    """(start, width, faults per second) of each interval between two
    progress samples (seconds, results, faults so far)."""
    points: list[tuple[float, int]] = []
    for t, _, f in progress:
        if points and t <= points[-1][0]:
            points[-1] = (points[-1][0], f)  # the same moment: its last count
        else:
            points.append((t, f))
    if len(points) >= 3 and points[-1][0] - points[-2][0] < SHORTEST_LAST_INTERVAL:
        del points[-2]
    return [
        (t0, t1 - t0, (f1 - f0) / (t1 - t0)) for (t0, f0), (t1, f1) in pairwise(points) if t1 > t0
    ]


@dataclass(frozen=True)
class Stall:
    start: float
    end: float
    cause: str


def find_stalls(
    progress: Sequence[Sequence[float]], events: Sequence[dict[str, Any]]
) -> list[Stall]:
    """Stretches of at least STALL_AFTER_SECONDS with no result triaged
    (`progress` holds (seconds, triaged, ...) samples), each with its cause:
    the last event at or before its start, or within it."""
    stalls: list[Stall] = []
    flat_since: float | None = None
    for (t0, done0, *_), (_, done1, *_) in pairwise(progress):
        if done1 == done0:
            flat_since = t0 if flat_since is None else flat_since
            continue
        if flat_since is not None and t0 - flat_since >= STALL_AFTER_SECONDS:
            stalls.append(_stall(flat_since, t0, events))
        flat_since = None
    last_t = progress[-1][0] if progress else 0.0
    if flat_since is not None and last_t - flat_since >= STALL_AFTER_SECONDS:
        stalls.append(_stall(flat_since, last_t, events))
    return stalls


def _stall(start: float, end: float, events: Sequence[dict[str, Any]]) -> Stall:
    """What the stall waited on: an effect still pending when it began (a
    killed coordinator not yet recovered, a hung worker not yet found, a
    coordinator killed for good whose claims a peer must wait out)."""
    pending: dict[str, dict[str, Any]] = {}
    for event in events:
        if event["t"] > end:
            break
        kind, name = event["event"], event["coordinator"]
        if kind in ("killed", "crashed", "stalled", "killed for good"):
            pending[name] = event
        elif kind in ("recovered", "finished") and event["t"] <= start:
            pending.pop(name, None)
    causes = []
    for name, event in pending.items():
        if event["event"] == "killed for good":
            causes.append(f"{name} killed for good: its claims expire before a peer takes them")
        elif event["event"] == "stalled":
            causes.append(f"{name} silent: killed as hung")
        else:
            causes.append(f"{name} restarting after its kill")
    return Stall(start, end, "; ".join(causes) or "no result triaged (no kill pending)")


def draw_picture(campaign: Campaign, report: dict[str, Any], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    progress = campaign.progress
    events = campaign.events
    times = [sample[0] for sample in progress]
    figure, (top, lanes, strip) = plt.subplots(
        3, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2, 1.3]}
    )
    # Progress against the budget, with the stalls and why they happened.
    top.plot(times, [sample[1] for sample in progress], color="tab:blue", label="results triaged")
    top.axhline(campaign.config.items, color="tab:gray", linestyle="--", linewidth=1)
    top.text(
        0,
        campaign.config.items,
        f" budget: up to {campaign.config.items} items per coordinator",
        va="bottom",
        fontsize="small",
        color="tab:gray",
    )
    top_of_plot = max(campaign.config.items, max((s[1] for s in progress), default=0)) * 1.12
    top.set_ylim(0, top_of_plot)
    made = report.get("items_made")
    if isinstance(made, int) and made < campaign.config.items:
        top.axhline(made, color="tab:blue", linestyle=":", linewidth=1)
        top.text(0, made, f" {made} items made: the fuzzer ran dry", va="bottom", fontsize="small")
    for stall in find_stalls(progress, events):
        top.axvspan(stall.start, stall.end, color="tab:orange", alpha=0.15)
        top.text(  # under the budget line, whose label starts at the left
            stall.start,
            campaign.config.items * 0.97,
            textwrap.fill(f"stall; pending: {stall.cause}", 30),
            va="top",
            fontsize="x-small",
        )
    top.set_ylabel("results triaged")
    verdict = "PASSED" if report.get("passed") else "FAILED"
    top.set_title(
        f"dispatchtx campaign: {verdict}, {report.get('results_committed')} results committed\n"
        f"ended: {report.get('ended_because')}",
        fontsize="medium",
    )
    _draw_lanes(campaign, lanes)
    # The faults fired per second, every kind, from what the jobs wrote.
    intervals = fault_intervals(progress)
    if intervals:
        strip.bar(
            [start for start, _, _ in intervals],
            [rate for _, _, rate in intervals],
            width=[width * 0.95 for _, width, _ in intervals],
            align="edge",
            color="tab:gray",
        )
    strip.set_ylabel("faults fired/s")
    strip.set_xlabel("seconds since the campaign started")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


def _draw_lanes(campaign: Campaign, axis: Any) -> None:
    """One lane per coordinator: a bar per incarnation, a mark per kill."""
    end = campaign.elapsed()
    names = [slot.name for slot in campaign.slots]
    for lane, slot in enumerate(campaign.slots):
        for launch in slot.launches:
            finish = launch.ended if launch.ended is not None else end
            color = "tab:blue" if launch.number % 2 else "tab:cyan"
            axis.broken_barh(
                [(launch.started, finish - launch.started)], (lane - 0.3, 0.6), color=color
            )
            axis.text(launch.started, lane, f" {launch.number}", va="center", fontsize="x-small")
    marks = {
        "killed": ("X", "tab:red"),
        "crashed": ("X", "tab:orange"),
        "killed for good": ("X", "black"),
        "stalled": ("s", "tab:purple"),
        "worker lost": ("v", "tab:orange"),
        "recovered": ("o", "tab:green"),
    }
    for event in campaign.events:
        mark = marks.get(event["event"])
        if mark is None or event["coordinator"] not in names:
            continue
        lane = names.index(event["coordinator"])
        axis.plot(event["t"], lane, marker=mark[0], color=mark[1], markersize=9, linestyle="")
        if event["event"] == "killed" and any(
            other["event"] == "killed for good" and other["coordinator"] == event["coordinator"]
            for other in campaign.events
        ):
            continue  # drawn as killed for good, with its stage
        label = {
            "killed": stage_words(event["detail"]),
            "killed for good": f"{event['detail']}, for good",
            "worker lost": f"worker {event['detail']} hung",
            "crashed": f"crash ({event['detail']})",
            "stalled": "stalled",
        }.get(event["event"])
        if label:
            axis.annotate(
                label,
                (event["t"], lane),
                xytext=(0, 9),
                textcoords="offset points",
                rotation=30,
                fontsize="x-small",
                color=mark[1],
            )
    axis.set_yticks(range(len(names)), names)
    axis.set_ylabel("coordinator\n(bar: incarnation)")
    axis.set_ylim(-0.7, len(names) + 0.4)
    axis.plot([], [], "X", color="tab:red", label="killed at a commit stage (planned)")
    axis.plot([], [], "o", color="tab:green", label="restarted, recovered")
    axis.plot([], [], "X", color="black", label="killed for good")
    axis.plot([], [], "X", color="tab:orange", label="crashed (not planned)")
    axis.plot([], [], "v", color="tab:orange", label="hung worker found")
    axis.legend(loc="upper right", fontsize="x-small", ncol=3)
