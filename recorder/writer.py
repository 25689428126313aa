"""Background writer: buffers rows per table and writes crash-safe Parquet parts.

The training thread only ever calls :meth:`Writer.submit`, which never blocks: when the
bounded queue is full the item is dropped and counted (the counts are written as
``dropped_data`` events). Everything else — waiting for device copies, building Arrow
tables, compression, file I/O, fsync — happens on the writer thread.

Each flush writes ``<table>/rank=<r>/part-<seq>.parquet`` under a temporary name, fsyncs it
and renames it into place, so a killed process leaves only complete files. A failed write
(disk full, directory deleted or read-only) keeps the rows buffered and retries at the next
flush; the failure is counted and reported once, and training never sees it.
"""

from __future__ import annotations

import collections
import json
import os
import re
import select
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .schema import TABLES

PART_RE = re.compile(r"^part-(\d+)(?:-(\d+))?\.parquet$")

# A flush this close to due is done now rather than after one more (tiny) sleep.
_FLUSH_SLACK_S = 0.01

# Columns whose float values compress far better split into byte streams before zstd.
_FLOAT_TYPES = (pa.float32(), pa.float64())


class Codes:
    """A text column given as indices into a tuple of distinct values.

    Parameter and module names repeat every step: a step's rows name the same tuple (the
    very same object each step), so a batch of steps is one ``int32`` index array, and the
    column becomes an Arrow dictionary without one Python string per row.
    """

    __slots__ = ("codes", "values")

    def __init__(self, values: tuple[str, ...], codes: np.ndarray) -> None:
        self.values = values
        self.codes = codes

    def __len__(self) -> int:
        return len(self.codes)


