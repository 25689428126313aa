"""Training charts of the report: loss, learning rate, gradient norm, per-layer gradient
heatmap and user metrics. All series are downsampled in DuckDB (see ``downsample``)."""

from __future__ import annotations

import math
import re
from typing import Any

from .downsample import bucket_expr, envelopes, num, x_range
from .figures import (
    BLUE,
    ORANGE,
    PALETTE,
    PURPLE,
    RED,
    Chart,
    esc,
    figure,
    finding_markers,
    flat_range,
    line,
    short,
    spans_shapes,
)
from .report_context import ReportContext

HEAT_STEPS = 200
"""Step buckets of the gradient heatmap (columns)."""
HEAT_LAYERS = 160
"""Most rows of the heatmap; larger models merge consecutive tensors into one row."""
MAX_METRICS = 16
"""User metrics charted (the rest are named in the caption)."""
MAX_PANELS = 4
"""Up to this many metrics get a panel each; more share one chart."""
MAX_SPANS = 60
"""Most shaded NaN/Inf step ranges drawn per chart (the longest ones)."""


def training_charts(ctx: ReportContext) -> list[Chart]:
    """Loss, learning rate, gradient norm, gradient heatmap and metrics (those with data)."""
    charts: list[Chart] = []
    for build in (loss_chart, lr_chart, grad_norm_chart, grad_heatmap, metrics_chart):
        chart = build(ctx)
        if chart is not None:
            charts.append(chart)
    return charts


def nonfinite_spans(ctx: ReportContext, cond: str) -> tuple[list[tuple[int, int]], int, Any]:
    """Runs of consecutive recorded steps where ``cond`` holds: (longest spans, step count,
    first step). Gaps-and-islands in SQL so a run that is NaN for 90% of its steps stays cheap."""
    rows = ctx.con.execute(
        f"""
        WITH s AS (SELECT step, coalesce({cond}, FALSE) AS bad FROM steps WHERE rank = ?),
        r AS (SELECT step, bad, row_number() OVER (ORDER BY step)
                               - row_number() OVER (PARTITION BY bad ORDER BY step) AS grp
              FROM s)
        SELECT min(step), max(step), count(*) FROM r WHERE bad GROUP BY grp
        """,
        [ctx.rank],
    ).fetchall()
    if not rows:
        return [], 0, None
    total = sum(r[2] for r in rows)
    first = min(r[0] for r in rows)
    longest = sorted(rows, key=lambda r: -r[2])[:MAX_SPANS]
    return [(int(a), int(b)) for a, b, _ in longest], int(total), int(first)


def _nonfinite_legend() -> dict[str, Any]:
    # Shapes have no legend entry; an empty trace gives the red band a label.
    return {"type": "scatter", "mode": "markers", "x": [None], "y": [None], "name": "NaN/Inf",
            "marker": {"symbol": "square", "size": 12, "color": RED, "opacity": 0.35},
            "hoverinfo": "skip"}


def loss_chart(ctx: ReportContext) -> Chart | None:
    env = envelopes(ctx.con, "steps", "step", ["loss"], where="rank = ?", params=[ctx.rank],
                    n=ctx.buckets)["loss"]
    spans, bad, first_bad = nonfinite_spans(ctx, "loss IS NOT NULL AND NOT isfinite(loss)")
    if not env and not bad:
        return None
    shapes, notes = finding_markers(ctx.findings, "loss")
    traces = [line(env.x, env.y, "loss", BLUE, hover="step %{x}<br>loss %{y:.4g}<extra></extra>")]
    if bad:
        traces.append(_nonfinite_legend())
    caption = "Each point is the lowest or highest loss in its step range, so spikes survive."
    if bad:
        caption += f" Loss was NaN/Inf at {bad:,} steps, first at step {first_bad:,} (red bands)."
    fig = figure(traces, xtitle="step", ytitle="loss",
                 shapes=spans_shapes(spans) + shapes, annotations=notes)
    _cover_spans(fig, env.x, spans)
    rng = flat_range(env.y)
    if rng:
        fig["layout"]["yaxis"]["range"] = rng
    fig["layout"]["updatemenus"] = [_log_toggle()]
    return Chart("loss", "Loss", fig, caption)


