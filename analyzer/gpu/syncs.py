"""Host waits on the device, found in GPU traces: what ``host_sync`` reports and what
``gpu_idle`` weighs when it says why the GPU was idle.

A sync is the host **waiting** for the device, not the host reading a number (issue 44: on a
healthy AdamW run every parameter's CPU ``step`` tensor is read with ``.item()``, 108 times a
step, and waits for nothing). So a site is:

* a runtime call ``cuda/hip{Device,Stream,Event}Synchronize``;
* a synchronous ``cudaMemcpy`` / ``hipMemcpy[WithStream]`` whose copy (same ``correlation``)
  is device-to-host;
* any runtime call linked to a ``cuda_sync`` event (except ``Stream Wait Event``, which
  makes a stream wait, not the host);
* an ``aten::_local_scalar_dense`` (what ``tensor.item()``, ``float(t)``, ``if t:`` and
  printing a tensor run), or an ``aten::item`` without one inside, **only when it holds a
  wait**: one of the calls above, or a ``cudaMemcpyAsync`` whose copy is device-to-host (the
  ``.item()`` of a CUDA tensor copies to pinned memory, then synchronizes the stream). The
  same op on a CPU tensor holds no runtime call at all.

A runtime call inside one of these ops is part of it and is not counted again. With
ProfilerStep spans only syncs inside steps count (the profiler's own synchronisation when it
stops is outside them). Blocked time is the duration of the sync op or call on the host.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .vocabulary import GPU_OR_LAUNCH_SQL, GPU_SIDE_SQL, LAUNCH_SQL, MEMCPY_SQL, SYNC_SQL

SITE_COLUMNS = ("rank", "trace_id", "step", "cat", "name", "ts_us", "dur_us", "pid", "tid",
                "n_steps")
ITEM_OPS = ("aten::_local_scalar_dense", "aten::item")

_SITES_SQL = f"""
WITH te AS (SELECT * FROM trace_events),
gpu_traces AS (
    SELECT rank, trace_id,
        count(DISTINCT name) FILTER (WHERE name LIKE 'ProfilerStep#%'
                                     AND cat NOT IN {GPU_SIDE_SQL})
            AS n_steps
    FROM te GROUP BY ALL
    HAVING bool_or(cat IN {GPU_OR_LAUNCH_SQL})
),
d2h AS (
    SELECT DISTINCT rank, trace_id, correlation FROM te
    WHERE cat = {MEMCPY_SQL} AND name LIKE 'Memcpy DtoH%' AND correlation IS NOT NULL
),
synced AS (
    SELECT DISTINCT rank, trace_id, correlation FROM te
    WHERE cat = {SYNC_SQL} AND name <> 'Stream Wait Event' AND correlation IS NOT NULL
),
calls AS (
    -- runtime calls that make the host wait (blocking), and the device-to-host copies an
    -- item op makes before it synchronizes (waiting, inside that op)
    SELECT te.*,
        regexp_matches(te.name, '^(cuda|hip)(Device|Stream|Event)Synchronize')
            OR (te.name IN ('cudaMemcpy', 'hipMemcpy', 'hipMemcpyWithStream')
                AND d2h.correlation IS NOT NULL)
            OR sy.correlation IS NOT NULL AS blocking,
        d2h.correlation IS NOT NULL AS to_host
    FROM te
    JOIN gpu_traces g ON g.rank = te.rank AND g.trace_id = te.trace_id
    LEFT JOIN d2h ON d2h.rank = te.rank AND d2h.trace_id = te.trace_id
                 AND d2h.correlation = te.correlation
    LEFT JOIN synced sy ON sy.rank = te.rank AND sy.trace_id = te.trace_id
                       AND sy.correlation = te.correlation
    WHERE te.cat IN {LAUNCH_SQL}
),
waits AS (SELECT * FROM calls WHERE blocking OR to_host),
items AS (
    SELECT te.* FROM te
    JOIN gpu_traces g ON g.rank = te.rank AND g.trace_id = te.trace_id
    WHERE te.cat = 'cpu_op' AND te.name IN {ITEM_OPS!r}
),
waiting_items AS (
    SELECT DISTINCT i.rank, i.trace_id, i.pid, i.tid, i.ts_us, i.dur_us, i.name
    FROM items i JOIN waits w
      ON w.rank = i.rank AND w.trace_id = i.trace_id AND w.pid = i.pid AND w.tid = i.tid
     AND w.ts_us >= i.ts_us AND w.ts_us <= i.ts_us + i.dur_us
)
SELECT rank, trace_id, step, cat, name, ts_us, dur_us, pid, tid, n_steps FROM (
    SELECT i.rank, i.trace_id, i.step, i.cat, i.name, i.ts_us, i.dur_us, i.pid, i.tid
    FROM items i SEMI JOIN waiting_items w
      ON w.rank = i.rank AND w.trace_id = i.trace_id AND w.pid = i.pid AND w.tid = i.tid
     AND w.ts_us = i.ts_us AND w.dur_us = i.dur_us AND w.name = i.name
    UNION ALL
    SELECT rank, trace_id, step, cat, name, ts_us, dur_us, pid, tid FROM calls WHERE blocking
) s JOIN gpu_traces g USING (rank, trace_id)
ORDER BY rank, trace_id, pid, tid, ts_us, dur_us DESC
"""


def _within(inner: tuple, outer: tuple) -> bool:
    return (
        inner[:2] == outer[:2] and inner[7:9] == outer[7:9]
        and outer[5] <= inner[5] and inner[5] + inner[6] <= outer[5] + outer[6]
    )


def _outermost(rows: list[tuple]) -> list[tuple]:
    """Outermost sync rows only: a call inside _local_scalar_dense is part of it, and an
    aten::item counts only when it has no _local_scalar_dense inside (older traces)."""
    by_thread: dict[tuple, list[tuple]] = defaultdict(list)
    for r in rows:
        by_thread[(r[0], r[1], r[7], r[8])].append(r)
    out = []
    for rs in by_thread.values():
        dense = [r for r in rs if r[4] == "aten::_local_scalar_dense"]
        items = [r for r in rs if r[4] == "aten::item"]
        for r in rs:
            if r[4] == "aten::item":
                if not any(_within(d, r) for d in dense):
                    out.append(r)
            elif r[4] == "aten::_local_scalar_dense" or not any(
                _within(r, o) for o in dense + items
            ):
                out.append(r)
    return out


def sync_sites(con: Any) -> list[tuple]:
    """Every host wait on the device inside profiled steps (or anywhere, in a trace without
    ProfilerStep spans), one row per site: :data:`SITE_COLUMNS`."""
    rows = con.execute(_SITES_SQL).fetchall()
    rows = [r for r in rows if not r[9] or r[2] is not None]
    return _outermost(rows)
