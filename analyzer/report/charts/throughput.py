"""The report's throughput chart: samples/s or tokens/s per step (from the recorder's batch
shapes or ``rec.step(tokens=N)``) and, when the run knows its peak FLOP/s, model FLOPs
utilisation on a second axis."""

from __future__ import annotations

from typing import Any

from ..context import ReportContext
from ..downsample import bucket_rows, num
from ..figures import BLUE, ORANGE, Chart, figure, line


def throughput_chart(ctx: ReportContext) -> Chart | None:
    ok = "rank = ? AND isfinite(duration_s)"
    have = ctx.con.execute(
        f"SELECT count(tokens_per_s), count(samples_per_s), count(mfu), median(tokens_per_s), "
        f"median(samples_per_s), median(mfu), max(flops) FROM steps WHERE {ok}",
        [ctx.rank]).fetchone()
    if have is None or not (have[0] or have[1]):
        return None
    col, unit = ("tokens_per_s", "tokens/s") if have[0] else ("samples_per_s", "samples/s")
    rows = bucket_rows(ctx.con, "steps", "step",
                       {"v": f"median({col})", "m": "median(mfu)"},
                       where=ok, params=[ctx.rank], n=ctx.buckets)
    xs = [r["x"] for r in rows]
    traces: list[dict[str, Any]] = [line(xs, [num(r["v"]) for r in rows], unit, BLUE,
                                         hover="step %{x}<br>%{y:.4g} " + unit)]
    layout: dict[str, Any] = {}
    if have[2]:
        traces.append(line(xs, [num(r["m"] * 100 if r["m"] is not None else None)
                                for r in rows], "MFU", ORANGE,
                           hover="step %{x}<br>MFU %{y:.3g} %", yaxis="y2"))
        layout["yaxis2"] = {"title": {"text": "MFU (%)", "standoff": 12}, "overlaying": "y",
                            "side": "right", "rangemode": "tozero", "automargin": True,
                            "showgrid": False}
        layout["margin"] = {"r": 80}
    fig = figure(traces, xtitle="step", ytitle=unit, **layout)
    median = have[3] if have[0] else have[4]
    caption = (f"Median {median:,.0f} {unit} per rank" if median >= 100 else
               f"Median {median:.3g} {unit} per rank")
    if have[2]:
        caption += f"; model FLOPs {have[6]:.3g} per step, MFU {100 * have[5]:.3g} % (median)"
    elif have[6]:
        caption += f"; model FLOPs {have[6]:.3g} per step (give peak_flops= for MFU)"
    caption += (". Throughput from the batch shapes (padding included) or rec.step(tokens=); "
                "FLOPs counted once with torch.utils.flop_counter.")
    return Chart("throughput", "Throughput", fig, caption)