def lr_chart(ctx: ReportContext) -> Chart | None:
    env = envelopes(ctx.con, "steps", "step", ["lr"], where="rank = ?", params=[ctx.rank],
                    n=ctx.buckets)["lr"]
    if not env:
        return None
    shapes, notes = finding_markers(ctx.findings, "lr")
    fig = figure([line(env.x, env.y, "learning rate", ORANGE,
                       hover="step %{x}<br>lr %{y:.3g}<extra></extra>")],
                 xtitle="step", ytitle="learning rate", shapes=shapes, annotations=notes)
    fig["data"][0]["line"]["shape"] = "hv"  # schedules change in steps
    rng = flat_range(env.y)
    if rng:
        fig["layout"]["yaxis"]["range"] = rng
    return Chart("lr", "Learning rate", fig, wide=False)


def grad_norm_chart(ctx: ReportContext) -> Chart | None:
    env = envelopes(ctx.con, "steps", "step", ["grad_norm"], where="rank = ?",
                    params=[ctx.rank], n=ctx.buckets)["grad_norm"]
    spans, bad, first_bad = nonfinite_spans(
        ctx, "nonfinite_grads > 0 OR (grad_norm IS NOT NULL AND NOT isfinite(grad_norm))")
    if not env and not bad:
        return None
    shapes, notes = finding_markers(ctx.findings, "grad-norm")
    traces = [line(env.x, env.y, "total grad norm", PURPLE,
                   hover="step %{x}<br>‖g‖ %{y:.4g}<extra></extra>")]
    if bad:
        traces.append(_nonfinite_legend())
    caption = "L2 norm over all gradients (log scale)."
    if bad:
        caption += f" Nonfinite gradients at {bad:,} steps, first at step {first_bad:,}."
    fig = figure(traces, xtitle="step", ytitle="gradient norm (L2)",
                 yaxis={"type": "log"}, shapes=spans_shapes(spans) + shapes, annotations=notes)
    _cover_spans(fig, env.x, spans)
    return Chart("grad-norm", "Total gradient norm", fig, caption, wide=False)


def _cover_spans(fig: dict[str, Any], xs: list[Any], spans: list[tuple[int, int]]) -> None:
    """Widen the x axis over NaN/Inf bands: shapes do not take part in autorange, and after a
    divergence the line itself stops at the last finite step."""
    if not spans:
        return
    lo = min([*xs, *(a for a, _ in spans)])
    hi = max([*xs, *(b for _, b in spans)])
    fig["layout"]["xaxis"]["range"] = [lo - 0.5, hi + 0.5]


