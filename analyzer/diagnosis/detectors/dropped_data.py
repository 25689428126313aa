"""dropped_data: the recording is incomplete (recorder dropped rows, had errors, or part files
are unreadable), so other findings may miss something."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..findings import Finding
from ..thresholds import Thresholds
from .base import Context

ID = "dropped_data"
NEEDS: tuple[str, ...] = ()
DEFAULTS: dict[str, Any] = {
    "max_dropped_rows": 0,      # more dropped rows than this → warning
    "max_recorder_errors": 0,   # more recorder errors than this → warning
}
DOC = {
    "meaning": "Telemetry is missing: the recorder dropped rows or hit errors, or part files "
               "are unreadable (torn writes).",
    "rule": "run.json / ranks/*.json counters (dropped, recorder_errors), dropped_data / "
            "recorder_error events, and part files the analyzer had to skip.",
    "fixes": "Raise the recorder's queue/flush settings or use a lighter preset; check disk "
             "space and that the run dir is not on a flaky network filesystem; look at the "
             "recorder_error events' messages.",
}


def _counters(meta: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    c = meta.get("counters") or {}
    dropped = {str(k): int(v or 0) for k, v in (c.get("dropped") or {}).items()
               if isinstance(v, (int, float))}
    errs = c.get("recorder_errors") or 0
    return dropped, int(errs) if isinstance(errs, (int, float)) else 0


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    run = ctx.run
    dropped: dict[str, int] = {}
    errors = 0
    # rank files count per rank; run.json may hold rank 0's or a total: take the larger
    sources = list(run.rank_meta.values())
    rank_dropped: dict[str, int] = {}
    for m in sources:
        d, e = _counters(m)
        errors += e
        for k, v in d.items():
            rank_dropped[k] = rank_dropped.get(k, 0) + v
    run_d, run_e = _counters(run.meta)
    errors = max(errors, run_e)
    for k in set(rank_dropped) | set(run_d):
        dropped[k] = max(rank_dropped.get(k, 0), run_d.get(k, 0))
    ev_rows = ctx.rows(
        "SELECT kind, count(*), min(step), "
        "  coalesce(max_by(message, severity IN ('error', 'critical')), any_value(message)), "
        "  bool_or(severity IN ('error', 'critical')) FROM events "
        "WHERE kind IN ('dropped_data', 'recorder_error') GROUP BY kind ORDER BY kind")
    events = {k: (int(n), s, m) for k, n, s, m, _ in ev_rows}
    # e.g. the run directory deleted under the recorder: earlier steps are gone
    grave = any(bad for k, _, _, _, bad in ev_rows if k == "dropped_data")
    out = []
    total_dropped = sum(dropped.values())
    n_err = max(errors, events.get("recorder_error", (0, None, None))[0])
    if total_dropped > th.max_dropped_rows or n_err > th.max_recorder_errors \
            or "dropped_data" in events:
        parts = []
        if total_dropped:
            parts.append("dropped " + ", ".join(f"{v:,} {k} row(s)"
                                                for k, v in sorted(dropped.items()) if v))
        if "dropped_data" in events:
            n_ev, _, msg = events["dropped_data"]
            parts.append(f"{n_ev} data-loss event(s)" + (f" (e.g. {msg!r})" if msg else ""))
        if n_err:
            msg = events.get("recorder_error", (0, None, None))[2]
            parts.append(f"{n_err} internal error(s)" + (f" (e.g. {msg!r})" if msg else ""))
        first = min([s for _, s, _ in events.values() if s is not None], default=None)
        out.append(Finding(
            id=ID, severity="error" if grave else "warning", subject="recorder",
            first_step=first,
            title="The recorder lost data",
            message="The recorder lost data: " + "; ".join(parts) + ". Findings may miss "
                    "what happened in the lost data.",
            advice=DOC["fixes"],
            evidence={"dropped_rows": dropped, "recorder_errors": n_err,
                      "events": {k: v[0] for k, v in events.items()}}))
    if run.skipped_parts:
        rel = []
        for p, why in run.skipped_parts:
            try:
                rel.append(f"{p.relative_to(run.run_dir)}: {why}")
            except ValueError:
                rel.append(f"{p}: {why}")
        out.append(Finding(
            id=ID, severity="warning", subject=rel[0].split(":")[0],
            title=f"{len(rel)} unreadable file(s) skipped",
            message=(f"{len(rel)} data file(s) could not be read and were left out, e.g. "
                     f"{rel[0]}. A process killed mid-write or a full disk leaves such files."),
            advice="Nothing is lost beyond those files; if many, check the disk and the "
                   "filesystem the run dir lives on.",
            evidence={"skipped": rel[:50], "count": len(rel)}))
    problems = getattr(run, "meta_problems", [])
    if problems:
        out.append(Finding(
            id=ID, severity="warning", subject=problems[0].split(":")[0],
            title=f"{len(problems)} run metadata field(s) of the wrong type left out",
            message=(f"The run's metadata has field(s) of the wrong type, read as absent: "
                     f"{'; '.join(problems[:5])}. What they describe (model, device, "
                     "counters, ...) is missing from the findings."),
            advice="A recorder writes these fields with the right types: the file was "
                   "edited or written by another tool.",
            evidence={"fields": problems[:50], "count": len(problems)}))
    return out
