"""The report's run header: status, steps, wall time, ranks, preset, versions, model, host."""

from __future__ import annotations

import time
from typing import Any

from tracealyze.format.hparams import rows as hparam_rows

from ..units import single_line
from .context import ReportContext
from .text import human_bytes, human_count, human_duration

STALE_AFTER_S = 300.0
"""A 'running' run with no flush for this long (or 3 flush intervals) was probably killed."""


def _status(run: Any, meta: dict[str, Any]) -> tuple[str, str, str]:
    """(label, css class, detail) of the run's status."""
    status = str(getattr(run, "status", None) or meta.get("status") or "unknown")
    if status == "completed":
        return "completed", "ok", ""
    if status == "crashed":
        return "crashed", "bad", ""
    if status == "running" and getattr(run, "killed", False):
        age = run.heartbeat_age_s() if hasattr(run, "heartbeat_age_s") else None
        return ("stopped", "bad",
                "still marked running, but nothing was written for "
                f"{human_duration(age)}: the process was probably killed")
    if status == "running":
        hb = meta.get("heartbeat")
        limit = max(STALE_AFTER_S, 3 * float(meta.get("flush_interval_s") or 10.0))
        if isinstance(hb, (int, float)) and time.time() - hb > limit:
            return ("stopped", "bad",
                    f"still marked running, but nothing was written for "
                    f"{human_duration(time.time() - hb)}: the process was probably killed")
        return "still running", "live", "the report shows the data flushed so far"
    return status, "warn", ""


def run_header(run: Any, ctx: ReportContext) -> dict[str, Any]:
    meta: dict[str, Any] = dict(getattr(run, "meta", None) or {})
    label, cls, detail = _status(run, meta)
    row = ctx.con.execute(
        "SELECT count(DISTINCT step), min(step), max(step), min(time), max(time) "
        "FROM steps WHERE rank = ?", [ctx.rank]).fetchone() or (0, None, None, None, None)
    nsteps, first, last, _t_first, t_last = row
    started = meta.get("started")
    end = meta.get("ended") or meta.get("heartbeat") or t_last
    wall = (end - started) if isinstance(started, (int, float)) and isinstance(
        end, (int, float)) else None
    model = meta.get("model") or {}
    device = meta.get("device") or {}
    versions = meta.get("versions") or {}
    fields: list[tuple[str, str]] = []
    steps_text = f"{nsteps:,}" if nsteps else "none recorded"
    if nsteps and first is not None and (last - first + 1) != nsteps:
        steps_text += f" (steps {first:,}–{last:,})"
    elif nsteps and first not in (None, 0):
        steps_text += f" (from step {first:,})"
    fields.append(("Steps", steps_text))
    fields.append(("Wall time", human_duration(wall)))
    ranks = ctx.ranks
    fields.append(("Ranks", str(len(ranks)) if len(ranks) != 1 else "1"))
    if meta.get("preset"):
        fields.append(("Preset", str(meta["preset"])))
    if model:
        params = model.get("parameters")
        text = str(model.get("class") or "model")
        if params is not None:
            text += f" · {human_count(params)} parameters"
            trainable = model.get("trainable_parameters")
            if trainable is not None and trainable != params:
                text += f" ({human_count(trainable)} trainable)"
        if model.get("dtypes"):
            text += " · " + ", ".join(str(d) for d in model["dtypes"][:4])
        fields.append(("Model", text))
    if device:
        text = str(device.get("name") or device.get("type") or "")
        if device.get("total_memory_bytes"):
            text += f" · {human_bytes(device['total_memory_bytes'])}"
        if text:
            fields.append(("Device", text))
    if meta.get("host"):
        fields.append(("Host", str(meta["host"])))
    if versions:
        fields.append(("Versions", " · ".join(f"{k} {v}" for k, v in versions.items()
                                             if v is not None)))
    if meta.get("started_iso") or isinstance(started, (int, float)):
        fields.append(("Started", str(meta.get("started_iso") or time.strftime(
            "%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)))))
    resumes = meta.get("resumes") or []
    if resumes:
        fields.append(("Resumed", f"{len(resumes)}× (last from step "
                                  f"{resumes[-1].get('from_step', '?')})"))
    return {
        "run_id": single_line(meta.get("run_id") or ""),
        "name": _name(run),
        "status": label, "status_class": cls, "status_detail": detail,
        "fields": fields,
        "hparams": hparam_rows(meta.get("hparams")),  # (key, value, type) sorted by key
        "skipped_parts": [_skipped(p) for p in (getattr(run, "skipped_parts", None) or [])][:20],
    }


def _skipped(entry: Any) -> str:
    """The catalog lists skipped parts as (path, reason)."""
    if isinstance(entry, (tuple, list)) and len(entry) == 2:
        return f"{entry[0]} ({entry[1]})"
    return str(entry)


def _name(run: Any) -> str:
    """The run's folder name (a run read from a store: the last part of its URL)."""
    url = getattr(run, "url", None)
    if url:
        return str(url).rstrip("/").rsplit("/", 1)[-1]
    return str(run.run_dir.name) if getattr(run, "run_dir", None) else ""
