"""The DESIGN.md summary of a run (JSON dict, text), built from one :class:`Analysis`
(:mod:`.analysis`: every detector run once; a detector that fails is an ``error`` finding)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..gpu.idle_groups import unusual_streams
from ..run.catalog import Run, open_run
from ..units import single_line
from .analysis import Analysis
from .findings import SEVERITIES, Finding, canonical_id, severity_rank
from .rank_groups import LIMIT, rank_ranges

SUMMARY_SCHEMA_VERSION = 1


def analyze(run: Run, overrides: Any = None, *,
            config_file: Path | str | None = None,
            cache: dict[str, Any] | None = None) -> list[Finding]:
    """All findings of all detectors, root causes first (``Analysis(run).findings``)."""
    return Analysis(run, overrides, config_file=config_file, memo=cache).findings


def clean_json(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to 'nan'/'inf' strings."""
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, TypeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def build_summary(run: Run | str | Path, overrides: Any = None, *,
                  config_file: Path | str | None = None) -> dict[str, Any]:
    """The DESIGN.md summary JSON of ``run`` (a Run, or a path opened and closed here).

    ``overrides``: ``{detector: {key: value}}`` or ``["detector.key=value", ...]``.
    """
    if not isinstance(run, Run):
        with open_run(run) as opened:
            return build_summary(opened, overrides, config_file=config_file)
    return summary_of(Analysis(run, overrides, config_file=config_file))


def step_count(run: Run) -> int:
    """How many distinct steps the run recorded (the summary's ``run.steps``)."""
    (steps,) = run.con.execute("SELECT count(DISTINCT step) FROM steps").fetchone()
    return int(steps)


def all_findings(analysis: Analysis) -> list[Finding]:
    """The summary's findings, typed: the detectors' (root causes first, each followed by
    what it explains), then the failures found after them (the GPU time breakdown's)."""
    _ = analysis.gpu_time  # (may add a late failure)
    return [*analysis.findings, *analysis.late]


def summary_of(analysis: Analysis) -> dict[str, Any]:
    """The DESIGN.md summary JSON of an analysis (its findings computed once)."""
    run = analysis.run
    steps = step_count(run)
    out: dict[str, Any] = {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        # "killed": marked running, but its heartbeat is stale by the format's rule (run.json
        # still says running: nobody got to say otherwise); "killed": true says the same
        "run": {"run_id": run.run_id, "status": "killed" if run.killed else run.status,
                "steps": steps, "ranks": list(run.ranks),
                "killed": run.killed, "heartbeat_age_s": run.heartbeat_age_s()},
        "findings": [f.to_json() for f in all_findings(analysis)],
        # what could not be checked, and why (a healthy verdict covers only the rest)
        "not_checked": analysis.not_checked,
    }
    gpu = analysis.gpu_time
    if gpu is not None:
        out["gpu_time"] = gpu
    return clean_json(out)


def worst_severity(summary: Mapping[str, Any]) -> str | None:
    """Highest severity among the summary's findings, None if there are none."""
    sev = [f["severity"] for f in summary.get("findings", [])]
    return max(sev, key=severity_rank) if sev else None


def fails(summary: Mapping[str, Any], fail_on: str) -> bool:
    """True if some finding reaches ``fail_on`` (:func:`reaches`)."""
    return any(reaches(f, fail_on) for f in summary.get("findings", ()))


def reaches(finding: Mapping[str, Any], fail_on: str) -> bool:
    """Whether ``finding`` (summary JSON) trips ``--fail-on``: at least as severe as
    ``fail_on`` (a severity); or, when ``fail_on`` is a finding id (or a former one), of
    that id and above info."""
    if fail_on in SEVERITIES:
        return severity_rank(finding.get("severity", "info")) >= severity_rank(fail_on)
    return finding.get("id") == canonical_id(fail_on) and finding.get("severity") != "info"


_MARK = {"info": "·", "warning": "!", "error": "✗", "critical": "✗✗"}


