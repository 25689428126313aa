"""``tracealyze compare BASE NEW``: did a change make training slower, less stable or
hungrier? Each run is read once (:mod:`.metrics`), its figures lined up with a
direction and a significance against the runs' own noise (:mod:`.stats`), its
findings diffed, and one verdict given: regressed | improved | unchanged | mixed.

A metric counts toward the verdict when its change is significant **and** at least
``threshold`` percent (default 5%): a real but negligible change does not make a verdict.
A new finding of warning or worse is a regression; one that is gone is an improvement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tracealyze.format.hparams import differences

from ..diagnosis.analysis import Analysis
from ..diagnosis.findings import Finding, severity_rank
from ..diagnosis.summary import all_findings, clean_json, step_count
from ..errors import ConfigError
from ..report.text import human_count
from ..run.catalog import Run, open_run
from .kernels import TraceData, gpu_metrics, kernel_diff, step_change_us
from .metrics import Metric, RunData, dynamics_metrics, memory_metrics, time_metrics
from .stats import TEST

COMPARE_SCHEMA_VERSION = 1
DEFAULT_THRESHOLD = 5.0


STAGES = ("read both runs", "metrics", "GPU time and kernels", "findings and verdict")
"""What :func:`compare_runs` tells its ``progress`` as it goes, in order."""


def compare_runs(base: Run | str | Path, new: Run | str | Path, *,
                 threshold: float = DEFAULT_THRESHOLD, progress: Any = None) -> dict[str, Any]:
    """The DESIGN.md compare JSON of two runs (paths are opened and closed here).
    ``progress``: an object with ``step(label)`` (report.progress.Progress, which the CLI
    shows on a terminal), told each of STAGES once it is done."""
    if threshold < 0 or not math.isfinite(threshold):
        raise ConfigError(f"--threshold must be a percentage ≥ 0, got {threshold!r}")
    if not isinstance(base, Run):
        with open_run(base) as b:
            return compare_runs(b, new, threshold=threshold, progress=progress)
    if not isinstance(new, Run):
        with open_run(new) as n:
            return compare_runs(base, n, threshold=threshold, progress=progress)
    done = progress.step if progress is not None else (lambda _label: None)
    # Each run has its own DuckDB connection, and DuckDB and numpy's sorts release the GIL:
    # the two runs are read side by side (1.4x faster on 2 cores for 20M-row runs).
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tracealyze-compare") as ex:
        (sb, db, ta), (sn, dn, tn) = ex.map(_read, (base, new))
    done(STAGES[0])
    warnings, same_model = comparability(base.meta, new.meta, db, dn)
    metrics = time_metrics(db, dn) + memory_metrics(db, dn)
    if same_model:
        metrics += dynamics_metrics(db, dn)
    else:
        warnings.append("training dynamics (loss, gradient norms) not compared: the models "
                        "differ")
    if len(db.step) and len(dn.step) and not set(db.step) & set(dn.step):
        warnings.append("the runs share no step numbers: nothing is compared step by step")
    done(STAGES[1])
    gpu, kernels = gpu_side(ta, tn, metrics, warnings, threshold)
    done(STAGES[2])
    fdiff = findings_diff(sb, sn)
    verdict, worse, better = judge(metrics, fdiff, threshold)
    done(STAGES[3])
    return clean_json({
        "schema_version": COMPARE_SCHEMA_VERSION,
        "base": {"run_id": base.run_id, "steps": step_count(base), "path": base.where},
        "new": {"run_id": new.run_id, "steps": step_count(new), "path": new.where},
        "comparable": same_model,
        "warnings": warnings,
        # what the runs were configured to do differently (run.json's hparams)
        "hparams_changed": [{"key": k, "base": a, "new": b}
                            for k, a, b in differences(base.meta.get("hparams"),
                                                       new.meta.get("hparams"))],
        "verdict": verdict,
        "threshold_pct": threshold,
        "significance": TEST,
        "regressions": worse,
        "improvements": better,
        "metrics": [m.to_json() for m in metrics],
        "findings": fdiff,
        "gpu_time": gpu,
        "kernels": kernels,
    })


def _read(run: Run) -> tuple[list[Finding], RunData, TraceData | None]:
    """Everything compare needs of one run: its findings (its one Analysis, as the summary
    gives them), samples and traces."""
    return all_findings(Analysis(run)), RunData.load(run), TraceData.load(run.con)


def gpu_side(ta: TraceData | None, tn: TraceData | None, metrics: list[Metric],
             warnings: list[str], threshold: float
             ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """GPU metrics (appended to ``metrics``), the breakdowns side by side and the kernel
    diff, when both runs have GPU traces measured the same way; else a warning saying why."""
    if ta is None and tn is None:
        return None, None
    if ta is None or tn is None:
        which = "base" if ta is not None else "new"
        warnings.append(f"only the {which} run has GPU profiler traces: GPU time and kernels "
                        "are not compared (profile both, e.g. the same profile_schedule)")
        return None, None
    if ta.unit != tn.unit:
        warnings.append("one run's traces have ProfilerStep spans and the other's do not: "
                        "GPU time and kernels are not compared (profile both the same way)")
        return None, None
    metrics += gpu_metrics(ta, tn)
    step = next((m for m in metrics if m.name == "step_time_median_s"), None)
    kernels = kernel_diff(ta, tn, threshold, step_change_us(ta, tn, step))
    return {"unit": kernels["unit"], "base": ta.breakdown, "new": tn.breakdown}, kernels


def comparability(a: Mapping[str, Any], b: Mapping[str, Any], da: RunData, dn: RunData
                  ) -> tuple[list[str], bool]:
    """Warnings (each says what differs and what to fix) and whether the models match."""
    out: list[str] = []
    ma, mb = a.get("model") or {}, b.get("model") or {}
    same = True
    pa, pb = ma.get("parameters"), mb.get("parameters")
    if pa and pb and pa != pb:
        out.append(f"different model: {human_count(pa)} vs {human_count(pb)} parameters")
        same = False
    if ma.get("class") and mb.get("class") and ma["class"] != mb["class"]:
        out.append(f"different model class: {ma['class']} vs {mb['class']}")
        same = False
    names_a, names_b = set(da.layers), set(dn.layers)
    if same and names_a and names_b and names_a != names_b:
        out.append(f"different parameter names ({len(names_a ^ names_b)} differ): per-layer "
                   "gradient norms are compared on the shared ones only")
    for key, what in (("world_size", "world size"), ("preset", "recorder preset")):
        if a.get(key) is not None and b.get(key) is not None and a[key] != b[key]:
            out.append(f"different {what}: {a[key]} vs {b[key]} (record both the same way "
                       "to compare like with like)")
    ba, bb = (a.get("data") or {}).get("batch_size"), (b.get("data") or {}).get("batch_size")
    if ba and bb and ba != bb:
        out.append(f"different batch size: {ba} vs {bb} per rank: step times and losses "
                   "are per batch, compare throughput in samples (steps/s × batch size)")
    dev_a, dev_b = (a.get("device") or {}).get("type"), (b.get("device") or {}).get("type")
    if dev_a and dev_b and dev_a != dev_b:
        out.append(f"different device: {dev_a} vs {dev_b}: step times are not comparable")
    va, vb = a.get("versions") or {}, b.get("versions") or {}
    for lib in ("torch", "cuda", "python"):
        if va.get(lib) and vb.get(lib) and va[lib] != vb[lib]:
            out.append(f"different {lib}: {va[lib]} vs {vb[lib]}")
    if len(da.step) and len(dn.step) and len(da.step) != len(dn.step):
        out.append(f"different lengths: {len(da.step)} vs {len(dn.step)} steps; dynamics are "
                   "compared on the steps both recorded")
    return out, same


def findings_diff(base: list[Finding], new: list[Finding]) -> dict[str, list[dict[str, Any]]]:
    """Findings above info that are new, gone (resolved) or more severe, by id: the same
    kind of problem in both runs is the same problem even when its subject moved (an
    explosion named on another layer after a change), so no finding is ever listed as both
    new and resolved."""
    def index(fs: list[Finding]) -> dict[str, Finding]:
        out: dict[str, Finding] = {}
        for f in fs:
            if f.severity == "info":
                continue
            if f.id not in out or severity_rank(f.severity) > severity_rank(out[f.id].severity):
                out[f.id] = f
        return out

    def brief(f: Finding) -> dict[str, Any]:
        return {"id": f.id, "severity": f.severity, "subject": f.subject, "title": f.title,
                "first_step": f.first_step}

    ib, inew = index(base), index(new)
    return {
        "new": [brief(f) for k, f in inew.items() if k not in ib],
        "resolved": [brief(f) for k, f in ib.items() if k not in inew],
        "worse": [{**brief(f), "base_severity": ib[k].severity} for k, f in inew.items()
                  if k in ib and severity_rank(f.severity) > severity_rank(ib[k].severity)],
    }


# Step-time outliers are slow steps *relative to the run's own median*. When the median
# itself got significantly slower, fewer such steps is not a faster tail: the bar moved up
# (a 3x slower loader hides a fast run's GC hiccups under its own sleep). They count as
# better only when the median did not regress.
RELATIVE_TO_MEDIAN = ("step_time_outlier_share", "finding:step_time_outlier")


def judge(metrics: list[Metric], fdiff: Mapping[str, list[Any]], threshold: float
          ) -> tuple[str, list[str], list[str]]:
    def big(m: Metric) -> bool:
        if m.change_pct is None:  # from zero (a count that appeared): as large as can be
            return m.base == 0 and m.new not in (None, 0)
        return abs(m.change_pct) >= threshold
    worse = [m.name for m in metrics if m.worse and big(m)]
    worse += [f"finding:{f['id']}" for f in fdiff["new"]]
    worse += [f"finding:{f['id']}" for f in fdiff["worse"]]
    better = [m.name for m in metrics if m.better_now and big(m)]
    better += [f"finding:{f['id']}" for f in fdiff["resolved"]]
    if "step_time_median_s" in worse:
        better = [b for b in better if b not in RELATIVE_TO_MEDIAN]
    verdict = ("mixed" if worse and better else "regressed" if worse
               else "improved" if better else "unchanged")
    return verdict, worse, better


def fails(result: Mapping[str, Any], fail_on: str) -> bool:
    """``--fail-on regression``: some significant change in the wrong direction beyond the
    threshold (a regressed or mixed verdict)."""
    return fail_on == "regression" and bool(result["regressions"])


def render_text(result: Mapping[str, Any]) -> str:
    b, n = result["base"], result["new"]
    lines = [f"compare  base {b['run_id']} ({b['steps']} steps)  →  new {n['run_id']} "
             f"({n['steps']} steps)",
             f"verdict: {result['verdict'].upper()}"
             + (f"  (worse: {', '.join(result['regressions'])})" if result["regressions"]
                else "")
             + (f"  (better: {', '.join(result['improvements'])})" if result["improvements"]
                else "")]
    for w in result["warnings"]:
        lines.append(f"  ! {w}")
    lines += hparams_lines(result.get("hparams_changed") or [])
    lines.append("")
    lines.append(f"{'metric':36} {'base':>14} {'new':>14} {'change':>9}  ")
    for m in result["metrics"]:
        mark = ""
        if m["significant"]:
            worse = (m["new"] > m["base"]) if m["better"] == "lower" else (m["new"] < m["base"])
            mark = "worse" if worse else "better"
        change = change_text(m)
        lines.append(f"{m['name']:36} {_fmt(m['base']):>14} {_fmt(m['new']):>14} "
                     f"{change:>9}  {mark}")
    lines += _kernel_lines(result)
    f = result["findings"]
    for key, label in (("new", "new finding"), ("worse", "worse finding"),
                       ("resolved", "resolved finding")):
        for x in f[key]:
            lines.append(f"{label}: {x['severity']} {x['id']} ({x.get('subject')}): "
                         f"{x.get('title')}")
    lines.append("")
    lines.append(f"significant = {result['significance']}; a verdict needs ≥ "
                 f"{result['threshold_pct']:g}% change")
    return "\n".join(lines)


TEXT_ROWS = 12


def hparams_lines(changed: list[Mapping[str, Any]], limit: int = 20) -> list[str]:
    """What was configured differently: ``  optimizer.lr: 0.001 → 0.003``, at most
    ``limit`` lines (then how many more)."""
    if not changed:
        return []
    out = [f"configured differently ({len(changed)} hyperparameter(s)):"]
    for c in changed[:limit]:
        a = "(unset)" if c["base"] is None else _cut(str(c["base"]), 40)
        b = "(unset)" if c["new"] is None else _cut(str(c["new"]), 40)
        out.append(f"  {c['key']}: {a} → {b}")
    if len(changed) > limit:
        out.append(f"  … and {len(changed) - limit} more (--format json lists them all)")
    return out


def change_text(m: Mapping[str, Any]) -> str:
    """A metric's relative change as shown: ``+19.0%``; ``from 0`` when the base was zero;
    empty when there is nothing to compare or nothing changed."""
    if m["change_pct"] is not None:
        return f"{m['change_pct']:+.1f}%"
    return "" if m["base"] is None or m["new"] is None or m["base"] == m["new"] else "from 0"


def _kernel_lines(result: Mapping[str, Any]) -> list[str]:
    """The GPU breakdown side by side and the largest kernel/op/runtime changes."""
    gpu, k = result.get("gpu_time"), result.get("kernels")
    if not gpu or not k:
        return []
    unit = k["unit"]
    out = ["", f"{'GPU time per ' + unit + ' (µs)':36} {'base':>14} {'new':>14}"]
    for key in ("total_us", "idle_us", "compute_us", "non_compute_us"):
        out.append(f"  {key[:-3]:34} {gpu['base'][key]:>14,.0f} {gpu['new'][key]:>14,.0f}")
    if not k["rows"]:
        out.append("kernels, ops and runtime calls: no change beyond the threshold")
        return out
    out.append(f"kernels, ops and runtime calls per {unit}, largest time change first "
               f"(of {sum(k['counts'].values())} changed):")
    for r in k["rows"][:TEXT_ROWS]:
        share = r.get("share_of_step_change_pct")
        out.append(f"  {r['status']:11} {r['kind']:7} {_cut(r['name']):56} "
                   f"{r['base_count_per_step']:g} → {r['new_count_per_step']:g} calls  "
                   f"{r['delta_us_per_step']:+,.0f} µs"
                   + (f"  ({share:g}% of the step-time change)" if share is not None else ""))
    return out


def _cut(name: str, limit: int = 56) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if abs(v) >= 1e6:
        return f"{v:.4g}"
    if v != 0 and abs(v) < 1e-3:
        return f"{v:.3e}"
    return f"{v:.4g}"
