"""The targets (the core's of issue 12, the runtime's of issue 17), each met
or not by the figures of one run."""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------
# Targets
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
        real_fs = scaling.get("real_fs_row")
        if real_fs is not None:
            us = real_fs["us_per_item"]["median"]
            fs = real_fs.get("fs")
            floor = ""
            if fs is not None:
                floor = f" (its FS calls alone: {fs['us_per_item']:.0f} us"
                if fs.get("transport_us_per_item") is not None:
                    floor += f"; in the simulated transport: {fs['transport_us_per_item']:.0f} us"
                floor += ")"
            found.append(
                _target(
                    f"coordinator <= 60 us per committed item, store through RealFS on "
                    f"{real_fs.get('filesystem', 'tmpfs')}, {real_fs['workers']:,} simulated "
                    "workers",
                    f"{us:.0f} us{floor}",
                    us <= 60,
                )
            )
    mpi = figures.get("mpi")
    if mpi is not None and mpi["rows"]:
        rows = mpi["rows"]
        deepest = max(row["max_in_flight"] for row in rows)
        for label, key, threshold, chosen in (
            (
                "dispatchtx >= 0.9x the raw loop with the same polling, each rank count and depth",
                "dispatchtx_over_raw",
                0.9,
                rows,
            ),
            (
                f"dispatchtx >= 5x mpi4py.futures, each rank count at depth {deepest}",
                "dispatchtx_over_futures",
                5.0,
                [row for row in rows if row["max_in_flight"] == deepest],
            ),
            (
                "dispatchtx >= 0.5x the raw loop at its best policy, each rank count and depth",
                "dispatchtx_over_raw_best",
                0.5,
                rows,
            ),
        ):
            ratios = [row.get(key) for row in chosen]
            known = [ratio for ratio in ratios if ratio is not None]
            if not known:
                found.append(_target(label, "no figure", None))
                continue
            met = sum(ratio >= threshold for ratio in known)
            measured = (
                f"met at {met} of {len(ratios)} cells; ratios {min(known):.2f} .. {max(known):.2f}"
            )
            found.append(_target(label, measured, met == len(ratios)))
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
        batching = durable.get("batching") or {}
        depth = batching.get("max_in_flight")
        fsyncs = batching.get("default_fsyncs_per_item")
        if fsyncs is not None:
            found.append(
                _target(
                    f"durable path, depth {depth}, default settings: <= 1.0 fsync per "
                    "committed item",
                    f"{fsyncs:.2f} (counted in the "
                    f"{batching.get('default_fsyncs_counted_in', 'process')})",
                    fsyncs <= 1.0,
                )
            )
        over_tmpfs = batching.get("default_over_tmpfs")
        if "tmpfs" in batching:
            found.append(
                _target(
                    f"durable path, depth {depth}: >= 0.5x the same job with its store on tmpfs",
                    "no figure" if over_tmpfs is None else f"{over_tmpfs:.2f}x",
                    None if over_tmpfs is None else over_tmpfs >= 0.5,
                )
            )
    return found
