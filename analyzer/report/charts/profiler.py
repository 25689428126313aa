"""Profiler section of the report (only when the run has trace events): top CPU ops, top GPU
kernels, and the GPU time breakdown (from ``gputime``, HTA definitions)."""

from __future__ import annotations

from typing import Any

from ...gpu.vocabulary import KERNEL, KERNEL_SQL
from ..context import ReportContext
from ..downsample import num
from ..figures import BLUE, GREEN, GREY, ORANGE, PURPLE, RED, Chart, esc, figure, short
from .trace import trace_charts

TOP_N = 15
"""Ops / kernels shown in each top list."""


def profiler_charts(ctx: ReportContext) -> list[Chart]:
    """Top ops and kernels, GPU time and kernel types; empty without trace events."""
    if not ctx.scalar("SELECT count(*) FROM (SELECT 1 FROM trace_events LIMIT 1)"):
        return []
    charts: list[Chart] = []
    ops = _top(ctx, "cat = 'cpu_op'", "profiler", "Top CPU ops by total time", "op", BLUE,
               "Sum of the op's own span over all profiled steps and ranks (nested ops are "
               "counted in their parents too).")
    if ops:
        charts.append(ops)
    kernels = _top(ctx, f"cat = {KERNEL_SQL}", "profiler-kernels",
                   "Top GPU kernels by total time", KERNEL, PURPLE,
                   "Sum of kernel durations over all profiled steps, ranks and streams.")
    if kernels:
        charts.append(kernels)
    if ctx.gpu_time:
        charts.append(_gpu_time_chart(ctx.gpu_time))
    kb = _kernel_types(ctx)
    if kb:
        charts.append(kb)
    charts += trace_charts(ctx)
    if charts and charts[0].anchor != "profiler":
        # Findings link to 'profiler': make the first chart of the section carry it.
        charts[0].anchor = "profiler"
    return charts


def _top(ctx: ReportContext, where: str, anchor: str, title: str, what: str, colour: str,
         caption: str) -> Chart | None:
    rows = ctx.con.execute(
        f"SELECT name, sum(dur_us) AS t, count(*) AS n FROM trace_events "
        f"WHERE {where} AND dur_us IS NOT NULL AND name IS NOT NULL "
        f"GROUP BY name ORDER BY t DESC LIMIT {TOP_N}").fetchall()
    if not rows:
        return None
    rows = rows[::-1]  # plotly draws horizontal bars bottom-up: biggest on top
    mult, unit = (1e-3, "ms") if rows[-1][1] < 1e7 else (1e-6, "s")
    trace = {"type": "bar", "orientation": "h", "x": [num(r[1] * mult) for r in rows],
             "y": [short(r[0], 60) for r in rows], "marker": {"color": colour},
             "customdata": [[esc(r[0], 300), r[2]] for r in rows],
             "hovertemplate": "%{customdata[0]}<br>%{x:.4g} " + unit
                              + " in %{customdata[1]:,} calls<extra></extra>"}
    fig = figure([trace], xtitle=f"total time ({unit})", ytitle=what,
                 yaxis={"automargin": True, "tickfont": {"size": 10}},
                 height=max(260, 60 + 24 * len(rows)), showlegend=False)
    return Chart(anchor, title, fig, caption, wide=False)


def _gpu_time_chart(rows: list[dict[str, Any]]) -> Chart:
    labels = [f"rank {r['rank']}" for r in rows]
    parts = (("compute_us", "compute", GREEN), ("non_compute_us", "non-compute (comm, memcpy)",
                                                ORANGE), ("idle_us", "idle", GREY))
    traces = []
    for key, name, colour in parts:
        traces.append({
            "type": "bar", "name": name, "x": labels,
            "y": [num(100.0 * r[key] / r["total_us"], 4) for r in rows],
            "customdata": [num(r[key] / 1000.0, 4) for r in rows],
            "marker": {"color": colour},
            "hovertemplate": "%{x}<br>" + name + " %{y:.1f}% (%{customdata:.4g} ms)"
                             "<extra></extra>"})
    fig = figure(traces, xtitle="rank", ytitle="share of GPU time (%)", barmode="stack",
                 yaxis={"range": [0, 100]})
    idle = max(rows, key=lambda r: r["idle_us"] / r["total_us"])
    caption = (f"Holistic Trace Analysis definitions. Highest idle share: rank {idle['rank']} "
               f"{100.0 * idle['idle_us'] / idle['total_us']:.1f}% of "
               f"{idle['total_us'] / 1000.0:.4g} ms.")
    return Chart("gpu-time", "GPU time breakdown", fig, caption, wide=False)


def _kernel_types(ctx: ReportContext) -> Chart | None:
    from ...gpu.gputime import kernel_breakdown

    try:
        rows = kernel_breakdown(ctx.con)
    except Exception:
        return None
    if not rows:
        return None
    colours = {"computation": GREEN, "communication": RED, "memory": ORANGE, "other": GREY}
    ranks = sorted({r["rank"] for r in rows})
    traces = []
    for kind in ("computation", "communication", "memory", "other"):
        by_rank = {r["rank"]: r for r in rows if r.get("type") == kind}
        if not by_rank:
            continue
        traces.append({
            "type": "bar", "name": kind, "x": [f"rank {k}" for k in ranks],
            "y": [num(by_rank[k]["pct"], 4) if k in by_rank else 0 for k in ranks],
            "customdata": [num(by_rank[k]["total_us"] / 1000.0) if k in by_rank else 0
                           for k in ranks],
            "marker": {"color": colours[kind]},
            "hovertemplate": "%{x}<br>" + kind + " %{y:.1f}% of busy time"
                             " (%{customdata:.4g} ms)<extra></extra>"})
    # Grouped, not stacked: kernel types overlap in time (NCCL under compute), so the shares
    # of one rank can add up to more than 100%.
    fig = figure(traces, xtitle="rank", ytitle="share of GPU busy time (%)", barmode="group")
    return Chart("kernel-types", "GPU kernel time by type", fig,
                 "Communication: NCCL kernels; memory: memcpy/memset/DMA. Types can overlap "
                 "in time.", wide=False)
