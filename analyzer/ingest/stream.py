"""Streaming ingest of a Chrome/Kineto trace into a ``trace_events`` Parquet file, in bounded
memory whatever the trace's size (issues 16, 31).

Two passes, neither of which holds the trace:

1. the (gzip-)decompressed bytes (:mod:`.inflate`, on a background thread) come through a
   guarded reader that counts them (decompression-bomb guard), hashes them (the trace_id)
   and keeps the first and last MiB, where the trace's own metadata (``distributedInfo``,
   ``trace_id``) sits on either side of ``traceEvents``. The events array is cut into ~4 MB
   chunks between two elements (:mod:`.chunks`) and each chunk becomes one Arrow record
   batch: by column (:mod:`.columnar`, msgspec's typed decoding), or one event at a time
   (:func:`_convert`, the reference) for a chunk the columnar path declines. A trace that
   cannot be cut is read again with ijson, one event at a time, in batches of
   :data:`BATCH`. The batches are held in memory up to :data:`IN_MEMORY` bytes, else they
   go to a scratch Parquet file;
2. held in memory, numpy gives every row its step and the rows their time order
   (:func:`.steps.write_in_memory`); from the scratch file, DuckDB does it under a memory
   limit, spilling to the temp directory (:func:`.steps.assign_steps`): ``ProfilerStep#N``
   containment for host rows, the launching runtime call's step for device rows (joined on
   ``correlation``). Both give the same rows (tested).

Why ijson (a dependency since issue 16): a C incremental JSON parser that yields one Python
object per array element, for the traces whose array cannot be cut safely; the standard
library and orjson only parse whole documents, which is what made a 531 MB trace take
4.95 GB of RAM.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import TraceError
from . import columnar
from .arrow_build import floats, ints, strings
from .chunks import Fallback, chunked_events, json_value
from .fields import (
    CAT_ALIASES,
    GPU_SIDE_CATS,
    NO_STREAM,
    args_json,
    name_text,
    to_int,
    trace_id,
)
from .ranks import rank_of_trace
from .reader import MAX_DEPTH, READ_SIZE, GuardedReader, Limits, depth_scan, too_deep
from .steps import assign_steps, write_in_memory

BATCH = 16_384
"""Events per Arrow record batch of the first pass: ~25 MB of parsed Python dicts at most."""
_EVENTS_LIST = re.compile(rb'"traceEvents"\s*:\s*\[')
IN_MEMORY = 192 << 20
"""A trace whose first-pass rows take at most this many bytes of Arrow buffers is kept in
memory and finished in numpy (~0.75 byte per byte of JSON: up to ~250 MB of JSON); a
bigger one goes through a scratch Parquet file and DuckDB. Either way peak RSS stays
under ~470 MB: the held rows plus one sorted row group plus the libraries (390-430 MB at
the budget), or the budget while it is written out, then DuckDB's (:data:`.steps.
DUCKDB_MEMORY`). Below 1x the JSON from ~470 MB of JSON up."""
def edge_meta(head: bytes, tail: bytes, path: Path | None = None) -> dict[str, Any]:
    """``distributedInfo`` and ``trace_id`` from the first and last MiB of the trace: the
    top-level keys before ``traceEvents`` are parsed from the head; keys written after it
    are looked up in the tail. Bytes nested past MAX_DEPTH are refused before any parser
    sees them (TraceError): the fast path never parsed the head."""
    meta: dict[str, Any] = {}
    cut = head.find(b'"traceEvents"')
    if cut >= 0:  # (not the events themselves: only what comes before them)
        head = head[:cut]
    for part in (head, tail):
        if depth_scan(part)[0] > MAX_DEPTH:
            raise too_deep(path or Path("?"), MAX_DEPTH)
    try:  # '{"schemaVersion": 1, "distributedInfo": {...}, ' closed into a whole object
        whole = json.loads(bytes(head).rstrip().rstrip(b",") + b"}")
        meta.update(whole if isinstance(whole, dict) else {})
    except ValueError:  # no traceEvents in the head, or a key after it: read what parses
        import ijson

        try:
            for key, value in ijson.kvitems(io.BytesIO(bytes(head)), "", use_float=True):
                if key == "traceEvents":
                    break
                meta[key] = value
        except ijson.JSONError:  # the head ends inside a value: that's all
            pass
    for key in ("distributedInfo", "trace_id"):
        if key in meta:
            continue
        at = tail.rfind(f'"{key}"'.encode())
        if at < 0:
            continue
        import ijson

        try:
            for k, v in ijson.kvitems(io.BytesIO(b"{" + tail[at:]), "", use_float=True):
                if k == key:
                    meta[key] = v
                break
        except ijson.JSONError:
            pass
    return meta


FIRST_PASS = pa.schema([
    ("i", pa.int64()), ("cat", pa.string()), ("name", pa.string()), ("ts_us", pa.float64()),
    ("dur_us", pa.float64()), ("pid", pa.int64()), ("tid", pa.int64()),
    ("stream", pa.int64()), ("correlation", pa.int64()), ("external_id", pa.int64()),
    ("device", pa.int64()), ("args", pa.string()),
])



def _convert(events: list[dict[str, Any]], start: int) -> pa.RecordBatch:
    """Complete ('X') events as a first-pass record batch (``i``: position in the file)."""
    aliases, gpu_side = CAT_ALIASES, GPU_SIDE_CATS
    no_stream = NO_STREAM
    idx: list[int] = []
    cats: list[str | None] = []
    names: list[str] = []
    ts: list[float] = []
    dur: list[float] = []
    pids: list[int | None] = []
    tids: list[int | None] = []
    streams: list[int | None] = []
    corrs: list[int | None] = []
    exts: list[int | None] = []
    devs: list[int | None] = []
    argss: list[str | None] = []
    for k, e in enumerate(events):
        cat = e.get("cat")
        if cat == "Trace":  # the profiler's own whole-trace span
            continue
        try:
            t = float(e["ts"])
            d = float(e.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError, ArithmeticError):
            continue  # no usable timestamp: the event cannot be placed
        if type(cat) is str:
            cat = aliases.get(cat, cat)
        elif cat is not None:
            cat = str(cat)
        args = e.get("args")
        stream = corr = ext = dev = None
        a_json = None
        if type(args) is dict:
            corr, ext, dev = args.get("correlation"), args.get("External id"), args.get("device")
            # a runtime call's 'stream' is an API argument, not the device stream
            stream = args.get("stream") if cat in gpu_side else None
            a_json = args_json(args)
        idx.append(start + k)
        cats.append(cat)
        names.append(name_text(e.get("name")))
        ts.append(t)
        dur.append(d)
        pid, tid = e.get("pid"), e.get("tid")
        pids.append(pid if type(pid) is int else to_int(pid))
        tids.append(tid if type(tid) is int else to_int(tid))
        if stream is not None:
            stream = stream if type(stream) is int else to_int(stream)
            streams.append(None if stream in no_stream else stream)
        else:
            streams.append(None)
        corrs.append(corr if type(corr) is int or corr is None else to_int(corr))
        exts.append(ext if type(ext) is int or ext is None else to_int(ext))
        devs.append(dev if type(dev) is int or dev is None else to_int(dev))
        argss.append(a_json)
    arrays = [ints(idx), strings(cats), strings(names), floats(ts), floats(dur), ints(pids),
              ints(tids), ints(streams), ints(corrs), ints(exts), ints(devs), strings(argss)]
    return pa.RecordBatch.from_arrays(arrays, schema=FIRST_PASS)


@dataclass
class Ingested:
    """What one streamed trace gave."""

    trace_id: str
    rank: int
    events: int
    meta: dict[str, Any]
    digest: str = ""
    """12 hex digits of the SHA-1 of the decompressed trace (names the raw copy)."""


def stream_events(path: Path, out: Path, *, rank: int | None = None,
                  limits: Limits | None = None) -> tuple[Ingested, pa.Table | None]:
    """First pass: ``path``'s complete events, in batches. A trace of more than IN_MEMORY
    bytes of rows goes into the Parquet file ``out`` (FIRST_PASS columns) and None is
    returned with its info; a smaller one stays in memory and is returned as one table over
    its batches (the second pass is then done in numpy: a small trace does not pay DuckDB's
    start-up). The fast path (:mod:`.chunks`, msgspec on chunks) is tried first; a trace it
    cannot cut is read again with ijson. ``rank``: as for :func:`rank_of_trace`."""
    for fast in (True, False):
        reader = GuardedReader(path, limits or Limits())
        try:
            n, last, array_form = _first_pass(reader, out, fast)
        except Fallback:
            continue
        finally:
            reader.close()
        break
    meta = edge_meta(bytes(reader.head), reader.tail, path)
    if not array_form and n == 0 and not any(
            _EVENTS_LIST.search(edge) for edge in (reader.head, reader.tail)):
        raise TraceError(f"trace {path} has no 'traceEvents' list; not a Chrome/Kineto trace")
    return _ingested(reader, path, meta, rank, n), last


def _ingested(reader: GuardedReader, path: Path, meta: dict[str, Any], rank: int | None,
              events: int) -> Ingested:
    """The trace's id, rank and digest, once its reader has read it all."""
    digest = reader.sha.hexdigest()[:12]
    return Ingested(trace_id=trace_id(path, meta, digest), rank=rank_of_trace(path, meta, rank),
                    events=events, meta=meta, digest=digest)


def _lists(reader: GuardedReader, fast: bool) -> tuple[Iterator[list[Any]], bool]:
    """The trace's events as lists (chunks), and whether it is the bare array form."""
    first = b""
    while not first.strip():
        chunk = reader.read(READ_SIZE)
        if not chunk:
            raise TraceError(f"trace {reader.path} is empty")
        first += chunk
    lead = first.lstrip()[:1]
    if lead not in (b"[", b"{"):
        raise TraceError(f"trace {reader.path} is not valid JSON (truncated or not a "
                         "Chrome/Kineto trace)")
    if fast:
        return chunked_events(reader, first, _parse), lead == b"["
    import ijson  # (2 ms of start-up: only the traces that cannot be cut need it)

    reader.max_depth = MAX_DEPTH
    reader._check_depth(first)  # already read, before the guard was set
    reader.pushed = first
    prefix = "item" if lead == b"[" else "traceEvents.item"
    items = ijson.items(reader, prefix, use_float=True, buf_size=READ_SIZE)
    return _batched(items), lead == b"["


def _parse(data: bytes) -> list[Any]:
    """A chunk as typed events (:mod:`.columnar`), or as plain JSON values where they are
    not all objects. ValueError: not JSON."""
    try:
        return columnar.decode(data)
    except columnar.msgspec.ValidationError:
        return json_value(data)
    except RecursionError as e:  # (nested past ~1,000 levels: in the end, the ijson
        raise ValueError("nested too deeply") from e  # path and its depth guard judge it)


def _json_error(e: BaseException) -> bool:
    """Is ``e`` ijson's verdict on broken JSON? (ijson is imported only where it is used.)"""
    ijson = sys.modules.get("ijson")
    return ijson is not None and isinstance(e, ijson.JSONError)


def _batched(items: Iterator[Any]) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for e in items:
        batch.append(e)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    yield batch


def _to_batch(events: list[Any], pos: int) -> tuple[pa.RecordBatch, int]:
    """One list of events as a first-pass batch, and how many positions it used: by
    column (typed events), else one event at a time (:func:`_convert`, the reference)."""
    if type(events) is columnar.Events:
        try:
            got = columnar.convert(events, pos, FIRST_PASS)
        except RecursionError:  # args nested near the limit
            got = None
        if got is not None:
            return got
        try:
            events = [columnar.as_dict(e) for e in events]
        except (ValueError, RecursionError) as e:  # not UTF-8, or too deep: the
            raise Fallback(str(e)) from e  # incremental parser gives the verdict
    # complete events, and the allocator's instant events (profile_memory=True)
    kept = [e for e in events if type(e) is dict and (
        e.get("ph") == "X" or (e.get("ph") == "i" and e.get("name") == "[memory]"))]
    return _convert(kept, pos), len(kept)


def _first_pass(reader: GuardedReader, out: Path, fast: bool
                ) -> tuple[int, pa.Table | None, bool]:
    n = pos = held_bytes = 0
    writer: pq.ParquetWriter | None = None
    held: list[pa.RecordBatch] = []  # converted batches, until the trace outgrows IN_MEMORY
    # The parsed events make no reference cycles, but a batch of them is ~10^5 container
    # objects, which sets off the cyclic collector over and over: 40% of the parse time.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        lists, array_form = _lists(reader, fast)
        try:
            for events in lists:
                rb, used = _to_batch(events, pos)
                del events
                n += rb.num_rows
                pos += used
                if writer is not None:
                    writer.write_batch(rb)
                    continue
                held.append(rb)
                held_bytes += rb.nbytes
                if held_bytes > IN_MEMORY:
                    writer = pq.ParquetWriter(out, FIRST_PASS, compression="zstd")
                    for h in held:
                        writer.write_batch(h)
                    held = []
        except Exception as e:
            if not _json_error(e):
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TraceError(f"trace {reader.path} is not valid JSON (truncated or not a "
                             f"Chrome/Kineto trace): {first}") from e
        # (a table over the batches: concatenating them would copy every row once more)
        last = None if writer is not None else pa.Table.from_batches(
            [*held, _convert([], pos)])
        while reader.read(READ_SIZE):  # the rest of the file: the hash covers all of it
            pass
    finally:
        if was_enabled:
            gc.enable()
        if writer is not None:
            writer.close()
    return n, last, array_form


@contextmanager
def system_allocator() -> Iterator[None]:
    """Arrow allocates from the C library's malloc meanwhile, unless the user chose a pool
    (``ARROW_DEFAULT_MEMORY_POOL``). pyarrow's default, mimalloc, hands freed pages back
    and faults them in again, at its own times: the same 15 MB import took 0.19 or 0.25 s
    run to run (its last sort 4 or 25 ms), against a steady 0.20 s; peak RSS 230 against
    196 MB at 36.6 MB of JSON, 452 against ~410 MB at 174 MB, 444 against 412 MB at 523 MB,
    in the same time. Buffers keep the pool they came from: restoring it is safe."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        yield
        return
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def ingest(path: Path, out: Path, *, rank: int | None = None, limits: Limits | None = None,
           tmp_dir: Path | None = None) -> Ingested:
    """Stream ``path`` into the Parquet file ``out`` (FORMAT.md ``trace_events`` columns
    without ``rank``, time-ordered). Raises TraceError with one clear message."""
    path = Path(path)
    with system_allocator(), \
            tempfile.TemporaryDirectory(prefix="tracealyze-ingest-", dir=tmp_dir) as td:
        first = Path(td) / "events.parquet"
        info, small = stream_events(path, first, rank=rank, limits=limits)
        if small is not None:
            write_in_memory(small, info.trace_id, out)
        else:
            # the first pass's buffers are free now: hand them back before DuckDB takes
            # its own (Arrow's allocator keeps freed memory for reuse otherwise)
            pa.default_memory_pool().release_unused()
            assign_steps(first, out, info.trace_id, Path(td))
    return info
