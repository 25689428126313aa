"""Performance charts of the report: step time (data wait vs the rest, outliers), memory
(with the leak fit and projected OOM), per-rank comparison and host utilisation."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...diagnosis.findings import Finding
from ..context import ReportContext
from ..downsample import bucket_rows, envelopes, num
from ..figures import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    RED,
    TEAL,
    Chart,
    figure,
    finding_markers,
    line,
    time_unit,
)
from .ranks import ranks_charts
from .throughput import throughput_chart

MAX_OUTLIERS = 300
"""Slowest outlier steps marked on the step-time chart."""
OUTLIER_MADS = 6.0
"""A step is an outlier above median + OUTLIER_MADS × 1.4826 × MAD (and 20% above median)."""


def perf_charts(ctx: ReportContext) -> list[Chart]:
    charts: list[Chart] = []
    for build in (step_time_chart, throughput_chart, memory_chart, ranks_charts, system_chart):
        out = build(ctx)
        if isinstance(out, list):
            charts.extend(out)
        elif out is not None:
            charts.append(out)
    return charts


def step_time_chart(ctx: ReportContext) -> Chart | None:
    ok = "rank = ? AND isfinite(duration_s)"
    stats = ctx.con.execute(
        f"SELECT median(duration_s), count(data_wait_s), count(*) FROM steps WHERE {ok}",
        [ctx.rank]).fetchone()
    if stats is None or not stats[2]:
        return None
    med, has_wait = float(stats[0]), bool(stats[1])
    mad = ctx.scalar(f"SELECT median(abs(duration_s - ?)) FROM steps WHERE {ok}",
                     [med, ctx.rank]) or 0.0
    mult, unit = time_unit(med)
    rows = bucket_rows(
        ctx.con, "steps", "step",
        {"wait": "avg(coalesce(data_wait_s, 0))",
         "rest": "avg(duration_s - coalesce(data_wait_s, 0))",
         "hi": "max(duration_s)", "xhi": "arg_max(step, duration_s)"},
        where=ok, params=[ctx.rank], n=ctx.buckets)
    xs = [r["x"] for r in rows]
    traces: list[dict[str, Any]] = []
    hover = "step %{x}<br>%{y:.3g} " + unit
    if has_wait:
        traces.append(line(xs, [num(r["wait"] * mult) for r in rows], "data wait", ORANGE,
                           hover=hover + " waiting for data", stackgroup="t",
                           fillcolor="rgba(234,88,12,0.45)"))
    traces.append(line(xs, [num(r["rest"] * mult) for r in rows],
                       "compute + rest" if has_wait else "step time", BLUE,
                       hover=hover + (" other work" if has_wait else ""), stackgroup="t",
                       fillcolor="rgba(37,99,235,0.35)"))
    # The bucket averages hide single slow steps; the bucket maxima keep them visible.
    traces.append(line([r["xhi"] for r in rows], [num(r["hi"] * mult) for r in rows],
                       "slowest step in range", GREY, width=1,
                       hover="step %{x}<br>%{y:.3g} " + unit + "<extra>slowest</extra>",
                       opacity=0.7))
    # The step_time_outlier detector's own rule (same steps left out, same threshold), so
    # the caption's count is the finding's.
    from ...diagnosis.detectors import step_time_outlier as sto
    from ...stats.steptime import outliers

    cols = ctx.con.execute(f"SELECT step, duration_s FROM steps WHERE {ok} ORDER BY step",
                           [ctx.rank]).fetchnumpy()
    rule = outliers(np.asarray(cols["step"], np.int64),
                        np.asarray(cols["duration_s"], np.float64),
                        ctx.knobs, sto.DEFAULTS)
    outlier = ctx.finding("step_time_outlier")
    ev = outlier.evidence if outlier is not None else {}
    threshold = float(ev["threshold_s"]) if isinstance(ev.get("threshold_s"), (int, float)) \
        else (rule["threshold"] if rule else max(med + OUTLIER_MADS * 1.4826 * mad, 2 * med))
    if rule is not None:
        rule["mask"] = rule["sel"] & (np.asarray(cols["duration_s"]) > threshold)
        slow = np.asarray(cols["step"])[rule["mask"]]
    else:
        slow = np.zeros(0, np.int64)
    n_out = len(slow)
    out = ctx.con.execute(
        f"SELECT step, duration_s, data_wait_s FROM steps WHERE {ok} AND step IN "
        f"(SELECT unnest(?::BIGINT[])) ORDER BY duration_s DESC LIMIT ?",
        [ctx.rank, [int(x) for x in slow], MAX_OUTLIERS]).fetchall() if n_out else []
    if out:
        out.sort()
        traces.append({
            "type": "scatter", "mode": "markers", "name": "outlier",
            "x": [r[0] for r in out], "y": [num(r[1] * mult) for r in out],
            "customdata": [num((r[2] or 0) * mult, 3) for r in out],
            "marker": {"color": RED, "size": 7, "symbol": "circle-open", "line": {"width": 2}},
            "hovertemplate": "outlier step %{x}<br>%{y:.3g} " + unit
                             + "<br>data wait %{customdata} " + unit + "<extra></extra>"})
    shapes, notes = finding_markers(ctx.findings, "step-time")
    fig = figure(traces, xtitle="step", ytitle=f"step time ({unit})", shapes=shapes,
                 annotations=notes)
    caption = (f"Median step {med * mult:.3g} {unit}"
               + (f"; {n_out:,} slow step{'s' if n_out > 1 else ''} above "
                  f"{threshold * mult:.3g} {unit} (circled; not counting the first steps and "
                  "the recorder's own statistics and profiler steps)" if n_out
                  else "; no outlier steps")
               + ". Areas are averages per step range"
               + (": orange is time blocked on the data loader." if has_wait
                  else "; the loader was not wrapped, so data wait is unknown."))
    return Chart("step-time", "Step time", fig, caption)


MEM_COLS = (("rss_bytes", "RSS (host)", TEAL), ("heap_bytes", "heap in use (host)", ORANGE),
            ("cuda_allocated_bytes", "CUDA allocated", BLUE),
            ("cuda_reserved_bytes", "CUDA reserved", PURPLE))
"""Memory series of the chart; the leak fit is drawn on the one its finding names (a heap
leak's fit on the heap line, labelled so, not on RSS)."""


def _ev(ev: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = ev.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def memory_chart(ctx: ReportContext) -> Chart | None:
    envs = envelopes(ctx.con, "memory", "step", [c for c, _, _ in MEM_COLS],
                     where="rank = ?", params=[ctx.rank], n=ctx.buckets)
    present = [(c, label, colour) for c, label, colour in MEM_COLS if envs[c]]
    if not present:
        return None
    peak = max(v for c, _, _ in present for v in envs[c].y if v is not None)
    capacity = ctx.scalar("SELECT max(cuda_total_bytes) FROM memory WHERE rank = ?", [ctx.rank])
    div, unit = (float(2**30), "GiB") if peak >= 2**30 else (float(2**20), "MiB")
    traces = [line(envs[c].x, [None if v is None else num(v / div) for v in envs[c].y], label,
                   colour, hover="step %{x}<br>%{y:.4g} " + unit)
              for c, label, colour in present]
    shapes, notes = finding_markers(ctx.findings, "memory")
    last = max(x for c, _, _ in present for x in envs[c].x)
    first = min(x for c, _, _ in present for x in envs[c].x)
    caption = "Lowest and highest value per step range."
    # One fit line per leaking counter (host RSS and CUDA memory can both leak).
    for leak in [f for f in ctx.findings if f.id == "memory_leak"][:len(MEM_COLS)]:
        fit, fit_caption = _leak_fit(ctx, leak, envs, first, last, capacity)
        traces.extend(fit["traces"])
        caption += " " + fit_caption if fit_caption else ""
        for tr in fit["traces"]:
            tr["y"] = [None if v is None else num(v / div) for v in tr["y"]]
        capacity = fit.get("capacity") or capacity
    if capacity and any(c.startswith("cuda") for c, _, _ in present):
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1,
                       "y0": capacity / div, "y1": capacity / div,
                       "line": {"color": RED, "width": 1, "dash": "dash"}})
        notes.append({"xref": "paper", "yref": "y", "x": 0, "y": capacity / div,
                      "xanchor": "left", "yanchor": "bottom", "showarrow": False,
                      "text": f"GPU capacity {capacity / div:.3g} {unit}",
                      "font": {"color": RED, "size": 11}})
    # From zero: a 2 MiB wobble on a 1.4 GiB process must not look like a problem.
    fig = figure(traces, xtitle="step", ytitle=f"memory ({unit})", shapes=shapes,
                 annotations=notes, yaxis={"rangemode": "tozero"})
    return Chart("memory", "Memory", fig, caption)


