"""The report's rank views. Up to MANY_RANKS ranks: one bar (median step split) and one
line (step time over the run) per rank. Past that, what people read on a big job: where each
rank's median step time lies among all ranks (one dot per rank, the outlying ones named), and
step time over the run as bands over the ranks (min–max, p5–p95, median) with only the
outlying ranks drawn as lines."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...run.held import MANY_RANKS
from ..context import ReportContext
from ..downsample import bucket_expr, bucket_rows, num, x_range
from ..figures import (
    BLUE,
    GREY,
    ORANGE,
    PALETTE,
    RED,
    Chart,
    figure,
    finding_markers,
    line,
    time_unit,
)

MAX_NAMED = 6
"""Outlying ranks drawn and named at most."""


def ranks_charts(ctx: ReportContext) -> list[Chart]:
    """Per-rank comparison, when ≥ 2 ranks."""
    if len(ctx.ranks) < 2:
        return []
    return _many_ranks(ctx) if len(ctx.ranks) > MANY_RANKS else _few_ranks(ctx)


def outlying_ranks(ctx: ReportContext, medians: dict[int, float]) -> list[int]:
    """Ranks whose median step time is ≥ 4 robust σ and ≥ 5% off the ranks' median, plus
    the ranks straggler findings name; the farthest first, at most MAX_NAMED."""
    v = np.array(list(medians.values()))
    centre = float(np.median(v))
    sigma = 1.4826 * float(np.median(np.abs(v - centre)))
    far = [r for r, m in medians.items()
           if abs(m - centre) >= max(4 * sigma, 0.05 * abs(centre)) and m > 0]
    named = [f.evidence.get("rank") for f in ctx.findings if f.id == "straggler"]
    out = [r for r in named if r in medians]
    out += sorted((r for r in far if r not in out), key=lambda r: -abs(medians[r] - centre))
    return out[:MAX_NAMED]


def _many_ranks(ctx: ReportContext) -> list[Chart]:
    rows = ctx.con.execute(
        "SELECT rank, median(duration_s), median(coalesce(data_wait_s, 0)) FROM steps "
        "WHERE isfinite(duration_s) GROUP BY rank ORDER BY rank").fetchall()
    if len(rows) < 2:
        return []
    medians = {int(r[0]): float(r[1]) for r in rows}
    mult, unit = time_unit(max(medians.values()))
    named = outlying_ranks(ctx, medians)
    dots = [
        {"type": "scatter", "mode": "markers", "name": "median step", "x": [r[0] for r in rows],
         "y": [num(r[1] * mult) for r in rows], "marker": {"color": BLUE, "size": 4},
         "hovertemplate": "rank %{x}<br>median step %{y:.3g} " + unit + "<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "median data wait",
         "x": [r[0] for r in rows], "y": [num(r[2] * mult) for r in rows],
         "marker": {"color": ORANGE, "size": 3},
         "hovertemplate": "rank %{x}<br>data wait %{y:.3g} " + unit + "<extra></extra>"},
    ]
    notes = [{"x": r, "y": num(medians[r] * mult), "text": f"rank {r}", "showarrow": True,
              "arrowhead": 0, "ax": 0, "ay": -24, "font": {"color": RED}} for r in named]
    centre = float(np.median(list(medians.values())))
    caption = (f"{len(rows)} ranks; median of the ranks' median step times "
               f"{centre * mult:.3g} {unit}. "
               + (("Outlying: " + ", ".join(f"rank {r} ({medians[r] * mult:.3g} {unit}, "
                                            f"{100 * (medians[r] / centre - 1):+.0f}%)"
                                            for r in named) + ".") if named
                  else "No rank stands out."))
    spread = figure(dots, xtitle="rank", ytitle=f"median step time ({unit})", annotations=notes)
    bands = _bands(ctx, named, mult, unit)
    charts = [Chart("ranks", "Ranks: median step time", spread, caption, wide=False)]
    if bands is not None:
        charts.append(Chart("ranks-time", "Ranks: step time over the run", bands,
                            "Bands over all ranks per step bucket (min–max, p5–p95) and "
                            "their median; outlying ranks as lines.", wide=False))
    return charts


def _bands(ctx: ReportContext, named: list[int], mult: float, unit: str) -> dict | None:
    where = "isfinite(duration_s)"
    xr = x_range(ctx.con, "steps", "step", where, None)
    if xr is None:
        return None
    b = bucket_expr("step", xr[0], xr[1], 200)
    q = ctx.con.execute(
        f"WITH per AS (SELECT rank, {b} AS b, min(step) AS x, avg(duration_s) AS d "
        f"FROM steps WHERE {where} GROUP BY ALL) "
        "SELECT b, min(x), min(d), quantile_cont(d, 0.05), median(d), quantile_cont(d, 0.95), "
        "max(d) FROM per GROUP BY b ORDER BY b").fetchall()
    x = [r[1] for r in q]
    col = [[num(r[i] * mult) for r in q] for i in range(2, 7)]
    hover = "step %{x}<br>%{y:.3g} " + unit
    traces: list[dict[str, Any]] = [
        line(x, col[0], "min", GREY, hover=hover, width=0.5),
        line(x, col[4], "max", GREY, hover=hover, width=0.5, fill="tonexty",
             fillcolor="rgba(150,150,150,0.15)"),
        line(x, col[1], "p5", BLUE, hover=hover, width=0.5),
        line(x, col[3], "p95", BLUE, hover=hover, width=0.5, fill="tonexty",
             fillcolor="rgba(31,119,180,0.25)"),
        line(x, col[2], "median", BLUE, hover=hover, width=2),
    ]
    if named:
        series = bucket_rows(ctx.con, "steps", "step", {"d": "avg(duration_s)"},
                             where=f"{where} AND rank IN ({', '.join(map(str, named))})",
                             n=200, group="rank", xr=xr)
        for i, r in enumerate(named):
            pts = [s for s in series if s["g"] == r]
            traces.append(line([p["x"] for p in pts], [num(p["d"] * mult) for p in pts],
                               f"rank {r}", (RED, *PALETTE)[i % (len(PALETTE) + 1)],
                               hover=f"rank {r}<br>" + hover, width=1.5))
    shapes, notes = finding_markers(ctx.findings, "ranks")
    return figure(traces, xtitle="step", ytitle=f"step time ({unit}, average)",
                  shapes=shapes, annotations=notes)


def _few_ranks(ctx: ReportContext) -> list[Chart]:
    """One bar and one line per rank."""
    rows = ctx.con.execute(
        "SELECT rank, median(duration_s), median(coalesce(data_wait_s, 0)), "
        "quantile_cont(duration_s, 0.9), count(*) FROM steps WHERE isfinite(duration_s) "
        "GROUP BY rank ORDER BY rank").fetchall()
    if len(rows) < 2:
        return []
    mult, unit = time_unit(max(r[1] for r in rows))
    labels = [f"rank {r[0]}" for r in rows]
    traces = [
        {"type": "bar", "name": "data wait (median)", "x": labels,
         "y": [num(r[2] * mult) for r in rows], "marker": {"color": ORANGE},
         "hovertemplate": "%{x}<br>data wait %{y:.3g} " + unit + "<extra></extra>"},
        {"type": "bar", "name": "rest (median)", "x": labels,
         "y": [num((r[1] - r[2]) * mult) for r in rows], "marker": {"color": BLUE},
         "hovertemplate": "%{x}<br>other %{y:.3g} " + unit + "<extra></extra>"},
        {"type": "scatter", "mode": "markers", "name": "p90 step", "x": labels,
         "y": [num(r[3] * mult) for r in rows],
         "marker": {"color": RED, "symbol": "line-ew-open", "size": 18, "line": {"width": 2}},
         "hovertemplate": "%{x}<br>p90 %{y:.3g} " + unit + "<extra></extra>"},
    ]
    bars = figure(traces, xtitle="rank", ytitle=f"median step time ({unit})", barmode="stack")
    slowest = max(rows, key=lambda r: r[1])
    fastest = min(rows, key=lambda r: r[1])
    caption = (f"Slowest rank {slowest[0]} median {slowest[1] * mult:.3g} {unit}, fastest rank "
               f"{fastest[0]} {fastest[1] * mult:.3g} {unit}.")
    n = max(50, min(500, 4000 // len(rows)))
    series = bucket_rows(ctx.con, "steps", "step", {"d": "avg(duration_s)"},
                         where="isfinite(duration_s)", n=n, group="rank")
    lines = []
    for i, r in enumerate(rows):
        pts = [s for s in series if s["g"] == r[0]]
        lines.append(line([p["x"] for p in pts], [num(p["d"] * mult) for p in pts],
                          f"rank {r[0]}", PALETTE[i % len(PALETTE)],
                          hover="step %{x}<br>%{y:.3g} " + unit, width=1.2))
    shapes, notes = finding_markers(ctx.findings, "ranks")
    over_time = figure(lines, xtitle="step", ytitle=f"step time ({unit}, average)",
                       shapes=shapes, annotations=notes)
    return [Chart("ranks", "Ranks: median step time", bars, caption, wide=False),
            Chart("ranks-time", "Ranks: step time over the run", over_time, wide=False)]
