"""Bounded-size series for the report, computed in DuckDB.

Every chart embeds at most a fixed number of points however long the run is: the x range is
cut into ``n`` equal buckets and each bucket keeps its minimum *and* maximum (with the x at
which each occurred), so a one-step spike in a million-step run still shows on the chart.
Nonfinite values (NaN/Inf) are left out of the envelopes; charts mark them separately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import duckdb

DEFAULT_BUCKETS = 1000
"""Buckets per line chart: at most 2 points (min and max) per bucket per series."""


def num(v: Any, digits: int = 5) -> float | None:
    """``v`` rounded to ``digits`` significant digits for embedding; None when not finite.

    Rounding keeps the embedded JSON small; 5 digits is far below what a chart can show.
    """
    if v is None:
        return None
    f = float(v)
    if not math.isfinite(f):
        return None
    return float(f"{f:.{digits}g}")


@dataclass
class Envelope:
    """Min/max envelope of one series: points sorted by x, ready for a plotly line."""

    x: list[int | float] = field(default_factory=list)
    y: list[float | None] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.x)


def x_range(con: duckdb.DuckDBPyConnection, source: str, x: str,
            where: str = "TRUE", params: list[Any] | None = None) -> tuple[float, float] | None:
    """(min, max) of ``x`` over ``source`` rows matching ``where``; None when there are none."""
    row = con.execute(
        f"SELECT min({x}), max({x}) FROM {source} WHERE {where} AND {x} IS NOT NULL",
        params or [],
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return float(row[0]), float(row[1])


def bucket_expr(x: str, lo: float, hi: float, n: int) -> str:
    """SQL for the bucket index (0..n-1) of ``x`` over [lo, hi]."""
    span = max(hi - lo, 1e-12)
    # Integer x (steps): when the run is shorter than n steps every step gets its own bucket.
    return f"least(floor(({x} - {lo!r}) * {n} / {span!r}), {n - 1})::BIGINT"


def envelopes(
    con: duckdb.DuckDBPyConnection,
    source: str,
    x: str,
    ys: list[str],
    *,
    where: str = "TRUE",
    params: list[Any] | None = None,
    n: int = DEFAULT_BUCKETS,
    xr: tuple[float, float] | None = None,
) -> dict[str, Envelope]:
    """Min/max envelopes of the expressions ``ys`` against ``x`` in one scan of ``source``."""
    xr = xr or x_range(con, source, x, where, params)
    if xr is None:
        return {y: Envelope() for y in ys}
    b = bucket_expr(x, xr[0], xr[1], n)
    aggs = []
    for i, y in enumerate(ys):
        ok = f"isfinite(({y})::DOUBLE)"
        f = f"FILTER (WHERE {ok})"
        aggs.append(
            f"arg_min({x}, {y}) {f} AS xl{i}, min({y}) {f} AS yl{i}, "
            f"arg_max({x}, {y}) {f} AS xh{i}, max({y}) {f} AS yh{i}"
        )
    rows = con.execute(
        f"SELECT {b} AS b, {', '.join(aggs)} FROM {source} "
        f"WHERE {where} AND {x} IS NOT NULL GROUP BY b ORDER BY b",
        params or [],
    ).fetchall()
    out: dict[str, Envelope] = {}
    for i, y in enumerate(ys):
        env = Envelope()
        for row in rows:
            xl, yl, xh, yh = row[1 + 4 * i: 5 + 4 * i]
            if xl is None:
                continue
            pts = sorted({(xl, yl), (xh, yh)}, key=lambda p: p[0])
            for px, py in pts:
                env.x.append(_x(px))
                env.y.append(num(py))
        out[y] = env
    return out


def bucket_rows(
    con: duckdb.DuckDBPyConnection,
    source: str,
    x: str,
    aggs: dict[str, str],
    *,
    where: str = "TRUE",
    params: list[Any] | None = None,
    n: int = DEFAULT_BUCKETS,
    group: str | None = None,
    xr: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per bucket (and ``group`` value) with the SQL aggregates ``aggs`` (name -> SQL).

    Each row also has ``x``: the first x in the bucket.
    """
    xr = xr or x_range(con, source, x, where, params)
    if xr is None:
        return []
    b = bucket_expr(x, xr[0], xr[1], n)
    cols = ", ".join(f"{expr} AS {name}" for name, expr in aggs.items())
    g = f", {group} AS g" if group else ""
    gb = ", g" if group else ""
    cur = con.execute(
        f"SELECT {b} AS b{g}, min({x}) AS x, {cols} FROM {source} "
        f"WHERE {where} AND {x} IS NOT NULL GROUP BY b{gb} ORDER BY {'g, ' if group else ''}b",
        params or [],
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _x(v: Any) -> int | float:
    f = float(v)
    return int(f) if f.is_integer() else round(f, 3)
