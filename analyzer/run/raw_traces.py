"""Raw profiler traces kept under a run's ``traces/rank=<r>/`` that have no parquet rows yet
(copied in by the recorder or by import-trace before it wrote its parts): parsed when the run
is opened, so the ``trace_events`` view always covers them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import one_line
from .trace_cache import TraceCache, key


def load_raw_traces(run: Any, con: Any, q: str = "") -> Any:
    """pyarrow.Table of trace events from ``run``'s (a catalog.Run's) raw traces under
    traces/ with no parquet rows in ``con``'s ``{q}trace_events`` view.

    Reading is done by ``tracealyze.analyzer.ingest.read.read_trace`` (imported lazily), once
    per trace's bytes: the rows are kept in the user's cache (:mod:`.trace_cache`). A trace
    that cannot be read is named in ``skipped_parts`` and left out.
    """
    if not run.raw_traces:
        return None
    import pyarrow as pa

    from ..sql.schema import arrow_schema

    have = {r[0] for r in con.execute(
        f"SELECT DISTINCT trace_id FROM {q}trace_events WHERE trace_id IS NOT NULL").fetchall()}
    target = arrow_schema("trace_events")
    tables = []
    cache = TraceCache()
    try:
        for rank, path in run.raw_traces:
            try:
                t = _parsed(cache, path, rank, have)
            except Exception as e:  # a bad trace must not stop the analysis of the rest
                run.skipped_parts.append((path, f"unreadable trace ({type(e).__name__}: "
                                                f"{one_line(e)[:160]})"))
                continue
            if t is None:
                continue
            cols = []
            for field in target:
                if field.name in t.column_names:
                    cols.append(t.column(field.name).cast(field.type))
                else:
                    cols.append(pa.nulls(t.num_rows, field.type))
            tables.append(pa.Table.from_arrays(cols, schema=target))
    finally:
        cache.close()
    return pa.concat_tables(tables) if tables else None


def _parsed(cache: TraceCache, path: Any, rank: int, have: set[str]) -> Any:
    """The rows of one raw trace, or None when its events are already in the run's parts:
    from the cache when these bytes were parsed before (:mod:`.trace_cache`), else parsed
    and kept there."""
    from ..ingest.read import read_trace, trace_id_for

    name = key(Path(path), rank) if cache.usable else None
    known = cache.trace_id(name) if name else None
    if known is not None and known in have:
        return None
    t = cache.rows(name) if name and known is not None else None
    if t is None:
        tid = known or trace_id_for(path)
        if tid in have:
            if name:
                cache.keep(name, tid)
            return None
        t = read_trace(path, rank=rank)
        if name:
            cache.keep(name, tid, t)
    if t.num_rows and "trace_id" in t.column_names and \
            set(t.column("trace_id").unique().to_pylist()) & have:
        return None
    return t
