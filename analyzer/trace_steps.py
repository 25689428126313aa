"""The second pass of trace ingest (:mod:`.trace_stream`): every row gets its step and the
rows their time order. ``ProfilerStep#N`` containment for host rows, the launching runtime
call's step for device rows (joined on ``correlation``). A trace of one batch is done in numpy;
a bigger one by DuckDB under a memory limit, spilling to the temp directory, so memory stays
flat whatever the trace's size. Both give the same rows (tested)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from .arrow_build import numeric, repeated
from .arrow_build import values as np_values
from .trace_fields import GPU_SIDE_CATS, LAUNCH_CATS

DUCKDB_MEMORY = "256MB"
"""DuckDB's budget for the second pass; beyond it, it spills to the temp directory."""
GPU_SIDE = tuple(sorted(GPU_SIDE_CATS))
LAUNCH = LAUNCH_CATS
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


_SECOND_PASS = f"""
COPY (
  WITH ev AS (SELECT * FROM read_parquet(?)),
  spans AS (
    SELECT ts_us AS s, ts_us + dur_us AS e,
           CAST(regexp_extract(name, '^ProfilerStep#([0-9]+)$', 1) AS BIGINT) AS step
    FROM ev WHERE regexp_matches(name, '^ProfilerStep#[0-9]+$')
      AND coalesce(cat, '') NOT IN {GPU_SIDE}),
  host AS (
    SELECT ev.i, CASE WHEN ev.ts_us <= sp.e THEN sp.step END AS step
    FROM (SELECT i, ts_us FROM ev WHERE coalesce(cat, '') NOT IN {GPU_SIDE}) ev
    ASOF LEFT JOIN spans sp ON ev.ts_us >= sp.s),
  launch AS (
    SELECT ev.correlation, min_by(h.step, ev.i) AS step
    FROM ev JOIN host h ON h.i = ev.i
    WHERE ev.cat IN {LAUNCH} AND ev.correlation >= 0 AND h.step IS NOT NULL
    GROUP BY ev.correlation)
  SELECT ? AS trace_id,
         CASE WHEN coalesce(ev.cat, '') IN {GPU_SIDE} THEN l.step ELSE h.step END AS step,
         ev.cat, ev.name, ev.ts_us, ev.dur_us, ev.pid, ev.tid, ev.stream, ev.correlation,
         ev.external_id, ev.device, ev.args
  FROM ev
  LEFT JOIN host h ON h.i = ev.i
  LEFT JOIN launch l ON l.correlation = ev.correlation
                    AND coalesce(ev.cat, '') IN {GPU_SIDE} AND ev.correlation >= 0
  ORDER BY ev.ts_us, ev.i
) TO '{{out}}' (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE 1048576)
"""


def assign_steps(first: Path, out: Path, trace_id_: str, tmp_dir: Path) -> None:
    """Second pass: steps, time order and the final columns, by DuckDB in bounded memory."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
        con.execute(f"SET temp_directory = '{_sql_path(tmp_dir)}'")
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
        con.execute(_SECOND_PASS.replace("{out}", _sql_path(out)), [str(first), trace_id_])
    finally:
        con.close()


def _sql_path(p: Path) -> str:
    return str(p).replace("'", "''")


def finish_in_memory(rb: pa.RecordBatch, trace_id_: str) -> pa.Table:
    """The second pass of a one-batch trace, in numpy (same rules as the SQL)."""
    cats = rb.column("cat").to_pylist()
    names = rb.column("name").to_pylist()
    ts = np_values(rb.column("ts_us"))
    dur = np_values(rb.column("dur_us"))
    corr = rb.column("correlation").to_pylist()
    values, valid = steps_in_memory(cats, names, ts, dur, corr)
    order = numeric(np.lexsort((np_values(rb.column("i")), ts)), pa.int64())
    t = pa.Table.from_batches([rb]).drop_columns(["i"])
    t = t.add_column(0, "step", numeric(values, pa.int64(), ~valid))
    t = t.add_column(0, "trace_id", repeated(trace_id_, rb.num_rows))
    return t.take(order)


def steps_in_memory(cats: list[str | None], names: list[str], ts: np.ndarray,
                    dur: np.ndarray, corrs: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """(step values, valid mask): ProfilerStep#N containment for host rows, then the
    launching runtime call's step for device rows (same correlation)."""
    n = len(ts)
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    step_rows = [
        (i, int(m.group(1)))
        for i, nm in enumerate(names)
        if nm.startswith("ProfilerStep#") and (m := _STEP_RE.match(nm))
        and cats[i] not in GPU_SIDE_CATS
    ]
    if not step_rows or n == 0:
        return values, valid
    idx = np.array([i for i, _ in step_rows])
    nums = np.array([s for _, s in step_rows], dtype=np.int64)
    starts = ts[idx]
    ends = starts + dur[idx]
    o = np.argsort(starts, kind="stable")
    starts, ends, nums = starts[o], ends[o], nums[o]
    gpu = np.fromiter((c in GPU_SIDE_CATS for c in cats), dtype=bool, count=n)
    # Host rows: the step whose span contains the row's start (any thread: backward and
    # data-loader threads run inside the main thread's ProfilerStep span).
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts <= ends[np.clip(k, 0, None)]) & ~gpu
    values[inside] = nums[k[inside]]
    valid[inside] = True
    # Device rows: the step of the runtime call that launched them (same correlation id).
    corr = np.fromiter((-1 if c is None else c for c in corrs), dtype=np.int64, count=n)
    launch = valid & (corr >= 0) & np.fromiter((c in LAUNCH_CATS for c in cats), bool, n)
    if launch.any():
        lc, ls = corr[launch], values[launch]
        lo = np.argsort(lc, kind="stable")
        lc, ls = lc[lo], ls[lo]
        want = gpu & (corr >= 0)
        j = np.searchsorted(lc, corr[want])
        jc = np.clip(j, 0, len(lc) - 1)
        hit = lc[jc] == corr[want]
        rows = np.flatnonzero(want)[hit]
        values[rows] = ls[jc[hit]]
        valid[rows] = True
    return values, valid
