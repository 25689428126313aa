"""The fast path of trace ingest: DuckDB's JSON reader does the per-event work in C++.

The events array is copied, byte for byte and without being parsed, from the guarded reader
(bomb guard, hash, first and last MiB for the metadata) into a scratch file that holds only
``[ ...events... ]``. DuckDB then reads that file with its JSON reader into the first-pass
columns (the same rules as :func:`.stream._convert`, written in SQL: categories, the args
promoted to columns, integers from integral floats and numeric strings, args JSON without
the promoted keys, long args cut to their scalars) and the second pass (steps, time order)
runs in the same connection, under the same memory limit, spilling to the scratch folder.
No Python object is made per event: at 15 MB of JSON this path takes a third of the time
of the orjson-and-Python one, most of it start-up.

The end of the array is found in the last MiB, held back while copying: the first ``}]``
after which the rest of the document parses. Anything this path cannot read (no events
array near the start, an array that does not end in the last MiB, JSON DuckDB refuses, an
element over DuckDB's object size) raises :class:`.chunks.Fallback` and the caller reads the
trace again with the Python path, which gives the authoritative error for a broken trace.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from ..sql.safe import execute_one, literal, lock, sandbox
from .chunks import CHUNK, Fallback, _start
from .fields import ARGS_MAX_BYTES, CAT_ALIASES, GPU_SIDE_CATS, PROMOTED_HOST_ARGS
from .reader import EDGE, READ_SIZE
from .steps import stages, write_final

_END = re.compile(rb"\}\s*\]")
FAST_MEMORY = "128MB"
"""DuckDB's budget here, spilling past it: with the reader's buffers and the libraries, peak
RSS stays under the JSON's size from ~400 MB of JSON (256 MB gave 1.17x at 524 MB)."""
MAX_OBJECT = 16 << 20
"""Largest single event DuckDB reads here (bytes; its reader holds buffers of this size per
thread); a bigger one goes to the Python path."""


def copy_array(reader: Any, dst: Path) -> None:
    """Write the trace's events array as a JSON document of its own to ``dst``; reads the
    whole trace (the hash covers all of it). Raises Fallback where it cannot."""
    first = b""
    while not first.strip():
        chunk = reader.read(READ_SIZE)
        if not chunk:
            raise Fallback("empty")
        first += chunk
    buf, bare = _start(reader, first)
    wrote = False
    with open(dst, "wb") as f:
        f.write(b"[")
        while True:
            data = reader.read(CHUNK)
            if not data:
                break
            buf += data
            if len(buf) > EDGE + CHUNK:  # keep the last MiB back: the array ends there
                cut = len(buf) - EDGE
                f.write(buf[:cut])
                buf = buf[cut:]
                wrote = True
        f.write(buf[:_array_end(buf, bare, wrote)])
        f.write(b"]")


def _array_end(buf: bytes, bare: bool, wrote: bool) -> int:
    """Where the events array's content ends in ``buf`` (the index of its ``]``)."""
    ends = [m.start() + 1 for m in _END.finditer(buf)]
    stripped = len(buf) - len(buf.lstrip())
    if buf[stripped:stripped + 1] == b"]":  # an empty array, or one that ended at the cut
        ends.insert(0, stripped)
    for end in ends:
        rest = buf[buf.index(b"]", end) + 1:]
        if bare:
            if not rest.strip():
                return end
            continue
        try:
            orjson.loads(b'{"_": 0' + rest)  # the remaining keys and the closing brace
        except orjson.JSONDecodeError:
            continue
        return end
    raise Fallback("the events array does not end in the last MiB" if wrote else "no end")


def _int(col: str) -> str:
    """SQL: a JSON value as BIGINT, as :func:`.fields.to_int` reads it."""
    return (f"CASE json_type({col}) "
            f"WHEN 'BIGINT' THEN TRY_CAST({col} AS BIGINT) "
            f"WHEN 'UBIGINT' THEN TRY_CAST({col} AS BIGINT) "
            f"WHEN 'DOUBLE' THEN CASE WHEN isfinite({col}::DOUBLE) "
            f"AND {col}::DOUBLE = floor({col}::DOUBLE) AND abs({col}::DOUBLE) < 9.2e18 "
            f"THEN {col}::DOUBLE::BIGINT END "
            f"WHEN 'VARCHAR' THEN TRY_CAST(trim({col}->>'$') AS BIGINT) END")


def _float(col: str) -> str:
    """SQL: a JSON value as DOUBLE, as Python's float() reads it (NULL: not a number)."""
    return (f"CASE json_type({col}) WHEN 'VARCHAR' THEN TRY_CAST(trim({col}->>'$') AS DOUBLE) "
            f"WHEN 'BOOLEAN' THEN CASE WHEN {col}::BOOLEAN THEN 1.0 ELSE 0.0 END "
            f"WHEN 'NULL' THEN NULL ELSE TRY_CAST({col} AS DOUBLE) END")


def _strip(keys: frozenset[str]) -> str:
    """SQL: a JSON merge patch that removes ``keys`` (braces doubled for str.format)."""
    patch = orjson.dumps(dict.fromkeys(sorted(keys))).decode().replace("'", "''")
    return "'" + patch.replace("{", "{{").replace("}", "}}") + "'"


