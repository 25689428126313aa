"""``tracealyze import-trace``: profiler traces written into a run directory as
``trace_events`` parts plus a copy of each raw trace. Nothing read from a trace (its own
trace_id, its rank) ever becomes a path outside the run directory."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tracealyze.format.parts import (
    data_parts,
    is_real_dir,
    next_seq_in,
    part_name,
    write_json_atomic,
    write_parquet_atomic,
)
from tracealyze.format.runmeta import new_run_meta

from .errors import TraceError
from .traces import GPU_ACTIVITY_CATS, _parse, _read_bytes, _trace_stem

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def _write_part(table: pa.Table, folder: Path) -> Path:
    """FORMAT.md: temporary name, fsync, rename into the next free part-<seq>.parquet (never
    over another writer's part). ``rank`` is the folder, not a column (schema_version 2)."""
    folder.mkdir(parents=True, exist_ok=True)
    if "rank" in table.column_names:
        table = table.drop_columns(["rank"])
    return write_parquet_atomic(table, folder / part_name(next_seq_in(folder)), replace=False)


def _existing_trace_ids(folder: Path) -> set[str]:
    ids: set[str] = set()
    if not folder.is_dir():
        return ids
    for p in data_parts(folder):
        try:
            col = pq.read_table(p, columns=["trace_id"]).column("trace_id")
        except Exception:  # an unreadable part is the catalog's business, not ours
            continue
        ids.update(v for v in col.unique().to_pylist() if v is not None)
    return ids


def _ensure_run(run_dir: Path, ranks: Iterable[int]) -> None:
    if (run_dir / "run.json").exists():
        return
    ranks = sorted(set(ranks))
    write_json_atomic(run_dir / "run.json", new_run_meta(
        preset=None, knobs=None, world_size=(max(ranks) + 1) if ranks else 1,
        source="import-trace", status="completed"))


def _copy_name(path: Path, raw_digest: str) -> str:
    """File name of the raw trace's copy: the source's file name made safe, with its content
    digest. Nothing read from the trace itself (its own trace_id) names a file."""
    stem = _SAFE_NAME.sub("_", _trace_stem(path)).lstrip(".")[:120] or "trace"
    ext = path.name[len(_trace_stem(path)):]
    ext = ext if _SAFE_NAME.search(ext) is None else ".json"
    return (stem if stem.endswith(f"-{raw_digest}") else f"{stem}-{raw_digest}") + ext


def import_traces(paths: list[Path], run_dir: Path) -> list[dict[str, Any]]:
    """Import profiler traces into ``run_dir`` (``tracealyze import-trace``).

    Every trace is parsed first (so one bad file imports nothing and raises
    :class:`TraceError`), then for each: a ``trace_events/rank=<r>/part-<seq>.parquet`` and
    a copy of the raw file under ``traces/rank=<r>/``. A trace whose trace_id is already in
    the run for that rank is not written again (``skipped: True``). A directory that is not
    a run yet gets a minimal run.json (``source: import-trace``). Returns one dict per trace:
    path, trace_id, rank, events, gpu_events, steps, skipped.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise TraceError(f"{run_dir} exists and is not a directory")
    parsed = [(Path(p), *_parse(Path(p), None)) for p in paths]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceError(f"cannot create run directory {run_dir}: {e.strerror or e}") from e

    results: list[dict[str, Any]] = []
    seen: dict[int, set[str]] = {}
    for path, table, trace_id, rank in parsed:
        ev_dir = run_dir / "trace_events" / f"rank={rank}"
        if rank not in seen:
            seen[rank] = _existing_trace_ids(ev_dir)
        cats = table.column("cat").to_numpy(zero_copy_only=False)
        steps = table.column("step").drop_null().unique().to_pylist()
        info: dict[str, Any] = {
            "path": str(path),
            "trace_id": trace_id,
            "rank": rank,
            "events": table.num_rows,
            "gpu_events": int(np.isin(cats, GPU_ACTIVITY_CATS).sum()) if len(cats) else 0,
            "steps": len(steps),
            "skipped": trace_id in seen[rank],
        }
        results.append(info)
        if info["skipped"]:
            continue
        try:
            if table.num_rows:
                _write_part(table, ev_dir)
            raw_dir = run_dir / "traces" / f"rank={rank}"
            raw_dir.mkdir(parents=True, exist_ok=True)
            dest = raw_dir / (_SAFE_NAME.sub("_", path.name).lstrip(".") or "trace.json")
            if dest.exists():  # another trace of that name: '<stem>-<digest>.<ext>'
                dest = raw_dir / _copy_name(path, hashlib.sha1(_read_bytes(path)).hexdigest()[:12])
            if dest.parent != raw_dir or not is_real_dir(raw_dir):  # defence in depth
                raise TraceError(f"refusing to write outside {run_dir}: {dest}")
            tmp = raw_dir / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, dest)
        except OSError as e:
            raise TraceError(f"cannot write into {run_dir}: {e.strerror or e}") from e
        seen[rank].add(trace_id)
    _ensure_run(run_dir, (r["rank"] for r in results))
    return results