def _natural_key(name: str) -> list[Any]:
    # layers.2 before layers.10: model order for the usual numbered containers.
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def grad_heatmap(ctx: ReportContext) -> Chart | None:
    """Per-tensor gradient norm, tensors × step buckets, log10 colour, NaN/Inf cells marked.

    Each cell is the largest finite norm in its step range (spikes survive); the grid is at
    most HEAT_LAYERS × HEAT_STEPS however big the model or long the run.
    """
    where = "kind = 'grad' AND rank = ?"
    names = [r[0] for r in ctx.con.execute(
        f"SELECT DISTINCT name FROM tensor_stats WHERE {where}", [ctx.rank]).fetchall()
        if r[0] is not None]
    if not names:
        return None
    names.sort(key=_natural_key)
    xr = x_range(ctx.con, "tensor_stats", "step", where, [ctx.rank])
    if xr is None:
        return None
    nsteps = min(HEAT_STEPS, int(xr[1] - xr[0]) + 1)
    b = bucket_expr("step", xr[0], xr[1], nsteps)
    group = max(1, math.ceil(len(names) / HEAT_LAYERS))
    if group == 1:
        source, row_expr, params = "tensor_stats", "name", [ctx.rank]
    else:
        # Row index per name via a join on a literal list (no temp table: the connection may
        # be shared and read-only).
        source = ("tensor_stats JOIN (SELECT unnest(?::VARCHAR[]) AS n, "
                  "unnest(?::INTEGER[]) AS i) AS idx ON tensor_stats.name = idx.n")
        row_expr = f"i // {group}"
        params = [names, list(range(len(names))), ctx.rank]
    rows = ctx.con.execute(
        f"""SELECT {row_expr} AS r, {b} AS b,
                   max(norm) FILTER (WHERE isfinite(norm)) AS hi,
                   count(*) FILTER (WHERE NOT isfinite(norm) OR nonfinite > 0) AS bad
            FROM {source} WHERE {where} AND step IS NOT NULL GROUP BY ALL""",
        params,
    ).fetchall()
    if group == 1:
        labels = names
        index = {n: i for i, n in enumerate(names)}
    else:
        labels = [
            f"{names[i]} … {names[min(i + group, len(names)) - 1]}"
            f" ({min(group, len(names) - i)} tensors)"
            for i in range(0, len(names), group)
        ]
        index = None
    nrows = len(labels)
    z: list[list[float | None]] = [[None] * nsteps for _ in range(nrows)]
    bad_x, bad_y = [], []
    span = (xr[1] - xr[0]) / nsteps
    xs = [int(xr[0] + span * j) if nsteps > 1 else int(xr[0]) for j in range(nsteps)]
    for r, bk, hi, bad in rows:
        i = index[r] if index is not None else int(r)
        if hi is not None:
            # Zero gradients get the floor of the colour scale (log10(0) is -inf).
            z[i][bk] = num(math.log10(hi) if hi > 0 else -30.0, 4)
        if bad:
            bad_x.append(xs[bk])
            bad_y.append(i)
    finite = sorted(v for row in z for v in row if v is not None and v > -30)
    zmin = finite[int(0.01 * (len(finite) - 1))] if finite else 0.0
    zmax = finite[-1] if finite else 1.0
    tickvals, ticktext = _log_ticks(zmin, zmax)
    traces: list[dict[str, Any]] = [{
        "type": "heatmap", "x": xs, "y": list(range(nrows)), "z": z,
        "zmin": zmin, "zmax": max(zmax, zmin + 1e-6), "colorscale": "Viridis",
        "colorbar": {"title": {"text": "‖grad‖"}, "tickvals": tickvals,
                     "ticktext": ticktext, "thickness": 12},
        # customdata (name, norm) is filled in by the page's script from extra.names and z.
        "hovertemplate": "%{customdata[0]}<br>steps from %{x}<br>max ‖grad‖ %{customdata[1]}"
                         "<extra></extra>",
        "xgap": 0, "ygap": 0,
    }]
    if bad_x:
        traces.append({"type": "scatter", "mode": "markers", "x": bad_x, "y": bad_y,
                       "name": "NaN/Inf", "marker": {"symbol": "x-thin", "size": 7,
                                                     "color": RED, "line": {"width": 2,
                                                                            "color": RED}},
                       "hovertemplate": "NaN/Inf gradient<br>steps from %{x}<extra></extra>"})
    tick_every = max(1, math.ceil(nrows / 40))
    tickvals = list(range(0, nrows, tick_every))
    shapes, notes = finding_markers(ctx.findings, "grad-heatmap")
    fig = figure(
        traces, xtitle="step", ytitle="",
        yaxis={"tickvals": tickvals, "ticktext": [short(labels[i]) for i in tickvals],
               "autorange": "reversed", "automargin": True, "tickfont": {"size": 10},
               "showgrid": False, "zeroline": False},
        xaxis={"showgrid": False}, showlegend=bool(bad_x), shapes=shapes, annotations=notes,
        height=max(320, min(900, 80 + 14 * nrows)),
    )
    caption = (f"{len(names):,} gradient tensors in model order"
               + (f", {group} per row" if group > 1 else "")
               + f"; each cell is the largest norm over ~{max(1, round(span)):,} steps.")
    if bad_x:
        caption += " ✕ marks cells with a NaN/Inf gradient."
    return Chart("grad-heatmap", "Gradient norm per tensor", fig, caption,
                 extra={"names": [esc(n, 300) for n in labels]})


