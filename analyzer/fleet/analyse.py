"""One run into its fleet index rows: the summary's analysis (the same detectors, the same
findings), reduced to one ``runs`` row, its ``findings`` rows and one ``ranks`` row per rank
(host and step times, for :mod:`.hosts`).

:func:`analyse_run` is the unit of work an engine distributes: it takes a path and returns
plain Python values (picklable, JSON-safe), never raises for a bad run (the row says
``status: unreadable`` and why), and imports nothing an executor would lack beyond this
package, duckdb and pyarrow.
"""

from __future__ import annotations

import time
from typing import Any

from tracealyze.format.hparams import rows

from ..diagnosis.findings import SEVERITIES, Finding, severity_rank

FLEET_SCHEMA_VERSION = 2
"""2: runs rows name the tables each run holds (``tables``)."""


def analyzer_version() -> str:
    """What produced a row: rows of another analyzer version are analysed again."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("tracealyze")
    except PackageNotFoundError:
        v = "0"
    return f"{v}+fleet{FLEET_SCHEMA_VERSION}"


def _top(findings: list[Finding]) -> Finding | None:
    """The most severe finding; among equals, the first (root causes come first)."""
    above = [f for f in findings if f.severity != "info"]
    return max(above, key=lambda f: severity_rank(f.severity), default=None) if above else None


def _one(con: Any, sql: str) -> Any:
    row = con.execute(sql).fetchone()
    return None if row is None else row[0]


def _ranks(run: Any, straggler: int | None) -> list[dict[str, Any]]:
    """Per rank: its host, steps and median step, compute and data-wait times (after the
    first 3 steps, which hold start-up and compilation)."""
    rows = run.con.execute(
        "SELECT rank, count(DISTINCT step), median(duration_s), median(compute_s), "
        "median(data_wait_s) FROM steps WHERE step >= (SELECT min(step) + 3 FROM steps) "
        "GROUP BY rank ORDER BY rank").fetchall()
    out = []
    for rank, steps, dur, comp, wait in rows:
        meta = run.rank_meta.get(int(rank)) or {}
        host = meta.get("host") or (run.meta.get("host") if len(rows) == 1 else None)
        out.append({"rank": int(rank), "host": host, "steps": int(steps),
                    "median_step_s": dur, "median_compute_s": comp, "median_data_wait_s": wait,
                    "straggler": straggler == int(rank)})
    return out


def _row(run: Any, findings: list[Finding], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    meta, con = run.meta, run.con
    started = meta.get("started")
    end = meta.get("ended") or run.heartbeat()
    model = meta.get("model") if isinstance(meta.get("model"), dict) else {}
    med = _one(con, "SELECT median(duration_s) FROM steps")
    top = _top(findings)
    counts = {s: sum(1 for f in findings if f.severity == s) for s in SEVERITIES}
    hosts = sorted({r["host"] for r in ranks if r["host"]} |
                   ({meta["host"]} if isinstance(meta.get("host"), str) and not ranks else set()))
    return {
        "run_id": run.run_id, "status": "killed" if run.killed else run.status,
        "started": started if isinstance(started, (int, float)) else None,
        "duration_s": (end - started) if isinstance(started, (int, float)) and end else None,
        "heartbeat": run.heartbeat(), "stale_after_s": run.stale_after_s,
        "steps": int(_one(con, "SELECT count(DISTINCT step) FROM steps") or 0),
        "world_size": int(meta.get("world_size") or len(run.ranks) or 1),
        "hosts": hosts,
        "model_class": model.get("class"), "model_parameters": model.get("parameters"),
        # GROUP BY hparams['optimizer.lr']: each value as the hparams view's text
        "hparams": {k: v for k, v, _ in rows(meta.get("hparams")) if v is not None},
        "throughput_steps_per_s": (1.0 / med) if med else None,
        "peak_rss_bytes": _one(con, "SELECT max(rss_bytes) FROM memory"),
        "peak_cuda_allocated_bytes": _one(con, "SELECT max(cuda_allocated_bytes) FROM memory"),
        "top_finding": top.id if top else None,
        "top_severity": top.severity if top else None,
        "top_subject": top.subject if top else None,
        "top_first_step": top.first_step if top else None,
        **{f"n_{s}": counts[s] for s in SEVERITIES},
        "error": None,
        # which tables hold data: query --fleet opens only the runs that hold a table its
        # SQL reads (a run without any data cannot be opened for a query at all)
        "tables": sorted({t for t, files in run.files.items() if files}
                         | ({"trace_events"} if run.raw_traces else set())),
    }


def analyse_run(path: str, fingerprint: str = "") -> dict[str, Any]:
    """``{"run": row, "findings": [...], "ranks": [...]}`` for the run at ``path`` (a local
    directory or a URL), every row carrying ``path``. A run that cannot be read gives a row
    with ``status: "unreadable"`` and ``error``; it never raises for the run's content."""
    from ..diagnosis.analysis import Analysis
    from ..diagnosis.summary import all_findings, clean_json
    from ..errors import TracealyzeError
    from ..run.catalog import open_run

    cpu0 = time.process_time()
    base = {"path": path, "fingerprint": fingerprint, "analyzer": analyzer_version()}
    try:
        with open_run(path, allow_empty=True) as run:
            findings = all_findings(Analysis(run))
            strag = next((f.evidence.get("rank") for f in findings if f.id == "straggler"),
                         None)
            ranks = _ranks(run, strag if isinstance(strag, int) else None)
            row = _row(run, findings, ranks)
            found = [{"run_id": run.run_id, "path": path, "order": i, "id": f.id,
                      "severity": f.severity, "subject": f.subject, "title": f.title,
                      "first_step": f.first_step, "message": f.message}
                     for i, f in enumerate(findings)]
            for r in ranks:
                r.update(run_id=run.run_id, path=path)
    except (TracealyzeError, OSError, ValueError) as e:
        row = {"run_id": None, "status": "unreadable", "error": " ".join(str(e).split())[:500]}
        found, ranks = [], []
    except Exception as e:  # one run must not stop a fleet of thousands: its row says why
        why = " ".join(str(e).split())[:400]
        row = {"run_id": None, "status": "unreadable",
               "error": (f"cannot read the run's data: {why}"
                         if type(e).__module__.lstrip("_").startswith("duckdb") else
                         f"{type(e).__name__}: {why} (a tracealyze bug: please report it)")}
        found, ranks = [], []
    row.update(base, analysis_cpu_s=time.process_time() - cpu0, analysed_at=time.time())
    return _utf8(clean_json({"run": row, "findings": found, "ranks": ranks}))


def failed(path: str, why: str) -> dict[str, Any]:
    """The rows of a run whose analysis did not return (its process died): ``unreadable``,
    with an empty fingerprint so that the next ``fleet`` analyses it again."""
    return {"run": {"path": path, "fingerprint": "", "analyzer": analyzer_version(),
                    "run_id": None, "status": "unreadable",
                    "error": " ".join(why.split())[:500], "analysed_at": time.time()},
            "findings": [], "ranks": []}


def _utf8(v: Any) -> Any:
    """``v`` with every string made UTF-8 text: a run's JSON may hold a lone surrogate
    (``"\\ud800"``), which neither Parquet nor a terminal takes."""
    if isinstance(v, str):
        return v.encode("utf-8", "replace").decode("utf-8")
    if isinstance(v, dict):
        return {_utf8(k): _utf8(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_utf8(x) for x in v]
    return v
