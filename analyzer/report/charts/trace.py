"""Profiler charts per rank and per profiled step: the profiler plugin's step-time overview,
GPU idle share as a rank × step heatmap, and memory from the traces' allocator events
(timeline and top allocating ops). Built from the summary's ``gpu_time`` rows (no query
again) and ``gpu.memory``."""

from __future__ import annotations

from statistics import median
from typing import Any

from ...gpu.memory import memory_timeline, top_allocating_ops
from ...gpu.overview import CATEGORIES
from ..context import ReportContext
from ..downsample import num
from ..figures import BLUE, GREEN, GREY, ORANGE, PALETTE, PURPLE, RED, TEAL, Chart, figure, short

_COLOURS = dict(zip((*CATEGORIES, "other"),
                    (GREEN, ORANGE, "#f59e0b", RED, PURPLE, TEAL, BLUE, GREY), strict=True))
_LABELS = {"dataloader": "data loader", "cpu_exec": "CPU exec"}
MAX_LINES = 8
"""Memory series drawn at most (the highest peaks)."""


def trace_charts(ctx: ReportContext) -> list[Chart]:
    """Overview per step, idle heatmap (≥ 2 ranks or steps), memory from traces."""
    charts = [c for c in (_overview(ctx.gpu_time), _idle_heatmap(ctx.gpu_time)) if c]
    charts += _memory(ctx)
    return charts


def _overview(gpu: list[dict[str, Any]]) -> Chart | None:
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in gpu:
        for s in r.get("steps") or []:
            if s.get("overview"):
                by_step.setdefault(s["step"], []).append(s["overview"])
    if not by_step:
        return None
    steps = sorted(by_step)
    traces = []
    for cat in (*CATEGORIES, "other"):
        ys = [median(o[f"{cat}_us"] for o in by_step[s]) / 1e3 for s in steps]
        if not any(ys):
            continue
        name = _LABELS.get(cat, cat)
        traces.append({"type": "bar", "name": name, "x": [str(s) for s in steps],
                       "y": [num(y, 4) for y in ys], "marker": {"color": _COLOURS[cat]},
                       "hovertemplate": "step %{x}<br>" + name + " %{y:.4g} ms<extra></extra>"})
    ranks = len(gpu)
    fig = figure(traces, xtitle="profiled step", ytitle="time (ms)", barmode="stack",
                 xaxis={"type": "category"})
    return Chart("profiler-overview", "Step time overview (profiler plugin)", fig,
                 "Each moment of a step counted once, under the first of: kernel > memcpy > "
                 "memset > communication > runtime > data loader > CPU exec > other"
                 + (f"; median over {ranks} ranks." if ranks > 1 else "."), wide=False)


def _idle_heatmap(gpu: list[dict[str, Any]]) -> Chart | None:
    cells = {(r["rank"], s["step"]): 100.0 * s["idle_us"] / s["total_us"]
             for r in gpu for s in r.get("steps") or [] if s.get("total_us")}
    ranks = sorted({k[0] for k in cells})
    steps = sorted({k[1] for k in cells})
    if len(cells) < 2:
        return None
    z = [[num(cells.get((rk, st)), 3) for st in steps] for rk in ranks]
    trace = {"type": "heatmap", "x": [str(s) for s in steps], "y": ranks, "z": z,
             "colorscale": "YlOrRd", "reversescale": True, "zmin": 0, "zmax": 100,
             "colorbar": {"title": {"text": "idle %"}},
             "hovertemplate": "rank %{y}, step %{x}<br>GPU idle %{z:.1f}%<extra></extra>"}
    worst = max(cells, key=lambda k: cells[k])
    fig = figure([trace], xtitle="profiled step", ytitle="rank",
                 xaxis={"type": "category"}, height=min(700, max(260, 80 + 3 * len(ranks))))
    return Chart("profiler-steps", "GPU idle per rank and step", fig,
                 f"Idle share of each step's GPU span (HTA definitions); highest: rank "
                 f"{worst[0]} step {worst[1]}, {cells[worst]:.1f}%.", wide=False)


def _memory(ctx: ReportContext) -> list[Chart]:
    series = memory_timeline(ctx.con)
    if not series:
        return []
    series.sort(key=lambda s: -s["peak_allocated"])
    shown = series[:MAX_LINES]
    traces = []
    for i, s in enumerate(shown):
        xs = [p[0] for p in s["points"]]
        traces.append({"type": "scatter", "mode": "lines", "name": f"rank {s['rank']} "
                       f"{s['device']}", "x": xs, "y": [num((p[1] or 0) / 2**20, 4)
                                                        for p in s["points"]],
                       "line": {"color": PALETTE[i % len(PALETTE)], "width": 1.5},
                       "hovertemplate": "%{x:.4g} ms<br>%{y:.4g} MiB allocated<extra></extra>"})
    top = shown[0]
    caption = (f"Allocator events of the traces (profile_memory=True); peak "
               f"{top['peak_allocated'] / 2**20:.1f} MiB allocated on rank {top['rank']} "
               f"{top['device']}" + (f"; {len(series) - len(shown)} more series not drawn."
                                     if len(series) > len(shown) else "."))
    charts = [Chart("trace-memory", "Memory over the profiled time", figure(
        traces, xtitle="time since the first allocation event (ms)",
        ytitle="allocated (MiB)"), caption, wide=False)]
    ops = top_allocating_ops(ctx.con, 15)[::-1]
    if ops:
        bar = {"type": "bar", "orientation": "h", "x": [num(o["bytes"] / 2**20, 4) for o in ops],
               "y": [short(f"{o['op']} ({o['device']})", 60) for o in ops],
               "marker": {"color": ORANGE}, "customdata": [o["allocations"] for o in ops],
               "hovertemplate": "%{y}<br>%{x:.4g} MiB in %{customdata:,} allocations"
                                "<extra></extra>"}
        charts.append(Chart("trace-allocs", "Top allocating ops", figure(
            [bar], xtitle="allocated (MiB, all profiled steps and ranks)", ytitle="op",
            yaxis={"automargin": True, "tickfont": {"size": 10}}, showlegend=False,
            height=max(260, 60 + 24 * len(ops))),
            "Each allocation charged to the innermost CPU op around it.", wide=False))
    return charts
