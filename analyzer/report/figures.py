"""Small helpers shared by the report's chart builders: the Chart record, plotly figure specs,
text escaping for plotly, units, and finding markers.

Figures are plain plotly.js specs (dicts of ``data`` and ``layout``) serialised into the page;
the page's script only hands them to ``Plotly.newPlot``. Shared styling lives in the page's
script so the specs stay small.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..diagnosis.findings import Finding

# Colours (Tailwind-ish palette, readable on white and distinguishable for common colour-blindness).
BLUE = "#2563eb"
ORANGE = "#ea580c"
GREEN = "#16a34a"
PURPLE = "#7c3aed"
GREY = "#64748b"
RED = "#dc2626"
TEAL = "#0d9488"
PALETTE = (BLUE, ORANGE, GREEN, PURPLE, TEAL, "#db2777", "#ca8a04", GREY)
SEVERITY_COLOURS = {"info": "#0284c7", "warning": "#d97706", "error": RED, "critical": "#7f1d1d"}


@dataclass
class Chart:
    """One chart of the report: an anchor (``id`` of its element), a heading and a figure."""

    anchor: str
    title: str
    figure: dict[str, Any]
    caption: str = ""
    """One line under the chart (plain text; the template escapes it)."""
    wide: bool = True
    """Full width; False lets two charts share a row."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Data the page's script needs besides the figure (e.g. heatmap row names for hover)."""

    def to_json(self) -> dict[str, Any]:
        return {"anchor": self.anchor, "figure": self.figure, "extra": self.extra}


def esc(text: Any, limit: int = 200) -> str:
    """Untrusted text for plotly labels, legends and hover text.

    Plotly renders a subset of HTML in these strings and decodes entities, so escaping makes
    a hostile parameter name show literally instead of being interpreted. Without ``<`` no
    tag can form, so quotes stay as they are (plotly does not decode ``&quot;``). Long text
    is cut.
    """
    s = "" if text is None else str(text)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


def short(text: str, limit: int = 48) -> str:
    """Middle-ellipsis (keeps both the module prefix and the parameter suffix), escaped."""
    if len(text) > limit:
        half = (limit - 1) // 2
        text = text[:half] + "…" + text[-(limit - 1 - half):]
    return esc(text, limit + 1)


def figure(traces: list[dict[str, Any]], *, xtitle: str, ytitle: str,
           **layout: Any) -> dict[str, Any]:
    """A plotly figure spec with axis titles (with units) set."""
    lay: dict[str, Any] = {
        "xaxis": {"title": {"text": xtitle}},
        "yaxis": {"title": {"text": ytitle}},
    }
    for k, v in layout.items():
        if k in lay and isinstance(v, dict):
            lay[k] = {**lay[k], **v}
        else:
            lay[k] = v
    return {"data": traces, "layout": lay}


def line(x: list[Any], y: list[Any], name: str, colour: str, *, hover: str, width: float = 1.5,
         **kw: Any) -> dict[str, Any]:
    """A scatter line trace (``name`` must already be escaped when untrusted)."""
    return {"type": "scatter", "mode": "lines", "x": x, "y": y, "name": name,
            "line": {"color": colour, "width": width}, "hovertemplate": hover, **kw}


def flat_range(ys: list[Any]) -> list[float] | None:
    """An explicit y range for a constant series: plotly's autorange would put a constant
    1e-3 learning rate in a -1..1 window where it reads as 0."""
    vals = {v for v in ys if v is not None}
    if len(vals) != 1:
        return None
    v = next(iter(vals))
    pad = abs(v) * 0.5 or 1.0
    return [v - pad, v + pad]


def time_unit(typical_s: float) -> tuple[float, str]:
    """(multiplier, unit): milliseconds for sub-second steps, else seconds."""
    return (1000.0, "ms") if typical_s < 1.0 else (1.0, "s")


def finding_markers(findings: list[Finding], anchor: str) -> tuple[list, list]:
    """Vertical dotted lines (shapes, annotations) at the first step of the findings that point
    at ``anchor``, so the chart shows where each problem starts."""
    shapes, notes = [], []
    seen = set()
    for f in findings:
        if f.chart != anchor or f.first_step is None or f.severity == "info":
            continue
        colour = SEVERITY_COLOURS.get(f.severity, GREY)
        x = f.first_step
        if (x, f.id) in seen:  # e.g. two leaking counters from the same step
            continue
        seen.add((x, f.id))
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x,
                       "y0": 0, "y1": 1, "line": {"color": colour, "width": 1.5, "dash": "dot"}})
        # Inside the plot, right of the line: the strip above the plot holds the legend and
        # buttons.
        notes.append({"xref": "x", "yref": "paper", "x": x, "y": 1, "yanchor": "top",
                      "xanchor": "left", "showarrow": False, "text": esc(f.id, 40),
                      "font": {"color": colour, "size": 11}, "bgcolor": "rgba(255,255,255,0.8)"})
    return shapes, notes


def spans_shapes(spans: list[tuple[int, int]], colour: str = RED) -> list[dict[str, Any]]:
    """Translucent full-height bands over step ranges (e.g. steps with NaN/Inf)."""
    return [{"type": "rect", "xref": "x", "yref": "paper", "x0": a - 0.5, "x1": b + 0.5,
             "y0": 0, "y1": 1, "fillcolor": colour, "opacity": 0.18, "line": {"width": 0},
             "layer": "below"} for a, b in spans]


def log_axis(ys: list[Any]) -> dict[str, Any]:
    """A log y axis whose ticks are labelled in full (0.5, 5, 50, not Plotly's lone leading
    digits "5" next to "5" meaning 0.5 and 50): 1-2-5 per decade over up to three decades,
    1-3 up to six, decades beyond, as plain numbers (1e+06 when long)."""
    vals = [float(v) for v in ys if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return {"type": "log"}
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    hi = max(hi, lo + 1)
    steps = (1, 2, 5) if hi - lo <= 3 else (1, 3) if hi - lo <= 6 else (1,)
    every = max(1, (hi - lo) // 12)
    ticks = [m * 10.0 ** k for k in range(lo, hi + 1, every) for m in steps
             if m * 10.0 ** k <= 10.0 ** hi]
    return {"type": "log", "tickmode": "array", "tickvals": ticks,
            "ticktext": [f"{t:.3g}" for t in ticks]}
