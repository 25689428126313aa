"""Memory from profiler traces: what the allocator's ``[memory]`` instant events (written with
``torch.profiler.profile(profile_memory=True)``) say.

Each event is one allocation (``Bytes`` > 0) or free (< 0) on a device (``Device Type``
0 CPU, 1 CUDA; ``Device Id``) and carries the allocator's running ``Total Allocated`` and
``Total Reserved``. From them:

* :func:`memory_timeline` — allocated and reserved bytes over the profiled time, per rank
  and device, the peak of each time bucket kept (a spike survives downsampling);
* :func:`top_allocating_ops` — bytes allocated per op, each allocation charged to the
  innermost CPU op around it on the same thread (the op whose span starts last).
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import has_trace_events

_EVENTS = """
    SELECT rank, trace_id, pid, tid, step, ts_us,
        TRY_CAST(json_extract_string(args, '$."Bytes"') AS BIGINT) AS bytes,
        TRY_CAST(json_extract_string(args, '$."Total Allocated"') AS BIGINT) AS allocated,
        TRY_CAST(json_extract_string(args, '$."Total Reserved"') AS BIGINT) AS reserved,
        TRY_CAST(json_extract_string(args, '$."Device Type"') AS INTEGER) AS dev_type,
        TRY_CAST(json_extract_string(args, '$."Device Id"') AS INTEGER) AS dev_id
    FROM trace_events WHERE name = '[memory]' AND args IS NOT NULL
"""


def device_name(dev_type: int | None, dev_id: int | None) -> str:
    """``cpu``, ``cuda:0`` or ``device<type>:<id>`` (torch's DeviceType numbering)."""
    if dev_type == 0:
        return "cpu"
    kind = {1: "cuda", 6: "hip", 8: "xpu", 13: "mps"}.get(dev_type or -1, f"device{dev_type}")
    return f"{kind}:{dev_id if dev_id is not None and dev_id >= 0 else 0}"


def has_memory_events(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the traces hold allocator events."""
    if not has_trace_events(con):
        return False
    return bool(con.execute("SELECT count(*) FROM (SELECT 1 FROM trace_events "
                            "WHERE name = '[memory]' LIMIT 1)").fetchone()[0])


def memory_timeline(con: duckdb.DuckDBPyConnection, buckets: int = 400
                    ) -> list[dict[str, Any]]:
    """Per rank and device: ``{"rank", "device", "peak_allocated", "peak_reserved",
    "points": [(t_ms, allocated, reserved), ...]}``, time from the rank's first memory
    event, at most ``buckets`` points (each the peak of its bucket)."""
    if not has_memory_events(con):
        return []
    rows = con.execute(f"""
        WITH m AS ({_EVENTS}),
        z AS (SELECT rank, dev_type, dev_id, min(ts_us) AS t0, max(ts_us) AS t1
              FROM m GROUP BY ALL)
        SELECT m.rank, m.dev_type, m.dev_id,
            least(floor((m.ts_us - z.t0) / greatest(z.t1 - z.t0, 1e-9) * ?), ? - 1) AS b,
            min(m.ts_us - z.t0) / 1e3 AS t_ms, max(m.allocated), max(m.reserved)
        FROM m JOIN z ON z.rank = m.rank AND z.dev_type IS NOT DISTINCT FROM m.dev_type
                     AND z.dev_id IS NOT DISTINCT FROM m.dev_id
        GROUP BY ALL ORDER BY m.rank, m.dev_type, m.dev_id, b
    """, [buckets, buckets]).fetchall()
    out: dict[tuple, dict[str, Any]] = {}
    for rank, dtype, did, _b, t_ms, alloc, reserved in rows:
        key = (int(rank), device_name(dtype, did))
        s = out.setdefault(key, {"rank": key[0], "device": key[1], "peak_allocated": 0,
                                 "peak_reserved": 0, "points": []})
        s["points"].append((round(float(t_ms), 3), alloc, reserved))
        s["peak_allocated"] = max(s["peak_allocated"], alloc or 0)
        s["peak_reserved"] = max(s["peak_reserved"], reserved or 0)
    return list(out.values())


def top_allocating_ops(con: duckdb.DuckDBPyConnection, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` ops that allocate the most bytes over all ranks: ``{"op", "device",
    "allocations", "bytes", "largest"}``; allocations outside any op are ``(no op)``."""
    if not has_memory_events(con):
        return []
    rows = con.execute(f"""
        WITH m AS (SELECT row_number() OVER () AS id, * FROM ({_EVENTS}) WHERE bytes > 0),
        ops AS (
            SELECT rank, trace_id, pid, tid, name, ts_us AS s, ts_us + dur_us AS e
            FROM trace_events WHERE cat = 'cpu_op' AND dur_us > 0
        ),
        owner AS (
            SELECT m.id, arg_max(o.name, o.s) AS op
            FROM m JOIN ops o ON o.rank = m.rank AND o.trace_id = m.trace_id
                AND o.pid = m.pid AND o.tid = m.tid AND o.s <= m.ts_us AND m.ts_us <= o.e
            GROUP BY m.id
        )
        SELECT coalesce(w.op, '(no op)') AS op, m.dev_type, m.dev_id, count(*),
            sum(m.bytes), max(m.bytes)
        FROM m LEFT JOIN owner w ON w.id = m.id
        GROUP BY ALL ORDER BY sum(m.bytes) DESC LIMIT ?
    """, [n]).fetchall()
    return [{"op": op, "device": device_name(t, d), "allocations": int(k), "bytes": int(b),
             "largest": int(mx)} for op, t, d, k, b, mx in rows]
