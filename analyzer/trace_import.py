"""``tracealyze import-trace``: profiler traces written into a run directory as
``trace_events`` parts plus a copy of each raw trace. Nothing read from a trace (its own
trace_id, its rank) ever becomes a path outside the run directory."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from tracealyze.format.parts import (
    data_parts,
    is_real_dir,
    next_seq_in,
    part_name,
    write_json_atomic,
)
from tracealyze.format.runmeta import new_run_meta

from .errors import TraceError
from .trace_fields import GPU_ACTIVITY_CATS, trace_stem
from .trace_stream import Limits, ingest

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


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


def _copy_name(path: Path, digest: str) -> str:
    """File name of the raw trace's copy: the source's file name made safe, with its content
    digest. Nothing read from the trace itself (its own trace_id) names a file."""
    stem = _SAFE_NAME.sub("_", trace_stem(path)).lstrip(".")[:120] or "trace"
    ext = path.name[len(trace_stem(path)):]
    ext = ext if _SAFE_NAME.search(ext) is None else ".json"
    return (stem if stem.endswith(f"-{digest}") else f"{stem}-{digest}") + ext


def _counts(part: Path) -> tuple[int, int]:
    """(GPU activity events, distinct steps) of a written part, read by row group."""
    gpu, steps = 0, set()
    for rb in pq.ParquetFile(part).iter_batches(columns=["cat", "step"]):
        cats = rb.column(0).to_numpy(zero_copy_only=False)
        gpu += int(np.isin(cats, GPU_ACTIVITY_CATS).sum())
        steps.update(v for v in rb.column(1).unique().to_pylist() if v is not None)
    return gpu, len(steps)


def _staging(run_dir: Path) -> Path:
    """A scratch folder beside the run (same file system: parts are renamed into place)."""
    parent = run_dir.parent if run_dir.parent.is_dir() else None
    return Path(tempfile.mkdtemp(prefix=".tracealyze-import-", dir=parent))


def import_traces(paths: list[Path], run_dir: Path, *, keep_raw: bool = False,
                  limits: Limits | None = None) -> list[dict[str, Any]]:
    """Import profiler traces into ``run_dir`` (``tracealyze import-trace``).

    Every trace is streamed first into a scratch folder (so one bad file imports nothing
    and raises :class:`TraceError`), then each becomes a
    ``trace_events/rank=<r>/part-<seq>.parquet``; with ``keep_raw`` a copy of the raw file
    also goes under ``traces/rank=<r>/`` (for Perfetto or chrome://tracing). A trace whose
    trace_id is already in the run for that rank is not written again (``skipped: True``).
    A directory that is not a run yet gets a minimal run.json (``source: import-trace``).
    ``limits`` guard against decompression bombs. Returns one dict per trace: path,
    trace_id, rank, events, gpu_events, steps, skipped.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise TraceError(f"{run_dir} exists and is not a directory")
    stage = _staging(run_dir)
    try:
        staged = []
        for k, p in enumerate(paths):
            out = stage / f"{k}.parquet"
            staged.append((Path(p), out, ingest(Path(p), out, limits=limits, tmp_dir=stage)))
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TraceError(f"cannot create run directory {run_dir}: {e.strerror or e}") \
                from e
        seen: dict[int, set[str]] = {}  # per rank: trace_ids in the run (read once)
        results = [_place(run_dir, path, out, info, keep_raw, seen)
                   for path, out, info in staged]
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    _ensure_run(run_dir, (r["rank"] for r in results))
    return results


def _place(run_dir: Path, path: Path, part: Path, info: Any, keep_raw: bool,
           seen: dict[int, set[str]]) -> dict[str, Any]:
    """Move one staged part into the run (unless its trace is already there)."""
    rank = info.rank
    ev_dir = run_dir / "trace_events" / f"rank={rank}"
    if rank not in seen:
        seen[rank] = _existing_trace_ids(ev_dir)
    have = seen[rank]
    gpu, steps = _counts(part)
    result: dict[str, Any] = {"path": str(path), "trace_id": info.trace_id, "rank": rank,
                              "events": info.events, "gpu_events": gpu, "steps": steps,
                              "skipped": info.trace_id in have}
    if result["skipped"]:
        return result
    try:
        if info.events:
            ev_dir.mkdir(parents=True, exist_ok=True)
            dest = ev_dir / part_name(next_seq_in(ev_dir))
            if dest.exists() or not is_real_dir(ev_dir):  # never over another part
                raise TraceError(f"refusing to write over {dest}")
            os.replace(part, dest)
        if keep_raw:
            _keep_raw(run_dir, path, rank, info.digest)
    except OSError as e:
        raise TraceError(f"cannot write into {run_dir}: {e.strerror or e}") from e
    have.add(info.trace_id)
    return result


def _keep_raw(run_dir: Path, path: Path, rank: int, digest: str) -> None:
    raw_dir = run_dir / "traces" / f"rank={rank}"
    raw_dir.mkdir(parents=True, exist_ok=True)
    dest = raw_dir / (_SAFE_NAME.sub("_", path.name).lstrip(".") or "trace.json")
    if dest.exists():  # another trace of that name: '<stem>-<digest>.<ext>'
        dest = raw_dir / _copy_name(path, digest)
    if dest.parent != raw_dir or not is_real_dir(raw_dir):  # defence in depth
        raise TraceError(f"refusing to write outside {run_dir}: {dest}")
    tmp = raw_dir / f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp"
    shutil.copyfile(path, tmp)
    os.replace(tmp, dest)