def _leak_fit(ctx: ReportContext, leak: Finding, envs: dict[str, Any], first: float,
              last: float, capacity: float | None) -> tuple[dict[str, Any], str]:
    """The memory_leak finding's fit line, extended to the projected OOM when that is near.

    Slope (and intercept when given) come from the finding's evidence so the chart shows what
    the detector concluded; without an intercept the line is anchored on the series' floor.
    """
    ev = leak.evidence
    subject = str(leak.subject or "")
    col = subject if envs.get(subject) else next(
        (c for c, _, _ in MEM_COLS if envs[c]), None)
    slope = _ev(ev, "slope_bytes_per_step", "slope")
    if col is None or slope is None:
        return {"traces": []}, ""
    start = _ev(ev, "fit_start_step", "start_step", "warmup_end_step")
    if start is None:
        start = float(leak.first_step if leak.first_step is not None else first)
    intercept = _ev(ev, "intercept_bytes", "intercept")
    floor_end = _ev(ev, "floor_end_bytes")
    if intercept is None and floor_end is not None:
        # The detector's floor at the last analysed step anchors its slope.
        intercept = floor_end - slope * last
    if intercept is None:
        # Floor of the series: the median of (lowest value - slope × step) after start.
        env = envs[col]
        resid = sorted(y - slope * x for x, y in zip(env.x, env.y, strict=True)
                       if y is not None and x >= start)
        if not resid:
            return {"traces": []}, ""
        intercept = resid[len(resid) // 2]
    cap = _ev(ev, "capacity_bytes", "total_bytes", "limit_bytes")
    if cap is None and col.startswith("cuda"):
        cap = capacity  # the GPU's size bounds CUDA counters only, not host RSS
    oom = _ev(ev, "projected_oom_step", "oom_step")
    if oom is None and cap and slope > 0:
        oom = (cap - intercept) / slope
    end = last
    # Draw the projection up to the OOM only when it fits on a chart about three times the
    # run's length (the recorded part must stay readable); otherwise say where it is.
    if oom is not None and oom > last and oom - first <= 3.0 * max(last - first, 1):
        end = oom
    label = dict((c, lab) for c, lab, _ in MEM_COLS).get(col, col)
    fit_traces = [{"type": "scatter", "mode": "lines", "name": f"leak fit ({label})",
                   "x": [start, last], "y": [intercept + slope * start, intercept + slope * last],
                   "line": {"color": RED, "width": 2}, "hoverinfo": "skip"}]
    if end > last:
        fit_traces.append({"type": "scatter", "mode": "lines+markers",
                           "name": f"projected ({label})",
                           "x": [last, end], "y": [intercept + slope * last,
                                                   intercept + slope * end],
                           "line": {"color": RED, "width": 2, "dash": "dash"},
                           "marker": {"size": [0, 10], "symbol": "x", "color": RED},
                           "hovertemplate": "projected OOM at step %{x:,.0f}<extra></extra>"})
    per_step = slope / 2**20
    text = f"Red: {label} leaks {per_step:.3g} MiB/step from step {start:,.0f}"
    if oom is not None and oom > last:
        text += f"; projected out of memory at step {oom:,.0f}"
        if end < oom:
            text += " (beyond this chart)"
    text += "."
    return {"traces": fit_traces, "capacity": cap}, text


def system_chart(ctx: ReportContext) -> Chart | None:
    t0, n = ctx.con.execute("SELECT min(time), count(*) FROM system WHERE rank = ?",
                            [ctx.rank]).fetchone()
    if t0 is None or n < 2:
        return None  # a run shorter than the sampling interval: nothing to draw
    x = f"(time - {float(t0)!r})"
    cols = (("cpu_percent", "host CPU", TEAL), ("proc_cpu_percent", "process CPU", BLUE),
            ("mem_percent", "host memory", PURPLE), ("gpu_util", "GPU utilisation", GREEN))
    envs = envelopes(ctx.con, "system", x, [c for c, _, _ in cols], where="rank = ?",
                     params=[ctx.rank], n=min(ctx.buckets, 500))
    traces = [line(envs[c].x, envs[c].y, label, colour, hover="%{x:.0f} s<br>%{y:.1f} %")
              for c, label, colour in cols if envs[c]]
    if not traces:
        return None
    if n < 30:  # a short run: a few samples, drawn as points too so none is lost
        for t in traces:
            t["mode"] = "lines+markers"
    fig = figure(traces, xtitle="time since start (s)", ytitle="utilisation (%)")
    return Chart("system", "Host and GPU utilisation", fig,
                 "Sampled about once a second in the background; process CPU can exceed 100% "
                 "with several threads.")
