"""Charts of the compare page: the two runs overlaid (loss, gradient norm, step time, memory),
the step-time distributions and the GPU time breakdown side by side. Series are bounded in
DuckDB like the report's (``downsample``): a 1M-step run embeds the same few hundred points.
Base is blue, new is orange, in every chart."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..report.downsample import bucket_rows, envelopes, num
from ..report.figures import BLUE, ORANGE, Chart, esc, figure, line, log_axis, time_unit
from ..run.catalog import Run

BUCKETS = 400
"""Buckets per run per line chart (min and max kept per bucket for loss and norms)."""
BINS = 40
"""Bins of the step-time histograms (shared edges, so the two runs line up)."""
COLOURS = (BLUE, ORANGE)
LOG_SPAN = 20.0


def _rank(run: Run) -> int:
    (r,) = run.con.execute("SELECT min(rank) FROM steps").fetchone()
    return 0 if r is None else int(r)


def _log_if_wide(fig: dict[str, Any], ys: list[Any]) -> bool:
    vals = [v for v in ys if v is not None and math.isfinite(v)]
    if vals and min(vals) > 0 and max(vals) / min(vals) >= LOG_SPAN:
        fig["layout"]["yaxis"].update(log_axis(vals))
        return True
    return False


def _overlay(runs: list[tuple[str, Run]], col: str, anchor: str, title: str, ytitle: str,
             caption: str) -> Chart | None:
    traces, ys = [], []
    for (label, run), colour in zip(runs, COLOURS, strict=True):
        env = envelopes(run.con, "steps", "step", [col], where="rank = ?",
                        params=[_rank(run)], n=BUCKETS)[col]
        if not env:
            continue
        ys += env.y
        traces.append(line(env.x, env.y, esc(label), colour,
                           hover=f"{esc(label)}<br>step %{{x}}<br>{ytitle} %{{y:.4g}}"
                                 "<extra></extra>"))
    if not traces:
        return None
    fig = figure(traces, xtitle="step", ytitle=ytitle)
    if _log_if_wide(fig, ys):
        caption += " Log scale: the values span more than an order of magnitude."
    return Chart(anchor, title, fig, caption, wide=False)


def step_time_chart(runs: list[tuple[str, Run]]) -> Chart | None:
    rows = []
    for _, run in runs:
        rows.append(bucket_rows(run.con, "steps", "step", {"y": "median(duration_s)"},
                                where="rank = ? AND isfinite(duration_s)",
                                params=[_rank(run)], n=BUCKETS // 2))
    typical = [r["y"] for rs in rows for r in rs if r["y"] is not None]
    if not typical:
        return None
    mult, unit = time_unit(float(np.median(typical)))
    traces = [line([r["x"] for r in rs], [num(r["y"] * mult) for r in rs], esc(label), colour,
                   hover=f"{esc(label)}<br>from step %{{x}}<br>median %{{y:.4g}} {unit}"
                         "<extra></extra>")
              for (label, _), rs, colour in zip(runs, rows, COLOURS, strict=True) if rs]
    return Chart("cmp-step-time", "Step time", figure(traces, xtitle="step",
                                                      ytitle=f"step time ({unit})"),
                 "The median step time of each range of steps.", wide=False)


def step_time_histogram(runs: list[tuple[str, Run]]) -> Chart | None:
    samples = []
    for _, run in runs:
        (vals,) = run.con.execute(
            "SELECT list(duration_s ORDER BY step) FROM steps WHERE rank = ? AND "
            "isfinite(duration_s)", [_rank(run)]).fetchone()
        x = np.asarray(vals or [], dtype=np.float64)
        samples.append(x[int(len(x) * 0.1):])  # steady state, as compare judges it
    both = np.concatenate(samples)
    if not len(both) or not all(len(s) for s in samples):
        return None
    lo, hi = np.percentile(both, [0.5, 99.5])
    if hi <= lo:
        hi = lo * 1.01 + 1e-9
    edges = np.linspace(lo, hi, BINS + 1)
    mult, unit = time_unit(float(np.median(both)))
    mids = [num(v * mult) for v in (edges[:-1] + edges[1:]) / 2]
    traces = []
    for (label, _), x, colour in zip(runs, samples, COLOURS, strict=True):
        counts, _ = np.histogram(np.clip(x, lo, hi), edges)
        traces.append({"type": "bar", "x": mids, "y": [num(c / len(x) * 100) for c in counts],
                       "name": esc(label), "marker": {"color": colour}, "opacity": 0.55,
                       "hovertemplate": f"{esc(label)}<br>%{{x:.4g}} {unit}: %{{y:.3g}}% of "
                                        "steps<extra></extra>"})
    fig = figure(traces, xtitle=f"step time ({unit})", ytitle="% of steps", barmode="overlay",
                 bargap=0.02)
    return Chart("cmp-step-dist", "Step-time distribution", fig,
                 "Steady-state steps (after the first 10%); the slowest and fastest 0.5% are "
                 "clipped to the edges.", wide=False)


def memory_chart(runs: list[tuple[str, Run]]) -> Chart | None:
    traces = []
    for (label, run), colour in zip(runs, COLOURS, strict=True):
        for col, what, dash in (("rss_bytes", "RSS", "solid"),
                                ("cuda_allocated_bytes", "CUDA allocated", "dot")):
            rs = bucket_rows(run.con, "memory", "step", {"y": f"max({col})"},
                             where="rank = ? AND step IS NOT NULL", params=[_rank(run)],
                             n=BUCKETS // 2)
            xs = [r["x"] for r in rs if r["y"] is not None]
            if not xs:
                continue
            t = line(xs, [num(r["y"] / 2**20) for r in rs if r["y"] is not None],
                     f"{esc(label)} {what}", colour,
                     hover=f"{esc(label)} {what}<br>step %{{x}}<br>%{{y:,.0f}} MiB"
                           "<extra></extra>")
            t["line"]["dash"] = dash
            traces.append(t)
    if not traces:
        return None
    return Chart("cmp-memory", "Memory", figure(traces, xtitle="step", ytitle="MiB"),
                 "Highest value in each range of steps (solid: host RSS; dotted: CUDA "
                 "allocated).", wide=False)


def gpu_chart(result: dict[str, Any], labels: tuple[str, str]) -> Chart | None:
    gpu = result.get("gpu_time")
    if not gpu:
        return None
    parts = (("compute_us", "computation"), ("non_compute_us", "communication, memory"),
             ("idle_us", "idle"))
    traces = [{"type": "bar", "name": esc(label), "marker": {"color": colour},
               "x": [p[1] for p in parts], "y": [num(gpu[side][k] / 1000) for k, _ in parts],
               "hovertemplate": f"{esc(label)}<br>%{{x}}: %{{y:.4g}} ms<extra></extra>"}
              for side, label, colour in zip(("base", "new"), labels, COLOURS, strict=True)]
    fig = figure(traces, xtitle="", ytitle=f"ms per {gpu['unit']}", barmode="group")
    return Chart("cmp-gpu", "GPU time breakdown", fig,
                 f"Per {gpu['unit']}, from the profiler traces (HTA's definitions).",
                 wide=False)


def compare_charts(base: Run, new: Run, labels: tuple[str, str],
                   result: dict[str, Any]) -> list[Chart]:
    runs = [(labels[0], base), (labels[1], new)]
    out = [
        _overlay(runs, "loss", "cmp-loss", "Loss", "loss",
                 "Each point is the lowest or highest loss in its range of steps."),
        _overlay(runs, "grad_norm", "cmp-grad-norm", "Gradient norm", "grad norm",
                 "Total gradient norm before clipping, lowest and highest per range."),
        step_time_chart(runs),
        step_time_histogram(runs),
        memory_chart(runs),
        gpu_chart(result, labels),
    ]
    return [c for c in out if c is not None]
