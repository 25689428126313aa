"""Raw profiler traces kept under a run's ``traces/rank=<r>/`` that have no parquet rows yet
(copied in by the recorder or by import-trace before it wrote its parts): parsed when the run
is opened, so the ``trace_events`` view always covers them."""

from __future__ import annotations

from typing import Any

from ..errors import one_line


def load_raw_traces(run: Any, con: Any, q: str = "") -> Any:
    """pyarrow.Table of trace events from ``run``'s (a catalog.Run's) raw traces under
    traces/ with no parquet rows in ``con``'s ``{q}trace_events`` view.

    Reading is done by ``tracealyze.analyzer.ingest.read.read_trace`` (imported lazily). A trace
    that cannot be read is named in ``skipped_parts`` and left out.
    """
    if not run.raw_traces:
        return None
    import pyarrow as pa

    from ..ingest.read import read_trace, trace_id_for
    from ..sql.schema import arrow_schema

    have = {r[0] for r in con.execute(
        f"SELECT DISTINCT trace_id FROM {q}trace_events WHERE trace_id IS NOT NULL").fetchall()}
    target = arrow_schema("trace_events")
    tables = []
    for rank, path in run.raw_traces:
        try:
            if trace_id_for(path) in have:
                continue
            t = read_trace(path, rank=rank)
        except Exception as e:  # a bad trace must not stop the analysis of everything else
            run.skipped_parts.append((path, f"unreadable trace ({type(e).__name__}: "
                                            f"{one_line(e)[:160]})"))
            continue
        if t.num_rows and "trace_id" in t.column_names:
            ids = set(t.column("trace_id").unique().to_pylist())
            if ids & have:
                continue
        cols = []
        for field in target:
            if field.name in t.column_names:
                cols.append(t.column(field.name).cast(field.type))
            else:
                cols.append(pa.nulls(t.num_rows, field.type))
        tables.append(pa.Table.from_arrays(cols, schema=target))
    return pa.concat_tables(tables) if tables else None
