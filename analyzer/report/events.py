"""Events section of the report: a timeline chart and the list of events with collapsible
stack traces. Identical events are grouped (a recorder error repeated 10,000 times is one row
with a count) and both parts are bounded however many events the run has."""

from __future__ import annotations

import math
from typing import Any

from ..diagnosis.display import MAX_NAME, clip, more
from ..diagnosis.findings import SEVERITIES
from .context import ReportContext
from .downsample import bucket_expr, x_range
from .figures import PALETTE, SEVERITY_COLOURS, Chart, esc, figure

MAX_ROWS = 200
"""Event groups listed (most severe first, then earliest)."""
MAX_MESSAGE = 2000
MAX_STACK = 8000
"""Characters kept of a message / stack trace (the list must not blow the file size up)."""
TIMELINE_BUCKETS = 400
MAX_HOVER = 300
"""Characters of a message or subject in the timeline's hover text."""

_SEV_RANK = "CASE severity WHEN 'critical' THEN 3 WHEN 'error' THEN 2 WHEN 'warning' THEN 1 " \
            "ELSE 0 END"


def event_rows(ctx: ReportContext) -> tuple[list[dict[str, Any]], int, int]:
    """(grouped rows for the list, number of groups, number of events)."""
    total = ctx.scalar("SELECT count(*) FROM events") or 0
    if not total:
        return [], 0, 0
    groups = ctx.scalar(
        "SELECT count(*) FROM (SELECT DISTINCT kind, severity, subject, message, stack "
        "FROM events)") or 0
    # Cut in SQL: a 100 MB message is grouped on, never fetched (nor put into the page).
    rows = ctx.con.execute(
        f"""SELECT left(kind, {MAX_NAME}), severity, left(subject, {MAX_NAME}),
                   left(message, {MAX_MESSAGE}), length(message),
                   left(stack, {MAX_STACK}), length(stack), count(*) AS n,
                   min(step) AS first_step, max(step) AS last_step, min(time) AS t,
                   list(DISTINCT rank ORDER BY rank) AS ranks,
                   left(arg_min(details, time), 1001) AS details,
                   max({_SEV_RANK}) AS sev
            FROM events GROUP BY kind, severity, subject, message, stack
            ORDER BY sev DESC, t LIMIT {MAX_ROWS}""").fetchall()
    out = []
    for kind, sev, subject, msg, mlen, stack, slen, n, s0, s1, t, ranks, details, _ in rows:
        out.append({
            "kind": kind or "", "severity": sev if sev in SEVERITIES else "info",
            "subject": subject, "message": more(msg, mlen) if msg is not None else "",
            "stack": more(stack, slen) if stack is not None else None,
            "details": clip(details, 1000) if details not in (None, "", "{}") else None,
            "count": int(n), "first_step": s0, "last_step": s1, "time": t,
            "ranks": ", ".join(str(r) for r in (ranks or [])[:16]),
        })
    out.sort(key=lambda r: (r["time"] is None, r["time"] or 0.0))
    return out, int(groups), int(total)


def events_chart(ctx: ReportContext) -> Chart | None:
    """Events against step, one row per severity, one colour per kind; grouped per step range
    so the chart stays bounded."""
    if not ctx.scalar("SELECT count(*) FROM events"):
        return None
    run_xr = x_range(ctx.con, "steps", "step") or (0.0, 0.0)
    ev_xr = x_range(ctx.con, "events", "step")
    lo = min(run_xr[0], ev_xr[0]) if ev_xr else run_xr[0]
    hi = max(run_xr[1], ev_xr[1]) if ev_xr else run_xr[1]
    # Events before the first step have no step: show them at the start.
    x = f"coalesce(step, {int(lo)})"
    b = bucket_expr(x, lo, hi, TIMELINE_BUCKETS)
    rows = ctx.con.execute(
        f"""SELECT kind, severity, {b} AS b, min({x}) AS s, count(*) AS n,
                   left(arg_min(message, time), {MAX_HOVER}) AS msg,
                   left(arg_min(subject, time), {MAX_HOVER}) AS subj
            FROM events GROUP BY ALL ORDER BY kind, b""").fetchall()
    kinds = sorted({r[0] or "" for r in rows})
    traces = []
    for i, kind in enumerate(kinds[:24]):
        pts = [r for r in rows if (r[0] or "") == kind]
        traces.append({
            "type": "scatter", "mode": "markers", "name": esc(kind, 40),
            "x": [r[3] for r in pts],
            "y": [r[1] if r[1] in SEVERITIES else "info" for r in pts],
            "customdata": [[r[4], esc(r[5], 160), esc(r[6], 80)] for r in pts],
            "marker": {"size": [min(22, 8 + 3 * math.log10(r[4])) for r in pts],
                       "color": PALETTE[i % len(PALETTE)], "opacity": 0.85,
                       "line": {"width": 1,
                                "color": [SEVERITY_COLOURS.get(r[1], "#64748b") for r in pts]}},
            "hovertemplate": "<b>" + esc(kind, 40) + "</b> ×%{customdata[0]}<br>step %{x}"
                             "<br>%{customdata[2]}<br>%{customdata[1]}<extra></extra>",
        })
    fig = figure(traces, xtitle="step", ytitle="severity",
                 yaxis={"type": "category", "categoryorder": "array",
                        "categoryarray": list(SEVERITIES), "range": [-0.5, 3.5]},
                 xaxis={"range": [lo - 0.02 * (hi - lo) - 0.5, hi + 0.02 * (hi - lo) + 0.5]},
                 height=300)
    return Chart("events", "Events", fig,
                 "Marker size grows with the number of events at that point; details below.")
