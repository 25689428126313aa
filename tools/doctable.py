"""The findings table of README.md and docs/ANALYZER.md, generated from the detectors.

Each detector documents itself (``DOC``: meaning, rule, fixes; ``DEFAULTS``: thresholds), so
the table can never drift from the code: ``python tools/doctable.py --write``
rewrites it between the ``<!-- findings-table -->`` markers, and a test fails when a file is
out of date.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tracealyze.analyzer.diagnosis.detectors import base

START, END = "<!-- findings-table", "<!-- /findings-table -->"


def findings_table() -> str:
    """Markdown table: id, meaning, what it needs, rule, default thresholds, typical fixes."""
    mods, _ = base.discover()
    rows = ["| id | meaning | needs | rule | default thresholds | typical fixes |",
            "|---|---|---|---|---|---|"]
    for m in sorted(mods, key=lambda m: m.ID):
        doc = getattr(m, "DOC", {})
        defaults = ", ".join(f"`{k}={v}`" for k, v in m.DEFAULTS.items())
        needs = ", ".join(m.NEEDS) or "–"
        cells = [f"`{m.ID}`", doc.get("meaning", ""), needs, doc.get("rule", ""), defaults,
                 doc.get("fixes", "")]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def replace_table(text: str, table: str) -> str:
    """``text`` with the table between the markers replaced (ValueError without markers)."""
    pat = re.compile(re.escape(START) + r"[^\n]*\n.*?" + re.escape(END), re.S)
    m = pat.search(text)
    if m is None:
        raise ValueError("no <!-- findings-table --> ... <!-- /findings-table --> markers")
    head = m.group(0).split("\n", 1)[0]
    return text[: m.start()] + f"{head}\n{table}\n{END}" + text[m.end():]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path,
                    default=[Path("README.md"), Path("docs/ANALYZER.md")])
    ap.add_argument("--write", action="store_true", help="rewrite the files in place")
    args = ap.parse_args(argv)
    table = findings_table()
    stale = []
    for f in args.files:
        text = f.read_text()
        new = replace_table(text, table)
        if new != text:
            stale.append(f)
            if args.write:
                f.write_text(new)
    if stale and not args.write:
        print("out of date: " + ", ".join(map(str, stale)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
