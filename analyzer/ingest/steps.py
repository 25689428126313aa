"""The second pass of trace ingest (:mod:`.stream`): every row gets its step and the
rows their time order. ``ProfilerStep#N`` containment for host rows, the launching runtime
call's step for device rows (joined on ``correlation``). A trace of one batch is done in numpy;
a bigger one by DuckDB under a memory limit, spilling to the temp directory, so memory stays
flat whatever the trace's size. Both give the same rows (tested)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .arrow_build import call, compute_options, numeric, repeated, strings
from .arrow_build import values as np_values
from .fields import GPU_SIDE_CATS, LAUNCH_CATS

DUCKDB_MEMORY = "128MB"
"""DuckDB's budget for the second pass, on one thread; beyond it, it spills to the temp
directory. Measured on a 523 MB trace (2M rows): 256 MB and two threads peaked at 655 MB
RSS, 128 MB on two threads at 528 MB, 128 MB on one thread at 457 MB (0.87x the JSON; the
whole import 16 s against 14 s)."""
GPU_SIDE = tuple(sorted(GPU_SIDE_CATS))
LAUNCH = LAUNCH_CATS
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


_HOST = f"coalesce(cat, '') NOT IN {GPU_SIDE}"
_STAGES = (
    # ProfilerStep spans (a few per trace)
    f"""CREATE TABLE spans AS
        SELECT ts_us AS s, ts_us + dur_us AS e,
               CAST(regexp_extract(name, '^ProfilerStep#([0-9]+)$', 1) AS BIGINT) AS step
        FROM {{src}} WHERE regexp_matches(name, '^ProfilerStep#[0-9]+$')
          AND {_HOST}""",
    # host rows: the span that contains their start (narrow rows only)
    f"""CREATE TABLE host AS
        SELECT ev.i, ev.cat, ev.correlation,
               CASE WHEN ev.ts_us <= sp.e THEN sp.step END AS step
        FROM (SELECT i, ts_us, cat, correlation FROM {{src}}
              WHERE {_HOST}) ev
        ASOF LEFT JOIN spans sp ON ev.ts_us >= sp.s""",
    # device rows: the step of the runtime call that launched them
    f"""CREATE TABLE launch AS
        SELECT correlation, min_by(step, i) AS step FROM host
        WHERE cat IN {LAUNCH} AND correlation >= 0 AND step IS NOT NULL
        GROUP BY correlation""",
    f"""CREATE TABLE steps AS
        SELECT i, step FROM host WHERE step IS NOT NULL
        UNION ALL
        SELECT ev.i, l.step
        FROM (SELECT i, correlation FROM {{src}}
              WHERE NOT ({_HOST}) AND correlation >= 0) ev
        JOIN launch l USING (correlation)""",
)
# the wide rows once: joined with their step, sorted by time (spills when it must)
_FINAL = """
    SELECT {trace_id} AS trace_id, s.step, ev.cat, ev.name, ev.ts_us, ev.dur_us, ev.pid,
           ev.tid, ev.stream, ev.correlation, ev.external_id, ev.device, ev.args
    FROM {src} ev LEFT JOIN steps s ON s.i = ev.i
    ORDER BY ev.ts_us, ev.i"""
ROW_GROUP = 1 << 17
"""Rows per batch and row group of the final write (batches of 2^20 rows held ~150 MB)."""
WRITE_OPTIONS = {"compression": "zstd", "use_dictionary": ["trace_id", "cat", "name"]}
"""How the final file is written: dictionary pages only for the columns that repeat (the
args, unique per event, made every write try a dictionary and give it up: a quarter of
the write's time on a 45k-event trace, and 25% larger files)."""


def write_final(con: Any, src: str, out: Path, trace_id_: str) -> None:
    """The last stage, streamed into ``out`` under the declared schema: DuckDB's own Parquet
    writer marks every column without a null as required, so two traces' files would
    differ in schema by their data."""
    import pyarrow.parquet as pq

    from ..sql.safe import literal, one_statement
    from .fields import TRACE_EVENTS_SCHEMA

    schema = TRACE_EVENTS_SCHEMA.remove(TRACE_EVENTS_SCHEMA.get_field_index("rank"))
    sql = _FINAL.format(src=src, trace_id=literal(trace_id_))
    # (con.sql: the streamed reader of a DB-API result would copy every row once more)
    reader = con.sql(one_statement(con, sql)).to_arrow_reader(ROW_GROUP)
    with pq.ParquetWriter(out, schema, **WRITE_OPTIONS) as w:
        for rb in reader:
            w.write_batch(rb.cast(schema), row_group_size=ROW_GROUP)


def stages(src: str) -> list[str]:
    """The second pass's statements before :func:`write_final`: over the first-pass rows
    ``src`` (a table, or a ``read_parquet(...)``). (``format``: the value is put in
    verbatim, whatever braces a path holds.)"""
    return [sql.format(src=src) for sql in _STAGES]


def assign_steps(first: Path, out: Path, trace_id_: str, tmp_dir: Path) -> None:
    """Second pass: steps, time order and the final columns, by DuckDB in bounded memory.
    In stages over narrow columns, with the intermediate tables in a database file in
    ``tmp_dir``: only the last stage touches the wide rows (names, args), and it is a join
    with a narrow table and a sort, both of which spill."""
    import duckdb

    from ..sql.safe import execute_one, literal, lock, sandbox

    con = duckdb.connect(str(tmp_dir / "steps.duckdb"))
    try:
        # The trace id comes from the trace: quoted, one statement per stage, and DuckDB
        # sees only the scratch files (sqlsafe).
        sandbox(con, [tmp_dir, first.parent, out.parent], temp_dir=tmp_dir)
        con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
        con.execute("SET threads = 1")  # (each thread holds its own buffers and sort runs)
        con.execute("SET preserve_insertion_order = false")
        con.execute("SET enable_progress_bar = false")
        lock(con)
        src = f"read_parquet({literal(str(first))})"
        for sql in stages(src):
            execute_one(con, sql)
        write_final(con, src, out, trace_id_)
    finally:
        con.close()


def write_in_memory(first: pa.Table, trace_id_: str, out: Path) -> None:
    """The second pass of a trace held in memory (``first``: the first-pass batches, never
    concatenated into one copy), in numpy (same rules as the SQL): the final rows, in time
    order, written to ``out`` a row group at a time (the sorted copy is never whole in
    memory either)."""
    import pyarrow.parquet as pq

    ts = _joined(first.column("ts_us"), np_values)
    order = numeric(np.lexsort((_joined(first.column("i"), np_values), ts)), pa.int64())
    t = _final(first, trace_id_, ts)
    with pq.ParquetWriter(out, t.schema, **WRITE_OPTIONS) as w:
        for a in range(0, max(len(order), 1), ROW_GROUP):
            w.write_table(call("take", t, order[a:a + ROW_GROUP]),
                          row_group_size=ROW_GROUP)


def _joined(col: pa.ChunkedArray, f: Callable[[pa.Array], np.ndarray]) -> np.ndarray:
    """``f`` of each chunk of a column, as one numpy array."""
    parts = [f(c) for c in col.chunks]
    return np.concatenate(parts) if parts else np.zeros(0, bool)  # (no chunk: no rows)


def _correlations(arr: pa.Array) -> np.ndarray:
    """Correlation ids with -1 for none."""
    return np.where(valid_mask(arr), np.frombuffer(arr.buffers()[1], np.int64, count=len(arr)),
                    -1)


def _final(first: pa.Table, trace_id_: str, ts: np.ndarray) -> pa.Table:
    """The first-pass rows with their step and trace id, in file order (``ts``: their
    times, as numpy)."""
    cat = first.column("cat")
    gpu = _joined(_is_in(cat, GPU_SIDE), _mask)
    launch = _joined(_is_in(cat, LAUNCH), _mask)
    name = first.column("name")
    spans = _joined(call("match_substring_regex", name, options=compute_options(
        "MatchSubstringOptions", pattern=_STEP_RE.pattern)), _mask)
    marks = np.flatnonzero(spans & ~gpu)
    step_rows = [(int(i), int(_STEP_RE.match(name[int(i)].as_py()).group(1))) for i in marks]
    values, valid = steps_in_memory(step_rows, gpu, launch, ts,
                                    _joined(first.column("dur_us"), np_values),
                                    _joined(first.column("correlation"), _correlations))
    t = first.drop_columns(["i"])
    t = t.add_column(0, "step", numeric(values, pa.int64(), ~valid))
    return t.add_column(0, "trace_id", repeated(trace_id_, first.num_rows))


def _is_in(col: pa.ChunkedArray, values: tuple[str, ...]) -> pa.ChunkedArray:
    return call("is_in", col, options=compute_options("SetLookupOptions",
                                                      value_set=strings(list(values))))


def _bits(buf: pa.Buffer, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little", count=n).astype(bool)


def valid_mask(arr: pa.Array) -> np.ndarray:
    """Which entries of an array (offset 0) are not null."""
    buf = arr.buffers()[0]
    return np.ones(len(arr), bool) if buf is None or not arr.null_count else _bits(buf, len(arr))


def _mask(arr: pa.Array) -> np.ndarray:
    """A boolean array of offset 0 as numpy, nulls as False (no ``fill_null``: it makes a
    scalar through ``pa.scalar``, which imports pandas when it is installed)."""
    return _bits(arr.buffers()[1], len(arr)) & valid_mask(arr)


def steps_in_memory(step_rows: list[tuple[int, int]], gpu: np.ndarray, launch: np.ndarray,
                    ts: np.ndarray, dur: np.ndarray, corr: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(step values, valid mask): ProfilerStep#N containment for host rows (``step_rows``:
    (row, N) of the host ProfilerStep spans), then the launching runtime call's step for
    device rows (``gpu``) with the same correlation (``corr``, -1: none) as a ``launch``
    row."""
    n = len(ts)
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    if not step_rows or n == 0:
        return values, valid
    idx = np.array([i for i, _ in step_rows])
    nums = np.array([s for _, s in step_rows], dtype=np.int64)
    starts = ts[idx]
    ends = starts + dur[idx]
    o = np.argsort(starts, kind="stable")
    starts, ends, nums = starts[o], ends[o], nums[o]
    # Host rows: the step whose span contains the row's start (any thread: backward and
    # data-loader threads run inside the main thread's ProfilerStep span).
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts <= ends[np.clip(k, 0, None)]) & ~gpu
    values[inside] = nums[k[inside]]
    valid[inside] = True
    # Device rows: the step of the runtime call that launched them (same correlation id).
    launch = valid & (corr >= 0) & launch
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
