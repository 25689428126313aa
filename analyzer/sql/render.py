"""Query results as text: an aligned table for the terminal, and values made strict JSON."""

from __future__ import annotations

import math
from typing import Any


def render_table(cols: list[str], rows: list[tuple[Any, ...]]) -> str:
    """Columns aligned (numbers to the right), NULL for None, a row count at the end."""
    def cell(v: Any) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    body = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(cols)]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) and rows
               for i in range(len(cols))]

    def line(vals: list[str]) -> str:
        return "  ".join(v.rjust(w) if numeric[i] else v.ljust(w)
                         for i, (v, w) in enumerate(zip(vals, widths, strict=True))).rstrip()

    out = [line(cols), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in body]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def json_value(v: Any) -> Any:
    """``v`` as strict JSON: NaN/Inf as null, other non-JSON values as text."""
    if isinstance(v, float) and not math.isfinite(v):
        return None  # strict JSON has no NaN/Inf
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    return str(v)
