"""The report's distributions over steps: one heatmap per group of tensors (weights, then
gradients), from the ``histograms`` table (``histogram_every``).

A group is the tensors whose names differ only in their numbers (``blocks.*.mlp.fc.weight``:
one per layer of a stack), so a 48-layer model reads as a few rows of charts, and layers of
one kind are summed into one distribution. Each chart's x is the step, y the fixed bins
(signed, log-spaced: format/histbins.py), colour the share of the group's elements in the
bin (log scale). Only the bins any step uses are drawn.
"""

from __future__ import annotations

import math
import re

import numpy as np
from tracealyze.format.histbins import NBINS, ZERO_BIN, bin_edges

from ..context import ReportContext
from ..downsample import num
from ..figures import Chart, esc, figure, short

MAX_GROUPS = 4
"""Groups drawn per kind: the largest by element count (a page of 8 charts at most)."""
MAX_STEPS = 200
"""Histogram steps drawn per chart at most (evenly spaced over the run)."""
_NUMBER = re.compile(r"\d+")


def group_of(name: str) -> str:
    """``blocks.3.attn.weight`` -> ``blocks.*.attn.weight``."""
    return _NUMBER.sub("*", name)


def _label(b: int) -> str:
    """A bin as the axis names it: its lower edge (the zero and underflow bins by name)."""
    lo, hi = bin_edges(b)
    if b == ZERO_BIN:
        return "0"
    if lo == 0 or hi == 0:
        return f"({lo:.0e}, {hi:.0e})".replace("0e+00", "0")
    if math.isinf(lo):
        return f"≤{hi:.0e}"
    return f"≥{lo:.0e}" if math.isinf(hi) else f"{lo:.1e}"


def _groups(ctx: ReportContext, kind: str) -> list[tuple[str, list[int], np.ndarray]]:
    """(group, steps, [steps, NBINS] summed counts) of the largest groups of ``kind``."""
    rows = ctx.con.execute(
        "SELECT name, step, numel, counts FROM histograms WHERE rank = ? AND kind = ? "
        "AND step IS NOT NULL AND name IS NOT NULL AND len(counts) = ? ORDER BY step",
        [ctx.rank, kind, NBINS]).fetchall()
    if not rows:
        return []
    steps = sorted({int(r[1]) for r in rows})
    if len(steps) > MAX_STEPS:  # evenly spaced, first and last kept
        idx = np.linspace(0, len(steps) - 1, MAX_STEPS).round().astype(int)
        steps = [steps[i] for i in sorted(set(idx))]
    col = {s: i for i, s in enumerate(steps)}
    sums: dict[str, np.ndarray] = {}
    for name, step, _numel, counts in rows:
        j = col.get(int(step))
        if j is None:
            continue
        g = group_of(str(name))
        if g not in sums:
            sums[g] = np.zeros((len(steps), NBINS), dtype=np.int64)
        sums[g][j] += np.asarray(counts, dtype=np.int64)
    size = {g: int(c.sum(axis=1).max()) for g, c in sums.items()}  # (elements a step)
    top = sorted(sums, key=lambda g: (-size[g], g))[:MAX_GROUPS]
    return [(g, steps, sums[g]) for g in top]


def _chart(kind: str, i: int, group: str, steps: list[int], counts: np.ndarray
           ) -> Chart | None:
    totals = counts.sum(axis=1, keepdims=True)
    used = np.flatnonzero(counts.sum(axis=0) > 0)
    if not len(used) or not totals.any():
        return None
    lo, hi = int(used[0]), int(used[-1])
    bins = list(range(lo, hi + 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(totals > 0, counts / np.maximum(totals, 1), 0.0)
    z = [[num(math.log10(share[j, b]), 3) if share[j, b] > 0 else None
          for j in range(len(steps))] for b in bins]
    labels = [_label(b) for b in bins]
    every = max(1, math.ceil(len(bins) / 16))
    what = "weights" if kind == "param" else "gradients"
    trace = {"type": "heatmap", "x": steps, "y": list(range(len(bins))), "z": z,
             "colorscale": "Viridis", "zmin": -6, "zmax": 0,
             "colorbar": {"title": {"text": "share (log10)"}, "thickness": 10},
             "text": [[labels[k]] * len(steps) for k in range(len(bins))],
             "hovertemplate": "step %{x}<br>bin from %{text}<br>log10 share %{z}"
                              "<extra></extra>",
             "xgap": 0, "ygap": 0}
    fig = figure([trace], xtitle="step", ytitle="value (signed, log-spaced bins)",
                 yaxis={"tickvals": list(range(0, len(bins), every)),
                        "ticktext": labels[::every], "tickfont": {"size": 9},
                        "showgrid": False, "zeroline": False},
                 xaxis={"showgrid": False}, height=300)
    n = int(totals.max())
    return Chart(f"hist-{kind}-{i}", f"{short(esc(group), 60)} ({what})", fig,
                 f"Distribution of {n:,} {what} over {len(steps)} step(s); colour: share of "
                 "the elements in each bin.", wide=False)


def histogram_charts(ctx: ReportContext) -> list[Chart]:
    """Weights, then gradients: up to MAX_GROUPS charts each."""
    charts: list[Chart] = []
    for kind in ("param", "grad"):
        for i, (g, steps, counts) in enumerate(_groups(ctx, kind)):
            c = _chart(kind, i, g, steps, counts)
            if c is not None:
                charts.append(c)
    return charts

