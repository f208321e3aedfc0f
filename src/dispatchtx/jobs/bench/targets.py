"""The targets of issue 12, each met or not by the figures of one run."""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------
# Targets (issue 12)
# ---------------------------------------------------------------------------


def _target(text: str, measured: str, met: bool | None) -> dict[str, Any]:
    return {"target": text, "measured": measured, "met": met}


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    core = figures.get("core")
    if core is not None and "compiled" in core["builds"]:
        speedup = core["speedup"]["lifecycle_ns"]
        found.append(
            _target("compiled lifecycle >= 3x faster than pure", f"{speedup:.2f}x", speedup >= 3)
        )
        compiled = core["builds"]["compiled"]
        ns = compiled["lifecycle_ns"]["median"]
        found.append(_target("compiled lifecycle <= 1 us", f"{ns:.0f} ns", ns <= 1000))
        size = compiled["bytes_per_in_flight_dispatch"]
        found.append(
            _target("<= 512 bytes per in-flight dispatch (compiled)", f"{size:.0f} B", size <= 512)
        )
    scaling = figures.get("scaling")
    if scaling is not None:
        rows = {row["workers"]: row for row in scaling["rows"]}
        first = scaling["rows"][0]["workers"]
        if 65_536 in rows:
            ratio = rows[65_536]["ratio_to_first"]
            found.append(
                _target(
                    f"per-dispatch cost at 65,536 workers <= 1.2x that at {first:,}",
                    f"{ratio:.2f}x",
                    ratio <= 1.2,
                )
            )
    mpi = figures.get("mpi")
    if mpi is not None:
        for label, key, threshold in (
            ("dispatchtx >= 90% of the raw mpi4py loop", "dispatchtx_over_raw", 0.9),
            ("dispatchtx >= 5x mpi4py.futures", "dispatchtx_over_futures", 5.0),
            ("dispatchtx beats the raw pickle loop outright", "dispatchtx_over_raw", 1.0),
        ):
            ratios = [row[key] for row in mpi["rows"]]
            known = [ratio for ratio in ratios if ratio is not None]
            if not known:
                found.append(_target(label, "no figure", None))
                continue
            met = sum(ratio >= threshold for ratio in known)
            measured = (
                f"met at {met} of {len(ratios)} (ranks, depth); "
                f"ratios {min(known):.2f} .. {max(known):.2f}"
            )
            found.append(
                _target(f"{label}, each rank count and depth", measured, met == len(ratios))
            )
    durable = figures.get("durable")
    if durable is not None:
        fraction = durable["fraction_of_bound"]
        found.append(
            _target(
                "durable path >= 50% of its fsync bound",
                "no figure" if fraction is None else f"{fraction:.0%}",
                None if fraction is None else fraction >= 0.5,
            )
        )
    return found
