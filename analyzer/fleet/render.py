"""The fleet as text: what is wrong across the fleet first, then the worst runs."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .fleet import FleetResult, run_severity

_MARK = {"info": "·", "warning": "!", "error": "✗", "critical": "✗✗", None: " "}


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "?"


def _line(r: dict[str, Any]) -> str:
    sev = run_severity(r)
    what = (r.get("error") or "") if r.get("status") == "unreadable" else (
        f"{r['top_finding']}" + (f" ({r['top_subject']})" if r.get("top_subject") else "")
        + (f" from step {r['top_first_step']}" if r.get("top_first_step") is not None else "")
        if r.get("top_finding") else "no finding above info")
    return (f"  {_MARK.get(sev, ' '):2s} {r.get('status') or '?':10s} {_when(r.get('started'))}"
            f"  {r.get('steps') or 0:>7,} steps  ×{r.get('world_size') or 1:<3}  {r['path']}\n"
            f"       {what[:160]}")


def render_text(result: FleetResult, *, limit: int = 50) -> str:
    runs = result.runs
    status = Counter(r.get("status") for r in runs)
    by_sev = Counter(run_severity(r) for r in runs)
    lines = [
        f"fleet  {len(runs)} runs under {', '.join(result.roots)}  "
        f"({result.analysed} analysed, {result.reused} from the index"
        + (f", {result.removed} gone" if result.removed else "")
        + f"; {result.elapsed_s:.1f} s)",
        "status: " + ", ".join(f"{n} {s}" for s, n in status.most_common()),
        "worst finding per run: " + ", ".join(
            f"{by_sev.get(s, 0)} {s}" for s in ("critical", "error", "warning")) +
        f", {sum(1 for r in runs if not run_severity(r) or run_severity(r) == 'info')} clean",
        f"index: {result.index}",
    ]
    if result.fleet_findings:
        lines += ["", "across runs:"]
        for f in result.fleet_findings:
            lines.append(f"  {_MARK[f['severity']]:2s} {f['id']}  {f['title']}")
            lines.append(f"       {f['message']}")
    bad = [r for r in runs if (run_severity(r) not in (None, "info"))
           or r.get("status") not in ("completed",)]
    if bad:
        lines += ["", f"runs with something to look at ({len(bad)}, worst first):"]
        lines += [_line(r) for r in bad[:limit]]
        if len(bad) > limit:
            lines.append(f"  … {len(bad) - limit} more (--json or -o fleet.html for all)")
    elif runs:
        lines += ["", "every run completed with no finding above info"]
    return "\n".join(lines)