def render_text(summary: Mapping[str, Any], *, width: int = 100) -> str:
    """Human-readable summary for a terminal."""
    run = summary["run"]
    ranks = run.get("ranks") or []
    status = "killed" if run.get("killed") else run.get("status")
    lines = [f"run {single_line(run.get('run_id') or '?')}  status={status}  "
             f"steps={run.get('steps')}  ranks={len(ranks)} ({rank_ranges(ranks) or '-'})"]
    findings = summary.get("findings", [])
    counts = {s: sum(f["severity"] == s for f in findings) for s in SEVERITIES}
    gaps = summary.get("not_checked") or []
    if not any(counts[s] for s in SEVERITIES[1:]):
        lines.append(("No problems found in what could be checked" if gaps
                      else "No problems found")
                     + (f" ({counts['info']} note(s))." if counts["info"] else "."))
    else:
        lines.append(", ".join(f"{counts[s]} {s}" for s in reversed(SEVERITIES) if counts[s]))
    for g in gaps:
        lines.append(f"Not checked: {g['check']}: {g['why']} (to check it: {g['how']}).")
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ", subsequent_indent="    ")
    for f in findings:
        where = []
        if f.get("subject"):
            where.append(str(f["subject"]))
        if f.get("first_step") is not None:
            where.append(f"from step {f['first_step']}")
        lines.append("")
        indent = "  ↳ " if f.get("caused_by") else ""
        lines.append(f"{indent}{_MARK.get(f['severity'], '?')} {f['severity'].upper():8} "
                     f"{f['id']}: {f['title']}" + (f"  [{', '.join(where)}]" if where else ""))
        if f.get("caused_by"):
            lines.append(f"    (a consequence of {f['caused_by']} above)")
        lines.extend(wrap.wrap(f["message"]))
        if f.get("advice"):
            lines.extend(wrap.wrap("Try: " + f["advice"]))
    lines.extend(_gpu_time_text(summary.get("gpu_time") or []))
    return "\n".join(lines)


def _pct_of(g: Mapping[str, Any], key: str) -> float:
    total = g.get("total_us") or 0
    return 100 * (g.get(key) or 0) / total if total else 0.0


def _gpu_time_text(gpu: list[Mapping[str, Any]]) -> list[str]:
    """One line per rank; past LIMIT ranks, the spread over ranks and the ranks at its ends."""
    gpu = [g for g in gpu if g.get("total_us")]
    if not gpu:
        return []
    if len(gpu) <= LIMIT:
        out = []
        for g in gpu:
            overlap = g.get("comm_comp_overlap_pct")
            out += ["", f"GPU time rank {g.get('rank')}: total {g['total_us'] / 1e3:.1f} ms, "
                        f"idle {_pct_of(g, 'idle_us'):.1f}%, compute "
                        f"{_pct_of(g, 'compute_us'):.1f}%, non-compute "
                        f"{_pct_of(g, 'non_compute_us'):.1f}%"
                        + (f", comm/compute overlap {overlap:.1f}%" if overlap is not None
                           else "")]
        return out
    out = ["", f"GPU time over {len(gpu)} ranks (min / median / max, rank at each end):"]
    for key, label in (("idle_us", "idle"), ("compute_us", "compute"),
                       ("non_compute_us", "non-compute")):
        ranked = sorted(gpu, key=lambda g: _pct_of(g, key))
        lo, mid, hi = ranked[0], ranked[len(ranked) // 2], ranked[-1]
        out.append(f"  {label:12} {_pct_of(lo, key):5.1f}% (rank {lo['rank']}) / "
                   f"{_pct_of(mid, key):5.1f}% / {_pct_of(hi, key):5.1f}% (rank {hi['rank']})")
    groups = unusual_streams(gpu)
    if groups:
        out.append("Streams idler than on the other ranks (share of GPU time; the others' "
                   "median):")
    for g in groups[:LIMIT]:
        streams = ", ".join(str(x) for x in g["streams"])
        out.append(f"  stream{'s' if len(g['streams']) > 1 else ''} {streams} on "
                   f"rank{'s' if len(g['ranks']) > 1 else ''} "
                   f"{rank_ranges(g['ranks'])}: idle {100 * g['share']:.1f}% "
                   f"({100 * g['peer_share']:.1f}%), mostly {g['cause']} "
                   f"{100 * g['cause_share']:.1f}% ({100 * g['peer_cause_share']:.1f}%): "
                   f"{g['why']}")
    if len(groups) > LIMIT:
        out.append(f"  and {len(groups) - LIMIT} more groups (summary --json: gpu_time"
                   "[].idle_breakdown)")
    return out
