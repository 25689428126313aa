"""Rows held for the next flush: one :class:`TableBuffer` per table, converted to Arrow in
one vectorised pass per flush; :class:`Codes` for names that repeat every step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .schema import TABLES


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


def _nbytes(v: Any) -> int:
    """malloc'd bytes of a column piece: numpy arrays (and a Codes' index array)."""
    v = v.codes if isinstance(v, Codes) else v
    return int(v.nbytes) if isinstance(v, np.ndarray) else 0


def held_bytes(buffers: dict[str, TableBuffer]) -> int:
    """malloc'd bytes of the rows buffered for the next flush: read at a step's commit with
    the heap, the memory table's ``recorder_heap_bytes`` (read from the training thread: an
    int per table, a moment's estimate)."""
    return sum(b.held for b in buffers.values())


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
        # bytes of the numpy pieces held (malloc'd: part of the memory table's heap_bytes,
        # which the analyzer reads net of them; Arrow's own pool is not malloc's)
        self.held = 0
        self.failed: list[pa.Table] = []  # converted rows whose write failed, oldest first
        self.bad_rows = 0  # rows that could not be converted (dropped, counted)
        # row counts of the batches the last take() joined, oldest first: a failed write's
        # rows go back as those batches, so dropping "the oldest" under a bound drops the
        # oldest rows, not every row the buffer holds (each retry joins them all again)
        self._taken: list[int] = []

    def append(self, columns: dict[str, Any], n: int) -> None:
        if not n:
            return
        for name, pieces in self.cols.items():
            v = columns.get(name)
            pieces.append(v)
            self.held += _nbytes(v)
        self.counts.append(n)
        self.rows += n

    def take(self) -> pa.Table | None:
        """Everything buffered as one Arrow table (failed writes first). Rows that cannot be
        converted are dropped one append at a time (counted in :attr:`bad_rows`), never the
        whole buffer."""
        tables = self.failed
        self.failed = []
        if self.counts:
            try:
                tables = [*tables, self._convert(self.cols, self.counts)]
            except Exception:
                tables = [*tables, *self._salvage()]
            self.cols = {f.name: [] for f in self.schema}
            self.counts = []
        self.rows = self.held = 0
        tables = [t for t in tables if t.num_rows]
        self._taken = [t.num_rows for t in tables]
        if not tables:
            return None
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables).unify_dictionaries()

    def _convert(self, cols: dict[str, list[Any]], counts: list[int]) -> pa.Table:
        arrays = [_column(cols[f.name], counts, f.type) for f in self.schema]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def _salvage(self) -> list[pa.Table]:
        good = []
        for i, n in enumerate(self.counts):
            try:
                good.append(self._convert({k: [v[i]] for k, v in self.cols.items()}, [n]))
            except Exception:
                self.bad_rows += n
        return good

    def put_back(self, table: pa.Table) -> None:
        """Re-queue rows whose write failed, ahead of anything buffered since, as the
        batches :meth:`take` joined into ``table`` (slices: no copy)."""
        sizes = self._taken if sum(self._taken) == table.num_rows else [table.num_rows]
        at = 0
        for n in sizes:
            self.failed.append(table.slice(at, n))
            at += n
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
    if pa.types.is_list(typ) and all(isinstance(p, np.ndarray) and p.ndim == 2
                                     for p in pieces):  # (histograms: a row per tensor)
        flat = np.concatenate([p.reshape(-1) for p in pieces])
        lengths = np.concatenate([np.full(p.shape[0], p.shape[1]) for p in pieces])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(
            flat.astype(typ.value_type.to_pandas_dtype())), type=typ)
    if pa.types.is_list(typ):  # (sample ids: a list per row, None = null)
        return pa.array([v for p, n in zip(pieces, counts, strict=True)
                         for v in (p if p is not None else [None] * n)], type=typ)
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
