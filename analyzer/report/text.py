"""Human-readable numbers for the report: evidence values, sizes, durations, counts."""

from __future__ import annotations

import json
import math
from typing import Any

from ..units import fmt_bytes

MAX_TABLE_ROWS = 10
MAX_TABLE_COLS = 6


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; three significant digits, keeps the sign (a shrinking counter)."""
    return fmt_bytes(n, ".3g")


def human_duration(seconds: float | None) -> str:
    """3725 -> '1 h 2 min'; 0.0123 -> '12.3 ms'."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = float(seconds)
    if s < 1e-3:
        return f"{s * 1e6:.3g} µs"
    if s < 1:
        return f"{s * 1000:.3g} ms"
    if s < 60:
        return f"{s:.3g} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def human_count(n: float | None) -> str:
    """4_000_000 -> '4.0 M' (parameter counts)."""
    if n is None:
        return "—"
    n = float(n)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f} {suffix}"
    return f"{n:.0f}"


def format_value(key: str, value: Any) -> str:
    """An evidence value as a user would want to read it, guessing the unit from the key
    (the detectors name them ``..._bytes``, ``..._s``, ``..._us``, ``..._pct`` ...)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        k = key.lower()
        if not math.isfinite(float(value)):
            return str(value)
        if "bytes" in k:
            return human_bytes(value)
        if k.endswith(("_s", "_seconds")):
            return human_duration(value)
        if k.endswith("_us"):
            return human_duration(value / 1e6)
        if k.endswith("_ms"):
            return human_duration(value / 1e3)
        if k.endswith(("_pct", "_percent")):
            return f"{value:.3g}%"
        if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
            return f"{int(value):,}"
        return f"{value:.4g}"
    if isinstance(value, str):
        return value if len(value) <= 300 else value[:299] + "…"
    if key.lower().endswith("ranks") and isinstance(value, (list, tuple)):
        # 'ranks leaking: 0' read as "no rank leaks"; say which ranks
        if not value:
            return "none"
        return ("rank " if len(value) == 1 else "ranks ") + ", ".join(map(str, value[:12])) + (
            f", … ({len(value)} in all)" if len(value) > 12 else "")
    if isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in value):
        shown = ", ".join(format_value(key, v) for v in value[:12])
        return shown + (f", … ({len(value)} in all)" if len(value) > 12 else "")
    if isinstance(value, dict):
        if not value:
            return "none"
        if all(isinstance(v, (int, float, str, type(None))) for v in value.values()):
            items = [f"{k}: {format_value(key, v)}" for k, v in list(value.items())[:12]]
            return ", ".join(items) + (", …" if len(value) > 12 else "")
    text = json.dumps(value, default=str)
    return text if len(text) <= 300 else text[:299] + "…"


_UNIT_SUFFIXES = ("_bytes", "_us", "_ms", "_s", "_seconds", "_pct", "_percent")


def _label(key: str, value: Any) -> str:
    """'idle_us' -> 'idle' when the value is shown with its unit ('12.9 s')."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for suffix in _UNIT_SUFFIXES:
            if key.endswith(suffix) and len(key) > len(suffix):
                key = key[: -len(suffix)]
                break
    return key.replace("_", " ")


def _table(key: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    cols: list[str] = []
    for r in rows:
        cols.extend(c for c in r if c not in cols)
    cols = cols[:MAX_TABLE_COLS]
    return {"columns": [_label(c, rows[0].get(c)) for c in cols],
            "rows": [[format_value(c, r.get(c)) for c in cols] for r in rows[:MAX_TABLE_ROWS]],
            "more": max(0, len(rows) - MAX_TABLE_ROWS)}


def format_evidence(evidence: dict[str, Any], limit: int = 14) -> dict[str, list[Any]]:
    """A finding's evidence for the page: ``values`` as (label, text) pairs, and ``tables``
    (label, table) for lists of records (e.g. top ops), which read badly as JSON."""
    values: list[tuple[str, str]] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in list(evidence.items())[:limit]:
        label = _label(str(key), value)
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append((label, _table(str(key), value)))
        else:
            values.append((label, format_value(str(key), value)))
    return {"values": values, "tables": tables}
