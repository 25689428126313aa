"""Per-tensor charts of the report: activation norms per module, dead activations (share of
exact zeros in each module's output) and update/weight ratios, from the full statistics at
their cadence (debug preset)."""

from __future__ import annotations

from ...diagnosis.anchors import ACTIVATION_NORMS, ACTIVATIONS, UPDATE_RATIO
from ..context import ReportContext
from ..downsample import num
from ..figures import PALETTE, Chart, figure, finding_markers, line, log_axis, short

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


def _chart(ctx: ReportContext, anchor: str, series: dict[str, tuple], *, title: str,
           ytitle: str, value: str, yaxis: dict, caption: str) -> Chart | None:
    """One line per tensor, with the findings that link to ``anchor`` marked."""
    if not series:
        return None
    shapes, notes = finding_markers(ctx.findings, anchor)
    traces = [line(x, y, short(name, 40), PALETTE[i % len(PALETTE)],
                   hover=f"{short(name, 60)}<br>step %{{x}}<br>{value}<extra></extra>")
              for i, (name, (x, y)) in enumerate(series.items())]
    fig = figure(traces, xtitle="step", ytitle=ytitle, yaxis=yaxis, shapes=shapes,
                 annotations=notes)
    return Chart(anchor, title, fig, caption, wide=False)


def activations_chart(ctx: ReportContext) -> Chart | None:
    series = _series(ctx, "activation", "zero_frac", "avg(zero_frac) DESC, name")
    return _chart(ctx, ACTIVATIONS, series, title="Dead activations",
                  ytitle="share of exact zeros in the output", value="zeros %{y:.1%}",
                  yaxis={"range": [0, 1.02]},
                  caption=f"Modules whose outputs are most often exactly zero (top "
                          f"{len(series)}), at the activation-statistics cadence.")


def update_ratio_chart(ctx: ReportContext) -> Chart | None:
    series = _series(ctx, "update", "ratio",
                     "abs(log10(greatest(avg(ratio), 1e-30)) + 3) DESC, name")
    return _chart(ctx, UPDATE_RATIO, series, title="Update / weight ratio",
                  ytitle="‖update‖ / ‖weight‖", value="ratio %{y:.3g}",
                  yaxis=log_axis([v for _, ys in series.values() for v in ys]),
                  caption="Parameters furthest from the usual ~1e-3 per step (log scale).")


def activation_norms_chart(ctx: ReportContext) -> Chart | None:
    """Each module's output norm over the run (debug preset's activation statistics): where
    activations blow up or collapse, module by module."""
    from .training import tensor_heatmap

    return tensor_heatmap(ctx, "activation", ACTIVATION_NORMS, "Activation norm per module",
                          "‖output‖", "module outputs in forward order, at the "
                          "activation-statistics cadence")


def tensor_charts(ctx: ReportContext) -> list[Chart]:
    return [c for c in (activation_norms_chart(ctx), activations_chart(ctx),
                        update_ratio_chart(ctx)) if c is not None]
