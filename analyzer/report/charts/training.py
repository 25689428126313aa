"""Training charts of the report: loss, learning rate, gradient norm, per-layer gradient
heatmap and user metrics. All series are downsampled in DuckDB (see ``downsample``)."""

from __future__ import annotations

import math
import re
from typing import Any

from ..context import ReportContext
from ..downsample import envelopes, num, x_range
from ..figures import (
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
    log_axis,
    short,
    spans_shapes,
)

HEAT_STEPS = 200
"""Step buckets of the gradient heatmap (columns)."""
HEAT_LAYERS = 256
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
    # The scale from the data: a loss spanning more than an order of magnitude (a blow-up,
    # or a loss falling towards 0) is a flat line on a linear axis.
    ys = [v for v in env.y if v is not None and math.isfinite(v)] if env else []
    if ys and min(ys) > 0 and max(ys) / min(ys) >= LOG_SPAN:
        fig["layout"]["yaxis"].update(log_axis(ys))
        caption += " Log scale: the loss spans more than an order of magnitude."
    else:
        # (full tick labels ready for the log button; unused while the axis is linear)
        fig["layout"]["yaxis"].update({**log_axis(ys), "type": "linear", "tickmode": "auto"})
        rng = flat_range(env.y) if env else None
        if rng:
            fig["layout"]["yaxis"]["range"] = rng
    fig["layout"]["updatemenus"] = [_log_toggle(log=fig["layout"]["yaxis"].get("type") == "log")]
    return Chart("loss", "Loss", fig, caption)


LOG_SPAN = 20.0
"""max/min of a positive loss from which its chart opens on a log axis."""


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
    ys = [v for v in env.y if v is not None and math.isfinite(v)]
    if ys and min(ys) > 0 and max(ys) / min(ys) >= LOG_SPAN:  # a ×100 jump, a long decay
        fig["layout"]["yaxis"].update(log_axis(ys))
    else:
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
                 yaxis=log_axis(env.y), shapes=spans_shapes(spans) + shapes, annotations=notes)
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


def _model_order(ctx: ReportContext, where: str, names: set[str]) -> list[str]:
    """Tensor names in model order: the order they first appear in the recorded rows (the
    recorder writes each step's statistics in named_parameters() order, and DuckDB keeps
    file order for a plain filtered scan). Names not seen in the first rows follow in natural
    order (layers.2 before layers.10)."""
    first = ctx.con.execute(
        f"SELECT name FROM tensor_stats WHERE {where} AND name IS NOT NULL LIMIT ?",
        [ctx.rank, 4 * len(names) + 1000]).fetchall()
    seen = [n for n in dict.fromkeys(r[0] for r in first) if n in names]
    rest = sorted(names - set(seen), key=_natural_key)
    return seen + rest


def _heat_range(ctx: ReportContext, where: str) -> tuple[int, int] | None:
    # The steps table (one row per step) gives the range far cheaper than a scan of
    # tensor_stats; tensor statistics are taken at recorded steps.
    xr = x_range(ctx.con, "steps", "step", "rank = ?", [ctx.rank]) or x_range(
        ctx.con, "tensor_stats", "step", where, [ctx.rank])
    return None if xr is None else (int(xr[0]), int(xr[1]))


def grad_heatmap(ctx: ReportContext) -> Chart | None:
    """Per-tensor gradient norm, tensors × step buckets, log10 colour, NaN/Inf cells marked.

    Each cell is the largest norm in its step range (spikes survive); the grid is at most
    HEAT_LAYERS × HEAT_STEPS however big the model or long the run. One scan of tensor_stats:
    it is the largest table by far (20M rows for 100k steps × 200 tensors).
    """
    return tensor_heatmap(ctx, "grad", "grad-heatmap", "Gradient norm per tensor", "‖grad‖",
                          "gradient tensors in model order")


