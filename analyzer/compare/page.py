"""``tracealyze compare BASE NEW -o compare.html``: the comparison as one self-contained page
in the report's style (same CSS, same page script, plotly inlined, no network): the verdict
first, then the metrics table, the findings that came or went, the overlaid curves, the
step-time distributions, the GPU breakdown side by side and the kernel diff table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import ReportError, TracealyzeError
from ..report.page import render, write_atomic
from ..report.text import human_bytes, human_count
from ..run.catalog import Run, open_run
from .charts import compare_charts
from .runs import change_text, compare_runs

VERDICT_CLASS = {"regressed": "bad", "improved": "ok", "unchanged": "live", "mixed": "warn"}
VERDICT_TEXT = {
    "regressed": "The new run is worse",
    "improved": "The new run is better",
    "unchanged": "No change beyond the runs' own noise",
    "mixed": "Better in some ways, worse in others",
}
KERNEL_ROWS = 40


def label_of(run: Run) -> str:
    """What the page calls a run: its name in run.json, else its folder's name."""
    return str(run.meta.get("name") or run.folder_name)


def fmt_metric(name: str, v: Any) -> str:
    """A metric value in the unit its name says."""
    if v is None:
        return "—"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if name.endswith("_bytes"):
        return human_bytes(v)
    if name.endswith("_bytes_per_step"):
        return f"{'-' if v < 0 else ''}{human_bytes(abs(v))}/step"
    if name.endswith("_per_s"):
        return f"{v:.4g}/s"
    if name.endswith("_s"):
        return f"{v * 1000:.4g} ms" if abs(v) < 1 else f"{v:.4g} s"
    if name.endswith("_share"):
        return f"{v * 100:.3g}%"
    if name.endswith("_us_per_step"):
        return f"{v / 1000:.4g} ms"
    if float(v).is_integer() and abs(v) >= 1000:
        return human_count(v)
    return f"{v:.4g}"


def metric_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    worse, better = set(result["regressions"]), set(result["improvements"])
    rows = []
    for m in result["metrics"]:
        if m["name"] in worse:
            cls, verdict = "worse", "worse"
        elif m["name"] in better:
            cls, verdict = "better", "better"
        elif m["significant"]:
            cls, verdict = "minor", f"below {result['threshold_pct']:g}%"
        else:
            cls, verdict = "same", "within noise"
        rows.append({"name": m["name"], "base": fmt_metric(m["name"], m["base"]),
                     "new": fmt_metric(m["name"], m["new"]), "change": change_text(m),
                     "cls": cls,
                     "verdict": verdict, "better": m["better"], "test": m.get("test", "")})
    return rows


def kernel_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    k = result.get("kernels") or {}
    out = []
    for r in (k.get("rows") or [])[:KERNEL_ROWS]:
        share = r.get("share_of_step_change_pct")
        out.append({**r, "short": r["name"] if len(r["name"]) <= 90 else r["name"][:89] + "…",
                    "delta_ms": f"{r['delta_us_per_step'] / 1000:+.4g}",
                    "share": "" if share is None else f"{share:g}%"})
    return out


def collect_compare(base: Run, new: Run, threshold: float, progress: Any = None
                    ) -> dict[str, Any]:
    result = compare_runs(base, new, threshold=threshold, progress=progress)
    labels = (label_of(base), label_of(new))
    if labels[0] == labels[1]:
        labels = (f"base · {labels[0]}", f"new · {labels[1]}")
    charts = compare_charts(base, new, labels, result)
    worse = [f"{m['name']} {m['change']}".strip() for m in metric_rows(result)
             if m["cls"] == "worse"]
    worse += [f"new {f['severity']} {f['id']}" for f in result["findings"]["new"]]
    worse += [f"{f['id']} now {f['severity']}" for f in result["findings"]["worse"]]
    return {
        "result": result, "labels": labels, "charts": charts,
        "verdict_class": VERDICT_CLASS[result["verdict"]],
        "verdict_text": VERDICT_TEXT[result["verdict"]],
        "metrics": metric_rows(result), "worse": worse,
        "kernels": kernel_rows(result), "kernel_info": result.get("kernels"),
        "sides": [{"label": lab, "run_id": r.run_id, "status": r.status,
                   "steps": (f"{s['steps']:,} steps" if s["steps"] else "profiler traces only"),
                   "path": r.where}
                  for lab, r, s in zip(labels, (base, new), (result["base"], result["new"]),
                                       strict=True)],
    }


def write_compare_report(base_dir: str | Path, new_dir: str | Path, out: str | Path, *,
                         threshold: float, progress: Any = None) -> tuple[Path, dict[str, Any]]:
    """Write the compare page of two runs to ``out``; returns its path and the compare
    result (the JSON ``--json`` prints). RunDirError / ConfigError for bad input,
    ReportError otherwise. ``progress``: as compare_runs takes it."""
    out = Path(out)
    if out.is_dir():
        raise ReportError(f"-o {out} is a directory; give a file name (e.g. compare.html)")
    with open_run(base_dir) as base, open_run(new_dir) as new:
        try:
            model = collect_compare(base, new, threshold, progress)
        except TracealyzeError:
            raise
        except Exception as exc:
            raise ReportError(f"could not build the compare page: {type(exc).__name__}: "
                              f"{exc}") from exc
    write_atomic(out, render(model, "compare.html.j2"))
    return out, model["result"]
