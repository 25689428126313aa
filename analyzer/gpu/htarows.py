"""The events Holistic Trace Analysis 0.5 analyses, selected as HTA selects them.

HTA's numbers are the reference for the GPU time breakdown, the idle-time breakdown, the
comm/comp overlap and the launch statistics (DESIGN.md). They depend less on each analysis's
formula than on which rows HTA holds when it runs it, so this module rebuilds HTA's frame of
each trace (``hta/common/trace_parser.py``, ``hta/common/trace.py``,
``hta/common/trace_filter.py``) as one SQL prefix, ``WITH ... hta AS (...)``, that every
analysis reads. Its rows, per ``rank`` and ``trace_id``:

* every event with a duration (HTA drops rows without ``dur`` or ``cat``, and the
  profiler's own ``Trace`` span; our allocator instants have a zero duration and no place
  there either);
* ``hstream``: HTA's ``stream`` — the event's ``args.stream`` as an integer, -1 when it has
  none. Device-side events keep theirs; Kineto's device-wide ``Context Sync`` has stream
  0xFFFFFFFF, which is not -1, so HTA counts it on the device (stored as null here: see
  FORMAT.md); host events are -1 (a ROCm runtime call's ``"0x0"`` is not an integer to
  Python's ``int()``, so -1 to HTA too).
* ``is_gpu``: HTA's ``GPUKernelFilter``: a stream >= 0 and a correlation >= 0, or the name
  ``Event Sync`` / ``Context Sync``. Everything else is "CPU".

With ``include_last_profiler_step=True`` (DESIGN.md's reference) and two or more distinct
``ProfilerStep`` names in the job (HTA's symbol table is shared by all ranks), HTA keeps
(``Trace._filter_irrelevant_gpu_kernels``):

* the CPU events whose start, *as a time since the job's first event*, is at most the end
  of the rank's last ProfilerStep *as an absolute timestamp* (HTA aligns ``ts`` to the job's
  start before filtering but not ``end``). With real timestamps (epoch or boot-time
  microseconds) that holds for every event: nothing after the last step is cut, whatever
  HTA's documentation says. We keep HTA's number (docs/TRACES.md);
* the GPU events joined to a kept CPU event on ``correlation`` — one row per matching CPU
  event, as HTA's inner merge gives; activity launched before profiling started (its
  runtime call is not in the trace) is dropped.

A rank with no ProfilerStep of its own in such a job has nothing left in HTA, whose
analyses then fail; here it keeps all of its events.
"""

from __future__ import annotations

from .vocabulary import GPU_SIDE_SQL, SYNC_SQL

NO_STREAM = 0xFFFFFFFF
"""Kineto's 'no stream' of a device-wide sync, as HTA reads it."""

ROWS_SQL = f"""
WITH te AS (
    SELECT rank, trace_id, step, cat, name, ts_us, dur_us,
        coalesce(correlation, -1) AS corr,
        CASE WHEN cat IN {GPU_SIDE_SQL}
             THEN coalesce(stream, CASE WHEN cat = {SYNC_SQL} THEN {NO_STREAM} ELSE -1 END)
             ELSE -1 END AS hstream
    FROM trace_events
    WHERE dur_us IS NOT NULL AND cat IS NOT NULL AND NOT (name = '[memory]' AND dur_us = 0)
),
flagged AS (
    SELECT *, (hstream >= 0 AND corr >= 0) OR name IN ('Event Sync', 'Context Sync') AS is_gpu
    FROM te
),
job AS (
    SELECT count(DISTINCT name) FILTER (WHERE name LIKE '%ProfilerStep%') AS n_step_names,
        min(ts_us) AS t_min
    FROM te
),
last_step AS (
    SELECT rank, trace_id, max(ts_us + dur_us) AS last_end FROM flagged
    WHERE NOT is_gpu AND name LIKE '%ProfilerStep%' GROUP BY ALL
),
trace_cut AS (  -- per trace: HTA filters it, and its last step's end
    SELECT t.rank, t.trace_id, j.n_step_names >= 2 AND l.last_end IS NOT NULL AS cut,
        l.last_end, j.t_min
    FROM (SELECT DISTINCT rank, trace_id FROM te) t CROSS JOIN job j
    LEFT JOIN last_step l ON l.rank = t.rank AND l.trace_id = t.trace_id
),
host AS (
    SELECT f.* FROM flagged f JOIN trace_cut c ON c.rank = f.rank AND c.trace_id = f.trace_id
    WHERE NOT f.is_gpu AND (NOT c.cut OR f.ts_us - c.t_min <= c.last_end)
),
host_corr AS (  -- kept CPU events per correlation: how many, and the latest start
    SELECT rank, trace_id, corr, count(*) AS n, max(ts_us) AS launch_ts FROM host
    GROUP BY ALL
),
gpu_matched AS (
    SELECT f.*, h.launch_ts,
        -- one row per matching CPU event (HTA's inner merge); a sync event without a
        -- correlation matches every CPU event without one, and is kept once
        CASE WHEN c.cut AND f.corr >= 0 THEN h.n ELSE 1 END AS copies
    FROM flagged f
    JOIN trace_cut c ON c.rank = f.rank AND c.trace_id = f.trace_id
    LEFT JOIN host_corr h ON h.rank = f.rank AND h.trace_id = f.trace_id AND h.corr = f.corr
    WHERE f.is_gpu AND (NOT c.cut OR h.n IS NOT NULL)
),
gpu AS (
    SELECT * EXCLUDE (copies, _copy)
    FROM (SELECT *, unnest(range(copies)) AS _copy FROM gpu_matched)
),
hta AS (
    SELECT rank, trace_id, step, cat, name, ts_us, dur_us, corr, hstream, is_gpu,
        launch_ts FROM gpu
    UNION ALL
    SELECT rank, trace_id, step, cat, name, ts_us, dur_us, corr, hstream, is_gpu,
        NULL AS launch_ts FROM host
)
"""
"""``WITH ...`` up to ``hta``: HTA's rows of every trace (``launch_ts``: for a GPU event, the
start of the latest kept CPU event with its correlation — HTA's ``ts_runtime`` — else
null)."""
