"""training_crashed: the run ended in an exception, was killed without a word (status still
running, heartbeat stale), or is still in progress (info)."""

from __future__ import annotations

import json
from typing import Any

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from .base import Context

ID = "training_crashed"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {
    "stale_after_s": 0.0,   # heartbeat age that means "killed"; 0 = 3 flushes + 30 s
}
DOC = {
    "meaning": "Training did not finish: an exception, a signal, or the process was killed "
               "(OOM killer, SIGKILL, node loss) without closing the recorder.",
    "rule": "status crashed or an exception event (critical); status running with a "
            "heartbeat older than stale_after_s (error); running with a fresh heartbeat is "
            "reported as in progress (info).",
    "fixes": "Read the exception and its stack in the events table; for a silent kill check "
             "dmesg for the OOM killer, the scheduler's logs, and memory_leak findings.",
}


def _exc_type(message: str | None, details: str | None) -> str | None:
    try:
        d = json.loads(details) if details else {}
    except ValueError:
        d = {}
    for k in ("type", "exc_type", "exception"):
        if isinstance(d, dict) and d.get(k):
            return str(d[k])
    if message and ":" in message:
        head = message.split(":", 1)[0].strip()
        if head and " " not in head:
            return head
    return None


def _last(step: int | None) -> str:
    return (f"the last recorded step was {step}" if step is not None
            else "no step had been recorded")


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    run = ctx.run
    last = ctx.rows("SELECT rank, max(step) FROM steps GROUP BY rank ORDER BY rank")
    last_step = {int(r): (int(s) if s is not None else None) for r, s in last}
    overall_last = max([s for s in last_step.values() if s is not None], default=None)
    exc = ctx.rows(
        "SELECT rank, step, message, details, stack, kind FROM events "
        "WHERE kind IN ('exception', 'signal') ORDER BY kind = 'signal', time LIMIT 1")
    status = run.status
    if status == "crashed" or (exc and exc[0][5] == "exception"):
        ev: dict[str, Any] = {"status": status, "last_step": overall_last,
                              "last_step_by_rank": last_step}
        subject, first, what = None, overall_last, "The run crashed"
        crashed = [r for r, m in sorted(run.rank_meta.items()) if m.get("status") == "crashed"]
        if crashed:
            ev["crashed_ranks"] = crashed
            subject = f"rank {crashed[0]}"
        if exc:
            r, step, message, details, stack, _kind = exc[0]
            etype = _exc_type(message, details)
            subject = etype or subject
            first = step if step is not None else first
            what = f"The run crashed on rank {r}" + (f" at step {step}" if step is not None
                                                     else "") + f": {message}"
            ev.update({"exception": message, "exception_type": etype, "rank": r,
                       "stack_tail": (stack or "").strip().splitlines()[-3:]})
        return [Finding(
            id=ID, severity="critical", subject=subject, first_step=first,
            title="Training crashed" + (f" ({subject})" if subject else ""),
            message=f"{what}; {_last(overall_last)}.",
            advice=DOC["fixes"], evidence=ev, chart=anchors.EVENTS)]
    if status != "running":
        return []
    limit = float(th.stale_after_s) or run.stale_after_s
    stale = run.stale_ranks(limit)
    age = run.heartbeat_age_s()
    ev = {"status": status, "heartbeat_age_s": age, "stale_after_s": limit,
          "last_step": overall_last, "last_step_by_rank": last_step}
    if stale:
        ev["stale_ranks"] = stale
        r = stale[0]
        signal = exc[0][2] if exc and exc[0][5] == "signal" else None
        return [Finding(
            id=ID, severity="error", subject=f"rank {r}",
            first_step=last_step.get(r, overall_last),
            title="Training was killed without closing the recorder",
            message=(f"The run is still marked running but rank {r} has not written for "
                     f"{run.heartbeat_age_s(r) or 0:.0f} s (limit {limit:.0f} s); "
                     f"{_last(last_step.get(r, overall_last))}."
                     + (f" Last signal: {signal}." if signal else "")),
            advice=DOC["fixes"], evidence=ev, chart=anchors.EVENTS)]
    return [Finding(
        id=ID, severity="info", subject=None, first_step=overall_last,
        title="Run in progress",
        message=(f"The run is still running (last heartbeat {age or 0:.0f} s ago; it is "
                 f"presumed killed after {limit:.0f} s without one); "
                 + (f"findings cover the data up to step {overall_last}."
                    if overall_last is not None else
                    "no step has been recorded yet (the first data is written after one "
                    "flush interval).")),
        advice="Re-run the analysis when it has finished.", evidence=ev)]
