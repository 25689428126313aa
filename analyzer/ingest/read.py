"""Ingestion of Chrome/Kineto (torch.profiler) traces into the ``trace_events`` table.

``read_trace`` turns one trace file into a pyarrow table with the FORMAT.md ``trace_events``
columns plus ``rank``; ``import_traces`` (:mod:`.importer`) writes traces into a run
directory (the ``tracealyze import-trace`` command). Both stream the trace
(:mod:`.stream`): memory stays bounded whatever its size. Nothing here imports torch.

What is kept: complete events (``ph == "X"``) only. Metadata (``M``), flow arrows
(``s``/``f``/``t``; the correlation they draw is already in ``args.correlation``), instants
(``i``/``I``), counters (``C``) and the profiler's own ``Trace`` span are skipped. Timestamps
are microseconds in every Kineto trace, whatever ``displayTimeUnit`` says (it only tells the
viewer how to label the axis); ns-resolution traces just carry fractional microseconds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .fields import (
    ARGS_MAX_BYTES,
    GPU_ACTIVITY_CATS,
    GPU_SIDE_CATS,
    LAUNCH_CATS,
    TRACE_EVENTS_SCHEMA,
    trace_id,
)
from .reader import READ_SIZE, GuardedReader, Limits
from .stream import edge_meta, ingest

__all__ = ["ARGS_MAX_BYTES", "GPU_ACTIVITY_CATS", "GPU_SIDE_CATS", "LAUNCH_CATS",
           "TRACE_EVENTS_SCHEMA", "read_trace", "trace_id_for"]


def read_trace(path: Path, *, rank: int | None = None, limits: Limits | None = None
               ) -> pa.Table:
    """Parse one Chrome/Kineto trace (.json or .json.gz) into ``trace_events`` rows.

    Columns are :data:`TRACE_EVENTS_SCHEMA`, rows in time order. ``step`` is N of the
    enclosing ``ProfilerStep#N`` span for host events, and the step of the launching runtime
    event (joined on ``correlation``) for device events; null outside steps or without
    steps. ``rank`` is the argument, else ``distributedInfo.rank`` of the trace, else 0.
    Raises :class:`TraceError` with one clear message for unreadable, truncated or
    non-trace files, and for decompression bombs (``limits``).
    """
    with tempfile.TemporaryDirectory(prefix="tracealyze-read-") as td:
        out = Path(td) / "trace.parquet"
        info = ingest(Path(path), out, rank=rank, limits=limits, tmp_dir=Path(td))
        table = pq.read_table(out).cast(TRACE_EVENTS_SCHEMA.remove(
            TRACE_EVENTS_SCHEMA.get_field_index("rank")))
    return table.append_column("rank", pa.array(np.full(table.num_rows, info.rank,
                                                         dtype=np.int32)))


def trace_id_for(path: Path, limits: Limits | None = None) -> str:
    """The trace_id ``read_trace`` gives ``path``, without building the table: one streaming
    pass that hashes the decompressed bytes. Used by the catalog to skip raw traces whose
    events are already in ``trace_events`` parts."""
    path = Path(path)
    reader = GuardedReader(path, limits or Limits())
    try:
        while reader.read(READ_SIZE):
            pass
    finally:
        reader.close()
    return trace_id(path, edge_meta(bytes(reader.head), reader.tail),
                    reader.sha.hexdigest()[:12])