def _log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Colour-bar ticks for log10 values: decades when the range spans two or more, else a
    few values in between (a narrow range would otherwise get a single tick)."""
    if hi - lo >= 2:
        a, b = math.ceil(lo), math.floor(hi)
        step = max(1, math.ceil((b - a) / 8))
        vals: list[float] = list(range(a, b + 1, step))
        return vals, [f"1e{v}" for v in vals]
    vals = [lo + (hi - lo) * i / 4 for i in range(5)] if hi > lo else [lo]
    return [round(v, 4) for v in vals], [f"{10 ** v:.2g}" for v in vals]


def metrics_chart(ctx: ReportContext) -> Chart | None:
    """User metrics passed to rec.step: one small panel each on a shared step axis (metrics
    have unrelated scales), or one chart with a legend when there are many."""
    names = [r[0] for r in ctx.con.execute(
        "SELECT DISTINCT name FROM metrics WHERE rank = ? AND name IS NOT NULL ORDER BY name",
        [ctx.rank]).fetchall()]
    if not names:
        return None
    shown = names[:MAX_METRICS]
    xr = x_range(ctx.con, "metrics", "step", "rank = ?", [ctx.rank])
    panels = len(shown) <= MAX_PANELS
    traces = []
    for i, name in enumerate(shown):
        env = envelopes(ctx.con, "metrics", "step", ["value"], where="rank = ? AND name = ?",
                        params=[ctx.rank, name], n=min(ctx.buckets, 500), xr=xr)["value"]
        if not env:
            continue
        tr = line(env.x, env.y, esc(name, 60), PALETTE[i % len(PALETTE)],
                  hover="step %{x}<br>%{y:.4g}")
        if panels:
            tr["yaxis"] = "y" if not traces else f"y{len(traces) + 1}"
        traces.append(tr)
    if not traces:
        return None
    caption = ""
    if len(names) > len(shown):
        caption = f"{len(names) - len(shown)} more metrics not shown."
    if panels:
        k = len(traces)
        gap = 0.06 if k > 1 else 0.0
        h = (1.0 - gap * (k - 1)) / k
        layout: dict[str, Any] = {"showlegend": False, "height": max(300, 60 + 150 * k)}
        for i, tr in enumerate(traces):
            top = 1.0 - i * (h + gap)
            key = "yaxis" if i == 0 else f"yaxis{i + 1}"
            layout[key] = {"domain": [max(0.0, top - h), top], "title": {"text": tr["name"]},
                           "anchor": "x"}
        layout["xaxis"] = {"anchor": f"y{k}" if k > 1 else "y"}
        fig = figure(traces, xtitle="step", ytitle=traces[0]["name"], **layout)
    else:
        fig = figure(traces, xtitle="step", ytitle="value (as recorded)")
        fig["layout"]["updatemenus"] = [_log_toggle()]
        caption = "Click a legend entry to hide it; double-click to show only that metric. " \
            + caption
    return Chart("metrics", "Metrics", fig, caption.strip())


def _log_toggle() -> dict[str, Any]:
    """A linear/log switch for the y axis (losses span orders of magnitude)."""
    return {"type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.02,
            "yanchor": "bottom", "showactive": True, "pad": {"r": 0, "t": 0},
            "font": {"size": 11},
            "buttons": [
                {"label": "linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]}]}
