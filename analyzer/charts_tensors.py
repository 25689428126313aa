"""Per-tensor charts of the report: dead activations (share of exact zeros in each module's
output) and update/weight ratios, from the full statistics at their cadence."""

from __future__ import annotations

from .anchors import ACTIVATIONS, UPDATE_RATIO
from .downsample import num
from .figures import PALETTE, Chart, figure, finding_markers, line, short
from .report_context import ReportContext

MAX_SERIES = 8
"""Tensors drawn per chart: the ones a finding names first, then the most extreme."""


def _series(ctx: ReportContext, kind: str, value: str, order: str) -> dict[str, tuple]:
    names = [r[0] for r in ctx.con.execute(
        f"SELECT name FROM tensor_stats WHERE rank = ? AND kind = ? AND {value} IS NOT NULL "
        f"GROUP BY name ORDER BY {order} LIMIT ?", [ctx.rank, kind, MAX_SERIES]).fetchall()]
    out: dict[str, tuple] = {}
    for name in names:
        rows = ctx.con.execute(
            f"SELECT step, {value} FROM tensor_stats WHERE rank = ? AND kind = ? AND name = ? "
            f"AND {value} IS NOT NULL ORDER BY step LIMIT 5000",
            [ctx.rank, kind, name]).fetchall()
        out[name] = ([int(s) for s, _ in rows], [num(v, 4) for _, v in rows])
    return out


def activations_chart(ctx: ReportContext) -> Chart | None:
    series = _series(ctx, "activation", "zero_frac", "avg(zero_frac) DESC, name")
    if not series:
        return None
    shapes, notes = finding_markers(ctx.findings, ACTIVATIONS)
    traces = [line(x, y, short(name, 40), PALETTE[i % len(PALETTE)],
                   hover=f"{short(name, 60)}<br>step %{{x}}<br>zeros %{{y:.1%}}<extra></extra>")
              for i, (name, (x, y)) in enumerate(series.items())]
    fig = figure(traces, xtitle="step", ytitle="share of exact zeros in the output",
                 yaxis={"range": [0, 1.02]}, shapes=shapes, annotations=notes)
    return Chart(ACTIVATIONS, "Dead activations", fig,
                 f"Modules whose outputs are most often exactly zero (top {len(series)}), at "
                 "the activation-statistics cadence.", wide=False)


def update_ratio_chart(ctx: ReportContext) -> Chart | None:
    series = _series(ctx, "update", "ratio", "abs(log10(greatest(avg(ratio), 1e-30)) + 3) "
                     "DESC, name")
    if not series:
        return None
    shapes, notes = finding_markers(ctx.findings, UPDATE_RATIO)
    traces = [line(x, y, short(name, 40), PALETTE[i % len(PALETTE)],
                   hover=f"{short(name, 60)}<br>step %{{x}}<br>ratio %{{y:.3g}}<extra></extra>")
              for i, (name, (x, y)) in enumerate(series.items())]
    fig = figure(traces, xtitle="step", ytitle="‖update‖ / ‖weight‖", yaxis={"type": "log"},
                 shapes=shapes, annotations=notes)
    return Chart(UPDATE_RATIO, "Update / weight ratio", fig,
                 "Parameters furthest from the usual ~1e-3 per step (log scale).", wide=False)


def tensor_charts(ctx: ReportContext) -> list[Chart]:
    return [c for c in (activations_chart(ctx), update_ratio_chart(ctx)) if c is not None]