def tensor_heatmap(ctx: ReportContext, kind: str, anchor: str, title: str, label: str,
                   what: str) -> Chart | None:
    """:func:`grad_heatmap` for any kind of tensor_stats rows (activation outputs too)."""
    where = f"kind = '{kind}' AND rank = ? AND norm IS NOT NULL" if kind != "grad" \
        else "kind = 'grad' AND rank = ?"
    xr = _heat_range(ctx, where)
    if xr is None:
        return None
    lo, hi = xr
    nsteps = min(HEAT_STEPS, hi - lo + 1)
    span = hi - lo + 1
    # Integer bucket arithmetic (steps are int64), clamped for stray steps outside the range.
    b = f"greatest(0, least({nsteps - 1}, (step - {lo}) * {nsteps} // {span}))"
    # max() sorts NaN above everything: a cell holding a NaN gets no value, only the mark.
    rows = ctx.con.execute(
        f"""SELECT name, {b} AS b, max(norm) AS hi,
                   count(*) FILTER (WHERE nonfinite > 0 OR NOT isfinite(norm)) AS bad
            FROM tensor_stats WHERE {where} AND step IS NOT NULL AND name IS NOT NULL
            GROUP BY ALL""",
        [ctx.rank],
    ).fetchall()
    if not rows:
        return None
    names = _model_order(ctx, where, {r[0] for r in rows})
    group = max(1, math.ceil(len(names) / HEAT_LAYERS))
    row_of = {n: i // group for i, n in enumerate(names)}
    if group == 1:
        labels = names
    else:
        labels = [
            f"{names[i]} … {names[min(i + group, len(names)) - 1]}"
            f" ({min(group, len(names) - i)} tensors)"
            for i in range(0, len(names), group)
        ]
    nrows = len(labels)
    best: list[list[float | None]] = [[None] * nsteps for _ in range(nrows)]
    badcell: set[tuple[int, int]] = set()
    for name, bk, norm, bad in rows:
        i = row_of[name]
        if norm is not None and math.isfinite(norm):
            cur = best[i][bk]
            best[i][bk] = norm if cur is None else max(cur, norm)
        if bad:
            badcell.add((i, bk))
    width = span / nsteps
    xs = [lo + int(width * j) for j in range(nsteps)]
    # Zero gradients get the floor of the colour scale (log10(0) is -inf).
    z = [[None if v is None else num(math.log10(v) if v > 0 else -30.0, 4) for v in row]
         for row in best]
    bad_x = [xs[j] for i, j in sorted(badcell)]
    bad_y = [i for i, j in sorted(badcell)]
    finite = sorted(v for row in z for v in row if v is not None and v > -30)
    zmin = finite[int(0.01 * (len(finite) - 1))] if finite else 0.0
    zmax = finite[-1] if finite else 1.0
    tickvals, ticktext = _log_ticks(zmin, zmax)
    traces: list[dict[str, Any]] = [{
        "type": "heatmap", "x": xs, "y": list(range(nrows)), "z": z,
        "zmin": zmin, "zmax": max(zmax, zmin + 1e-6), "colorscale": "Viridis",
        "colorbar": {"title": {"text": label}, "tickvals": tickvals,
                     "ticktext": ticktext, "thickness": 12},
        # customdata (name, norm) is filled in by the page's script from extra.names and z.
        "hovertemplate": "%{customdata[0]}<br>steps from %{x}<br>max " + label
                         + " %{customdata[1]}<extra></extra>",
        "xgap": 0, "ygap": 0,
    }]
    if bad_x:
        traces.append({"type": "scatter", "mode": "markers", "x": bad_x, "y": bad_y,
                       "name": "NaN/Inf", "marker": {"symbol": "x-thin", "size": 7,
                                                     "color": RED, "line": {"width": 2,
                                                                            "color": RED}},
                       "hovertemplate": f"NaN/Inf {kind}<br>steps from %{{x}}<extra></extra>"})
    tick_every = max(1, math.ceil(nrows / 40))
    tickvals_y = list(range(0, nrows, tick_every))
    shapes, notes = finding_markers(ctx.findings, anchor)
    fig = figure(
        traces, xtitle="step", ytitle="tensor" if kind != "activation" else "module",
        yaxis={"tickvals": tickvals_y, "ticktext": [short(labels[i]) for i in tickvals_y],
               "autorange": "reversed", "automargin": True, "tickfont": {"size": 10},
               "showgrid": False, "zeroline": False},
        xaxis={"showgrid": False}, showlegend=bool(bad_x), shapes=shapes, annotations=notes,
        height=max(320, min(900, 80 + 14 * nrows)),
    )
    caption = (f"{len(names):,} {what}"
               + (f", {group} per row" if group > 1 else "")
               + f"; each cell is the largest norm over ~{max(1, round(width)):,} steps"
               + " (log colour scale).")
    if bad_x:
        caption += f" ✕ marks cells with a NaN/Inf {kind}."
    return Chart(anchor, title, fig, caption, extra={"names": [esc(n, 300) for n in labels]})


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


def _log_toggle(log: bool = False) -> dict[str, Any]:
    """A linear/log switch for the y axis (losses span orders of magnitude)."""
    return {"type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.02,
            "yanchor": "bottom", "showactive": True, "active": 1 if log else 0,
            "pad": {"r": 0, "t": 0},
            "font": {"size": 11},
            "buttons": [
                {"label": "linear", "method": "relayout",
                 "args": [{"yaxis.type": "linear", "yaxis.tickmode": "auto"}]},
                {"label": "log", "method": "relayout",
                 "args": [{"yaxis.type": "log", "yaxis.tickmode": "array"}]}]}
