"""How quantities are written for people: bytes in binary units (the summary, the report and
the detectors' messages say the same thing the same way)."""

from __future__ import annotations


def fmt_bytes(n: float, spec: str = ".1f") -> str:
    """1536 → '1.5 KiB'; keeps the sign (a shrinking counter); ``spec`` formats the number."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{sign}{n:{spec}} {unit}" if unit != "B" else f"{sign}{n:.0f} B"
        n /= 1024
    return f"{sign}{n:{spec}} TiB"


def single_line(text: object, limit: int = 500) -> str:
    """``text`` for a place that shows one line (a run id in a header, the summary's first
    line): control and format characters (newlines, escape sequences, bidi overrides) are
    written as escapes, so a stranger's run id can neither start a line of its own in a
    file nor drive the terminal; cut at ``limit`` characters."""
    import unicodedata

    s = str(text)[:limit]
    return "".join(c if unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp")
                   else c.encode("unicode_escape").decode("ascii") for c in s)