_CAT = ("CASE cat " + " ".join(f"WHEN {literal(k)} THEN {literal(v)}"
                                for k, v in sorted(CAT_ALIASES.items())) + " ELSE cat END")
_GPU_SIDE = "(" + ", ".join(literal(c) for c in sorted(GPU_SIDE_CATS)) + ")"
_SCALARS = ("to_json(map_from_entries(list_filter(list_transform(json_keys(t), "
            "lambda k: struct_pack(k := k, v := t::JSON->k)), "
            "lambda x: json_type(x.v) NOT IN ('ARRAY', 'OBJECT'))))::VARCHAR")

FIRST_PASS_COLUMNS = """CREATE TABLE first_pass (
    i BIGINT, cat VARCHAR, name VARCHAR, ts_us DOUBLE, dur_us DOUBLE, pid BIGINT, tid BIGINT,
    stream BIGINT, correlation BIGINT, external_id BIGINT, device BIGINT, args VARCHAR)"""
"""The first pass's columns (:data:`.stream.FIRST_PASS`), all nullable."""

FIRST_PASS_SQL = f"""
INSERT INTO first_pass
WITH raw AS (
    -- ts and dur as numbers and name as text straight from the parser (a value that is
    -- not one fails the read, and the Python path takes the trace)
    SELECT * FROM read_json({{src}}, format = 'array', maximum_object_size = {MAX_OBJECT},
        columns = {{{{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', ts: 'DOUBLE',
                    dur: 'DOUBLE', pid: 'JSON', tid: 'JSON', args: 'JSON'}}}})
),
kept AS (  -- complete events and the allocator's instants; i: position among them
    SELECT row_number() OVER () - 1 AS i, * FROM raw
    WHERE ph = 'X' OR (ph = 'i' AND name = '[memory]')
),
promoted AS (
    SELECT i, {_CAT} AS cat, coalesce(name, '') AS name, ts AS ts_us,
        coalesce(dur, 0.0) AS dur_us, {_int('pid')} AS pid, {_int('tid')} AS tid,
        -- args parsed twice: the four promoted values in one pass, the rest in another
        json_extract(args, ['$.stream', '$.correlation', '$."External id"', '$.device']) AS p,
        json_merge_patch(args, CASE WHEN {_CAT} IN {_GPU_SIDE}
                                 THEN {_strip(PROMOTED_HOST_ARGS | {"stream"})}
                                 ELSE {_strip(PROMOTED_HOST_ARGS)} END)::VARCHAR AS t,
        coalesce(json_type(args) = 'OBJECT', false) AS obj
    FROM kept
    WHERE ts IS NOT NULL AND coalesce(cat, '') <> 'Trace'
),
ints AS (
    SELECT *, CASE WHEN obj AND cat IN {_GPU_SIDE} THEN {_int('p[1]')} END AS s FROM promoted
)
SELECT i, cat, name, ts_us, dur_us, pid, tid,
    CASE WHEN s IN (-1, 4294967295) THEN NULL ELSE s END AS stream,
    CASE WHEN obj THEN {_int('p[2]')} END AS correlation,
    CASE WHEN obj THEN {_int('p[3]')} END AS external_id,
    CASE WHEN obj THEN {_int('p[4]')} END AS device,
    CASE WHEN NOT obj OR t = '{{{{}}}}' THEN NULL
         WHEN length(t) <= {ARGS_MAX_BYTES} THEN t
         -- too long: its scalar values only (input shapes and concrete inputs dropped)
         ELSE nullif(nullif({_SCALARS}, '{{{{}}}}'), '') END AS args
FROM ints
"""


def convert_and_finish(array: Path, out: Path, trace_id_: str, tmp_dir: Path) -> int:
    """Both passes over the array file: ``out`` gets the final ``trace_events`` rows; returns
    the number of events. Raises Fallback when DuckDB cannot read the array."""
    import duckdb

    con = duckdb.connect()  # in memory; spills to tmp_dir past the limit
    try:
        sandbox(con, [tmp_dir, array.parent, out.parent], temp_dir=tmp_dir)
        con.execute(f"SET memory_limit = '{FAST_MEMORY}'")
        con.execute("SET enable_progress_bar = false")
        # One thread: the position in the file is a window, which runs the first pass on
        # one thread anyway, and each thread holds its own buffers and sort runs (3M
        # events, 524 MB of JSON: peak RSS 405 MB on one thread, 490 MB on two; time
        # within 5%).
        con.execute("SET threads = 1")
        con.execute(FIRST_PASS_COLUMNS)
        try:  # (insertion order kept here: row_number() is the position in the file)
            execute_one(con, FIRST_PASS_SQL.format(src=literal(str(array))))
        except duckdb.Error as e:
            raise Fallback(f"DuckDB cannot read the events: {e}") from e
        con.execute("SET preserve_insertion_order = false")
        lock(con)
        for sql in stages("first_pass"):
            execute_one(con, sql)
        write_final(con, "first_pass", out, trace_id_)
        (n,) = con.execute("SELECT count(*) FROM first_pass").fetchone()
        return int(n)
    finally:
        con.close()
