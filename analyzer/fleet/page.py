"""``tracealyze fleet -o fleet.html``: one offline page in the report's style: the fleet's
own findings, runs per day by their worst finding, and a sortable, filterable table of
runs, each linking to its report when ``--reports`` wrote them."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..diagnosis.findings import severity_rank
from ..report.figures import Chart
from ..report.text import human_bytes
from .fleet import FleetResult, run_severity

_COLOURS = {"critical": "#7f1d1d", "error": "#dc2626", "warning": "#d97706", "clean": "#16a34a"}


def report_name(path: str) -> str:
    """A run's report file name: its folder name and a hash of its full path (two runs in
    folders of the same name stay apart; nothing of the name becomes a path)."""
    tail = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.rstrip("/")
                   .rsplit("/", 1)[-1])[:60].lstrip(".") or "run"
    return f"{tail}-{hashlib.sha1(path.encode(), usedforsecurity=False).hexdigest()[:10]}.html"


def write_reports(result: FleetResult, folder: Path,
                  progress: Callable[[int, int], None] | None = None) -> dict[str, str]:
    """Each readable run's report in ``folder`` (made beside the page the user named; never
    a link), written when missing or when the run was analysed again since; run path ->
    file name. A report that fails is left out (its row then has no link), never stopping
    the others. Each is built in a private folder of ours, then copied into ``folder``
    through its descriptor (a new file renamed into place: no link is written through)."""
    from ..errors import TracealyzeError
    from ..report.page import write_report
    from ..writes import Dir, private_dir, remove_tree

    out: dict[str, str] = {}
    todo = [r for r in result.runs if r.get("status") != "unreadable"]
    scratch = private_dir(prefix="tracealyze-reports-")
    try:
        with Dir.open(folder.parent, create=True) as parent, parent.sub(folder.name) as d, \
                Dir.open(scratch) as tmp:
            for i, r in enumerate(todo, start=1):
                name = report_name(r["path"])
                done = d.mtime(name)
                if done is None or done < (r.get("analysed_at") or 0):
                    try:
                        write_report(r["path"], scratch / name, progress=False)
                        d.copy_atomic(name, scratch / name)
                    except (TracealyzeError, OSError):
                        continue
                    finally:
                        tmp.remove(name)
                out[r["path"]] = name
                if progress:
                    progress(i, len(todo))
    finally:
        remove_tree(scratch)
    return out


def _timeline(runs: list[dict[str, Any]]) -> Chart:
    days = sorted({time.strftime("%Y-%m-%d", time.gmtime(r["started"]))
                   for r in runs if r.get("started")})
    count: Counter[tuple[str, str]] = Counter()
    for r in runs:
        if r.get("started"):
            sev = run_severity(r)
            count[(time.strftime("%Y-%m-%d", time.gmtime(r["started"])),
                   sev if sev in ("critical", "error", "warning") else "clean")] += 1
    data = [{"type": "bar", "name": s, "x": days, "y": [count[(d, s)] for d in days],
             "marker": {"color": c}} for s, c in _COLOURS.items()]
    return Chart("timeline", "Runs started per day, by worst finding",
                 {"data": data, "layout": {"barmode": "stack", "xaxis": {"type": "category"},
                                           "yaxis": {"title": {"text": "runs"}}}},
                 caption="A day where red grows is where to look: a bad node, a broken data "
                         "release, a library upgrade.")


def _row(r: dict[str, Any], reports: dict[str, str], prefix: str) -> dict[str, Any]:
    sev = run_severity(r)
    peak = r.get("peak_cuda_allocated_bytes") or r.get("peak_rss_bytes")
    tput = r.get("throughput_steps_per_s")
    return {**r, "sev": sev if sev != "info" else None,
            "sev_rank": severity_rank(sev) if sev else -1,
            "started_text": time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["started"]))
            if r.get("started") else "",
            "report": f"{prefix}{reports[r['path']]}" if r["path"] in reports else None,
            "peak_bytes": peak, "peak_text": human_bytes(peak) if peak else "",
            "throughput_text": f"{tput:.3g}" if tput else ""}


def write_page(result: FleetResult, out: Path, reports: dict[str, str] | None = None,
               reports_prefix: str = "") -> Path:
    """The fleet page at ``out`` (links to ``reports_prefix + name``)."""
    from ..report.page import render
    from ..writes import write_file

    runs = [_row(r, reports or {}, reports_prefix) for r in result.runs]
    status = Counter(r.get("status") for r in result.runs)
    worst = max((run_severity(r) for r in result.runs if run_severity(r)),
                key=severity_rank, default=None)
    bad = sum(1 for r in runs if r["sev"] in ("critical", "error"))
    model = {
        "result": result, "runs": runs, "charts": [_timeline(result.runs)],
        "status_line": ", ".join(f"{n} {s}" for s, n in status.most_common()),
        "headline": (f"{bad} runs with errors" if bad else
                     "warnings only" if worst == "warning" else "healthy"),
        "headline_class": "bad" if bad else "warn" if worst == "warning" else "ok",
    }
    write_file(out, render(model, "fleet.html.j2", page_js="fleet.js"))
    return out
