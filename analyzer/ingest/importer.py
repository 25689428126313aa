"""``tracealyze import-trace``: profiler traces written into a run directory as
``trace_events`` parts plus a copy of each raw trace. Nothing read from a trace (its own
trace_id, its rank) ever becomes a path outside the run directory."""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from tracealyze.format.parts import data_parts, is_real_dir, next_seq_in, part_name
from tracealyze.format.runmeta import new_run_meta

from ..errors import TraceError
from ..writes import Dir, OutputError, private_dir, remove_tree
from .fields import GPU_ACTIVITY_CATS, trace_stem
from .ranks import trace_files
from .stream import Ingested, Limits, ingest

Progress = Callable[[int, int, Path, Ingested], None]
"""``progress(done, total, path, info)``, called as each trace has been read."""

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


def _ensure_run(run: Dir, ranks: Iterable[int]) -> None:
    import json

    if run.kind("run.json") is not None:
        return
    ranks = sorted(set(ranks))
    meta = new_run_meta(preset=None, knobs=None, world_size=(max(ranks) + 1) if ranks else 1,
                        source="import-trace", status="completed")
    run.write_atomic("run.json", json.dumps(meta, indent=1, allow_nan=False))


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
    return private_dir(parent, prefix=".tracealyze-import-")


def default_jobs() -> int:
    """Traces read at once: each reader holds a fixed ~0.5 GB buffer, so at most 4."""
    return max(1, min(4, os.cpu_count() or 1))


def _stage_all(paths: list[Path], stage: Path, limits: Limits | None, jobs: int,
               progress: Progress | None) -> list[Ingested]:
    """Stream every trace into ``stage/<k>.parquet``, ``jobs`` processes at a time."""
    outs = [stage / f"{k}.parquet" for k in range(len(paths))]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and not Path(main_file).is_file():  # python - < script: spawn cannot start
        jobs = 1
    if jobs > 1 and len(paths) > 1:
        try:
            return _stage_parallel(paths, outs, stage, limits, jobs, progress)
        except BrokenProcessPool:  # a reader died (killed, out of memory): once more, alone
            pass
    infos = []
    for k, (p, out) in enumerate(zip(paths, outs, strict=True)):
        infos.append(ingest(p, out, limits=limits, tmp_dir=stage))
        if progress:
            progress(k + 1, len(paths), p, infos[-1])
    return infos


def _stage_parallel(paths: list[Path], outs: list[Path], stage: Path, limits: Limits | None,
                    jobs: int, progress: Progress | None) -> list[Ingested]:
    # spawn, not fork: the caller may hold DuckDB connections (threads) that fork would copy
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(paths)), mp_context=ctx) as ex:
        futures = {ex.submit(ingest, p, out, limits=limits, tmp_dir=stage): k
                   for k, (p, out) in enumerate(zip(paths, outs, strict=True))}
        infos: list[Ingested | None] = [None] * len(paths)
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:  # one bad trace imports nothing: stop now
                    for other in pending:
                        other.cancel()
                    raise f.exception()
                k = futures[f]
                infos[k] = f.result()
                if progress:
                    progress(sum(i is not None for i in infos), len(paths), paths[k], infos[k])
    return [i for i in infos if i is not None]


def import_traces(paths: list[Path], run_dir: Path, *, keep_raw: bool = False,
                  limits: Limits | None = None, jobs: int | None = None,
                  progress: Progress | None = None,
                  skipped: list[Path] | None = None) -> list[dict[str, Any]]:
    """Import profiler traces into ``run_dir`` (``tracealyze import-trace``).

    ``paths`` are trace files or directories of them (one trace per rank and profiling
    window, as ``tensorboard_trace_handler`` writes; see :mod:`.ranks` for how a trace's
    rank is found; JSON files in a directory that are not traces are left out and appended
    to ``skipped``). ``jobs`` traces are read at once (default :func:`default_jobs`).

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
    files = trace_files(paths, skipped)
    stage = _staging(run_dir)
    try:
        infos = _stage_all(files, stage, limits, default_jobs() if jobs is None else jobs,
                           progress)
        staged = [(p, stage / f"{k}.parquet", info)
                  for k, (p, info) in enumerate(zip(files, infos, strict=True))]
        try:
            run = Dir.open(run_dir, create=True)
        except OutputError as e:
            raise TraceError(f"cannot create run directory {run_dir}: {e}") from None
        with run:
            seen: dict[int, set[str]] = {}  # per rank: trace_ids in the run (read once)
            results = [_place(run, path, out, info, keep_raw, seen)
                       for path, out, info in staged]
            _ensure_run(run, (r["rank"] for r in results))
    finally:
        remove_tree(stage)
    return results


def _place(run: Dir, path: Path, part: Path, info: Any, keep_raw: bool,
           seen: dict[int, set[str]]) -> dict[str, Any]:
    """Put one staged part into the run (unless its trace is already there). Every folder
    on the way is opened without following links (a stranger's run may hold one)."""
    rank = info.rank
    try:
        ev_dir = run.walk("trace_events", f"rank={rank}", create=bool(info.events)) \
            if info.events or rank not in seen else None
    except OutputError as e:
        if info.events:
            raise TraceError(f"cannot write into {run.path}: {e}") from None
        ev_dir = None  # (no events to place and no such folder: nothing seen there)
    if rank not in seen:
        seen[rank] = _existing_trace_ids(ev_dir.path) if ev_dir is not None else set()
    have = seen[rank]
    gpu, steps = _counts(part)
    result: dict[str, Any] = {"path": str(path), "trace_id": info.trace_id, "rank": rank,
                              "events": info.events, "gpu_events": gpu, "steps": steps,
                              "skipped": info.trace_id in have}
    try:
        if result["skipped"]:
            return result
        if ev_dir is not None and info.events:
            _publish_part(ev_dir, part)
        if keep_raw:
            _keep_raw(run, path, rank, info.digest)
    except OutputError as e:
        raise TraceError(f"cannot write into {run.path}: {e}") from None
    finally:
        if ev_dir is not None:
            ev_dir.close()
    have.add(info.trace_id)
    return result


def _publish_part(ev_dir: Dir, part: Path) -> None:
    """The staged part under the next free part name: never over another part (a writer
    that took the name first wins; we take the next)."""
    if not is_real_dir(ev_dir.path):  # (defence in depth: the descriptor is the real check)
        raise TraceError(f"refusing to write into {ev_dir.path}: not a real folder")
    seq = next_seq_in(ev_dir.path)
    for _ in range(1000):
        if ev_dir.publish(part_name(seq), part):
            return
        seq += 1
    raise TraceError(f"cannot find a free part name in {ev_dir.path}")


def _keep_raw(run: Dir, path: Path, rank: int, digest: str) -> None:
    with run.walk("traces", f"rank={rank}") as raw_dir:
        name = _SAFE_NAME.sub("_", path.name).lstrip(".") or "trace.json"
        # a name taken by another trace: '<stem>-<digest>.<ext>' (the same bytes, if taken
        # again, are the same copy)
        if not raw_dir.publish(name, path) and raw_dir.kind(_copy_name(path, digest)) is None:
            raw_dir.publish(_copy_name(path, digest), path)