class TableBuffer:
    """Rows of one table, held as raw column pieces until the next flush.

    Appending is cheap (a list append per column); the conversion to Arrow — the
    expensive part — happens once per flush, for all buffered rows at once.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.schema = TABLES[name]
        self.cols: dict[str, list[Any]] = {f.name: [] for f in self.schema}
        self.counts: list[int] = []
        self.rows = 0
        self.failed: list[pa.Table] = []  # converted rows whose write failed, oldest first

    def append(self, columns: dict[str, Any], n: int) -> None:
        if not n:
            return
        for name, pieces in self.cols.items():
            pieces.append(columns.get(name))
        self.counts.append(n)
        self.rows += n

    def take(self, rank: int) -> pa.Table | None:
        tables = self.failed
        self.failed = []
        if self.counts:
            n = self.rows - sum(t.num_rows for t in tables)
            arrays = []
            for f in self.schema:
                if f.name == "rank":
                    arrays.append(pa.array(np.full(n, rank, dtype=np.int32)))
                else:
                    arrays.append(_column(self.cols[f.name], self.counts, f.type))
            tables = [*tables, pa.Table.from_arrays(arrays, schema=self.schema)]
            self.cols = {f.name: [] for f in self.schema}
            self.counts = []
        self.rows = 0
        if not tables:
            return None
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables).unify_dictionaries()

    def put_back(self, table: pa.Table) -> None:
        """Re-queue rows whose write failed, ahead of anything buffered since."""
        self.failed.append(table)
        self.rows += table.num_rows

    def drop_oldest(self, keep_rows: int) -> int:
        """Drop the oldest failed batches until at most keep_rows remain; rows dropped."""
        dropped = 0
        while self.failed and self.rows > keep_rows:
            t = self.failed.pop(0)
            self.rows -= t.num_rows
            dropped += t.num_rows
        return dropped


def _column(pieces: list[Any], counts: list[int], typ: pa.DataType) -> pa.Array:
    """One Arrow array from per-append pieces: numpy arrays, lists (None = null), or None
    (column not given: all null). A NaN value stays NaN — a NaN loss is data, not a gap."""
    if all(p is None for p in pieces):
        return pa.nulls(sum(counts), type=typ)
    if pa.types.is_dictionary(typ):
        return _dictionary_column(pieces, counts, typ)
    if pa.types.is_string(typ):
        vals = np.concatenate([np.full(n, None, dtype=object) if p is None
                               else np.asarray(p, dtype=object)
                               for p, n in zip(pieces, counts, strict=True)])
        return pa.array(vals, type=pa.string())
    missing = np.fromiter((p is None for p in pieces), dtype=bool, count=len(pieces))
    if not missing.any() and all(isinstance(p, np.ndarray) for p in pieces):
        values = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        mask = None
    else:
        # Loop only over the pieces that are there; absent ones stay zero and masked.
        ends = np.cumsum(counts)
        values = np.zeros(int(ends[-1]), dtype=np.float64)
        mask = np.repeat(missing, counts)
        for i in np.flatnonzero(~missing):
            p, n, end = pieces[i], counts[i], int(ends[i])
            if isinstance(p, np.ndarray):
                values[end - n:end] = p
            else:  # a list of Python values, None = null
                values[end - n:end] = [0 if v is None else v for v in p]
                mask[end - n:end] = [v is None for v in p]
    if not pa.types.is_floating(typ):
        values = values.astype(typ.to_pandas_dtype())
    return pa.array(values, type=typ, mask=mask if mask is not None and mask.any() else None)


def _dictionary_column(pieces: list[Any], counts: list[int], typ: pa.DataType) -> pa.Array:
    """A dictionary-encoded text column from :class:`Codes`, lists of str/None, or None.

    Each distinct tuple of values is mapped into the column's dictionary once (a lookup
    table), and its codes translated with one NumPy take; only plain lists are walked."""
    index: dict[str, int] = {}
    luts: dict[int, np.ndarray] = {}  # id(values tuple) -> its codes in `index`
    parts = []
    for p, n in zip(pieces, counts, strict=True):
        if p is None:
            parts.append(np.full(n, -1, dtype=np.int32))
        elif isinstance(p, Codes):
            lut = luts.get(id(p.values))
            if lut is None:
                lut = luts[id(p.values)] = np.fromiter(
                    (index.setdefault(v, len(index)) for v in p.values), np.int32,
                    len(p.values))
            parts.append(lut[p.codes])
        else:
            parts.append(np.fromiter((-1 if v is None else index.setdefault(str(v), len(index))
                                      for v in p), np.int32, n))
    codes = np.concatenate(parts) if len(parts) > 1 else parts[0]
    nulls = codes < 0
    indices = pa.array(codes, mask=nulls if nulls.any() else None).cast(typ.index_type)
    return pa.DictionaryArray.from_arrays(indices, pa.array(list(index), type=typ.value_type))


class _Wakeup:
    """Wakes the writer thread from submit(): a byte written to a pipe it waits on.

    ``os.write`` takes no Python lock, so it is safe where a threading.Event is not: in a
    SIGTERM handler that interrupted the training thread inside submit(). Without pipes and
    select on them (Windows), the writer falls back to waking every 50 ms.
    """

    def __init__(self) -> None:
        try:
            self._r, self._w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)
            select.select([self._r], [], [], 0)
        except (OSError, ValueError, AttributeError):
            self._r = self._w = -1

    def set(self) -> None:
        if self._w >= 0:
            try:
                os.write(self._w, b"\0")
            except OSError:  # pipe full (already woken many times) or closed
                pass

    def wait(self, timeout: float) -> None:
        if self._r < 0:
            time.sleep(min(timeout, 0.05))
            return
        try:
            ready, _, _ = select.select([self._r], [], [], timeout)
            if ready:
                os.read(self._r, 4096)
        except (OSError, ValueError):
            time.sleep(min(timeout, 0.05))

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = -1


class Writer:
    """Owns the writer thread, the per-table buffers and the part files of one rank."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        *,
        flush_interval_s: float,
        flush_rows: int,
        queue_size: int,
        max_buffered_rows: int,
        on_flush: Callable[[], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self.max_buffered_rows = max_buffered_rows
        self.on_flush = on_flush
        # A deque, not queue.Queue: append/popleft are atomic under the GIL, so submit()
        # takes no lock. (A SIGTERM handler that closes the recorder can then never deadlock
        # on a queue mutex the interrupted training thread was holding.)
        self.queue: collections.deque[Any] = collections.deque()
        self.queue_size = queue_size
        # When to wake. Each wake-up costs CPU that a small machine takes from training:
        # the writer's Python runs cold after a training step (~0.4 ms a wake-up in a
        # 2-core VM, whatever it finds queued), and what it finds becomes rows in one
        # vectorised batch, so it should wake rarely. But items must not wait in numbers:
        # each holds a few small tensors, and many of them alive between the training
        # loop's big allocations pinned ~40 MB of allocator memory over 250 fast steps when
        # nothing but a 0.5 s timeout woke the writer. So: submit() wakes it once every
        # `wake_every` items (at most that many wait), and otherwise it sleeps until the
        # next flush is due (the flush interval is a promise: what a kill -9 can lose).
        self.wake_every = 64
        self._wake = _Wakeup()
        self._stopping = threading.Event()
        self.buffers = {name: TableBuffer(name) for name in TABLES}
        self.dropped: Counter[str] = Counter()  # what could not be recorded, by table
        self._reported_dropped: Counter[str] = Counter()
        self.errors = 0
        self._error_kinds: set[str] = set()
        self._seq = next_seq(run_dir, rank)
        self._last_flush = time.monotonic()
        try:
            # A one-time ~0.1 s of CPU (pyarrow.compute builds its function wrappers on
            # import; numpy.ma comes with pyarrow's take/sort). Done here, in the constructor
            # before training starts: on the writer thread these imports would hold the GIL
            # during the first training steps, at the first flush mid-training otherwise.
            import numpy.ma  # noqa: F401
            import pyarrow.compute  # noqa: F401
        except Exception:
            pass
        self._thread = threading.Thread(target=self._run, name="tracealyze-writer", daemon=True)
        self._closed = False
        self.step_hint = 0  # latest step seen, for events raised here
        self._thread.start()

    # ------------------------------------------------------------------ training thread
    def submit(self, item: Callable[[Writer], None], table: str = "steps", *,
               wake: bool = False) -> bool:
        """Hand an item to the writer thread; never blocks. False (and counted) if dropped.
        ``wake``: start on it now (a one-off job, such as compressing a profiler trace,
        that should not wait for the next batch of steps)."""
        if self._closed:
            return False
        q = self.queue
        if len(q) >= self.queue_size:
            self.dropped[table] += 1
            return False
        q.append(item)
        if wake or len(q) == self.wake_every:
            self._wake.set()
        return True

    def close(self, timeout: float = 60.0) -> None:
        """Drain the queue, flush everything and stop the thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._wake.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ writer thread
    def append(self, table: str, columns: dict[str, Any]) -> None:
        """Add rows (a dict of equal-length columns; missing columns are null, rank is
        filled in at flush) to a table."""
        self.buffers[table].append(columns, len(next(iter(columns.values()))))

    def event(self, kind: str, message: str, *, severity: str = "warning",
              subject: str | None = None, stack: str | None = None,
              step: int | None = None, **details: Any) -> None:
        """Record an event from the writer thread itself."""
        self.append("events", {
            "step": [self.step_hint if step is None else step], "time": [time.time()],
            "kind": [kind], "severity": [severity], "subject": [subject],
            "message": [message], "stack": [stack],
            "details": [json.dumps(details, default=str)],
        })

    def record_error(self, where: str, exc: BaseException, *, count: bool = True) -> None:
        """Count a recorder failure, warn once per kind, and keep it as an event.
        ``count=False`` for failures the recorder already counted on the training thread."""
        if count:
            self.errors += 1
        key = f"{where}:{type(exc).__name__}"
        if key not in self._error_kinds:
            self._error_kinds.add(key)
            print(f"tracealyze: recorder error in {where} ({type(exc).__name__}: {exc}); "
                  "training continues, further errors of this kind are only counted",
                  file=sys.stderr)
        try:
            self.event("recorder_error", f"{where}: {type(exc).__name__}: {exc}",
                       severity="error", subject=where,
                       stack="".join(traceback.format_exception(exc)), count=self.errors)
        except Exception:
            pass

    def _run(self) -> None:
        while True:
            # Sleep until woken (wake_every items, a one-off job, close) or until the next
            # flush is due, whichever comes first.
            until_flush = self._last_flush + self.flush_interval_s - time.monotonic()
            self._wake.wait(max(0.0, until_flush))
            stopping = self._stopping.is_set()
            try:
                self._drain()
                due = (time.monotonic() - self._last_flush
                       >= self.flush_interval_s - _FLUSH_SLACK_S)
                if stopping or due or any(b.rows >= self.flush_rows
                                          for b in self.buffers.values()):
                    self.flush()
            except Exception as exc:  # the writer thread must outlive its own bugs
                self.record_error("writer", exc)
            if stopping:
                return

    def _drain(self) -> None:
        """Process everything queued. Consecutive items of a type with ``write_many``
        (committed steps) are processed as one batch."""
        q = self.queue
        while q:
            batch = [q.popleft()]
            many = getattr(batch[0], "write_many", None)
            if many is not None:
                kind = type(batch[0])
                while q and type(q[0]) is kind and len(batch) < 512:
                    batch.append(q.popleft())
            try:
                if many is not None:
                    many(self, batch)
                else:
                    batch[0](self)
            except Exception as exc:  # a bad item must not kill the writer
                self.record_error("writer", exc)
            if any(b.rows >= self.flush_rows for b in self.buffers.values()):
                self.flush()
            # Let the training thread have the GIL between batches.
            time.sleep(0)

    def flush(self) -> None:
        """Write every non-empty buffer as a new part; keep rows whose write failed."""
        self._last_flush = time.monotonic()
        new_drops = self.dropped - self._reported_dropped
        if new_drops:
            self._reported_dropped.update(new_drops)
            self.event("dropped_data",
                       f"recorder fell behind and dropped {sum(new_drops.values())} item(s)",
                       severity="warning", subject="writer_queue",
                       dropped=dict(new_drops), dropped_total=dict(self.dropped))
        ok = True
        for buf in self.buffers.values():
            try:
                table = buf.take(self.rank)
            except Exception as exc:  # unconvertible rows: lose them, loudly
                self.dropped[buf.name] += buf.rows
                buf.rows = 0
                self.record_error(f"convert:{buf.name}", exc)
                continue
            if table is None:
                continue
            try:
                self._write_part(buf.name, table)
            except Exception as exc:
                ok = False
                buf.put_back(table)
                self.record_error(f"write:{buf.name}", exc)
        total = sum(b.rows for b in self.buffers.values())
        if not ok and total > self.max_buffered_rows:
            # Writes keep failing (disk full?): bound memory by dropping the oldest rows.
            for buf in self.buffers.values():
                lost = buf.drop_oldest(self.max_buffered_rows // len(self.buffers))
                if lost:
                    self.dropped[buf.name] += lost
        if ok and self.on_flush is not None:
            try:
                self.on_flush()
            except Exception as exc:
                self.record_error("heartbeat", exc)

    def _write_part(self, table_name: str, table: pa.Table) -> None:
        d = self.run_dir / table_name / f"rank={self.rank}"
        d.mkdir(parents=True, exist_ok=True)  # also recreates a deleted run directory
        final = d / f"part-{self._seq:06d}.parquet"
        write_parquet_atomic(table, final)
        self._seq += 1


def write_parquet_atomic(tables: pa.Table | list[pa.Table] | Any, final: Path) -> None:
    """Write one table (or stream several of one schema) to a temporary name, fsync, and
    rename into place: readers only ever see complete files."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    it = iter([tables] if isinstance(tables, pa.Table) else tables)
    first = next(it)
    schema = first.schema
    floats = [f.name for f in schema if f.type in _FLOAT_TYPES]
    try:
        with open(tmp, "wb") as fh:
            with pq.ParquetWriter(
                fh, schema, compression="zstd", compression_level=3,
                use_dictionary=[f.name for f in schema
                                if pa.types.is_dictionary(f.type) or f.type == pa.string()],
                use_byte_stream_split=floats or False,
            ) as pw:
                pw.write_table(first)
                for t in it:
                    pw.write_table(t.cast(schema))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def next_seq(run_dir: Path, rank: int) -> int:
    """One past the highest part sequence of this rank over every table (for resume)."""
    best = 0
    for name in TABLES:
        d = run_dir / name / f"rank={rank}"
        if not d.is_dir():
            continue
        for p in d.iterdir():
            m = PART_RE.match(p.name)
            if m:
                best = max(best, int(m.group(2) or m.group(1)))
    return best + 1


def remove_stale_tmp(run_dir: Path, rank: int) -> None:
    """Temporary files of a killed writer are unfinished writes: delete them."""
    for name in TABLES:
        d = run_dir / name / f"rank={rank}"
        if d.is_dir():
            for p in d.glob(".*.tmp"):
                try:
                    p.unlink()
                except OSError:
                    pass


def merge_parts(run_dir: Path, rank: int, *, min_parts: int = 2) -> int:
    """Merge each table's single parts of this rank into ``part-<a>-<b>.parquet``.

    Crash-safe: the merged file appears atomically before the single parts are deleted, and
    readers skip single parts covered by a merged range, so a kill in between duplicates
    nothing. Previously merged files are left alone, so merged ranges never nest.
    Returns the number of files merged away.
    """
    merged = 0
    for name in TABLES:
        d = run_dir / name / f"rank={rank}"
        if not d.is_dir():
            continue
        found = [(m, p) for p in d.iterdir() if (m := PART_RE.match(p.name))]
        ranges = [(int(m.group(1)), int(m.group(2))) for m, _ in found if m.group(2)]
        singles = []
        for m, p in found:
            if m.group(2) is not None:
                continue
            seq = int(m.group(1))
            if any(a <= seq <= b for a, b in ranges):
                # Left over by a kill between an earlier merge's rename and its deletes: its
                # rows are already in that merged file. Merging it again would duplicate them.
                try:
                    p.unlink()
                except OSError:
                    pass
                continue
            singles.append((seq, p))
        singles.sort()
        if len(singles) < min_parts:
            continue
        first, last = singles[0][0], singles[-1][0]
        final = d / f"part-{first:06d}-{last:06d}.parquet"
        # Streamed one part at a time: memory stays bounded by the largest part.
        write_parquet_atomic((pq.read_table(p) for _, p in singles), final)
        for _, p in singles:
            try:
                p.unlink()
                merged += 1
            except OSError:
                pass
    return merged
