"""Arrow arrays from Python lists and numpy arrays *without* ``pa.array``.

``pa.array`` checks every input against pandas types, and so imports pandas whenever it is
installed: 0.3 s of a command's start-up (``import-trace`` of a small trace took 0.45 s, two
thirds of it that import). These builders hand Arrow the buffers directly.

Likewise the few compute kernels the ingest needs go through :func:`call`, not the
``pyarrow.compute`` module (nor the methods, such as ``Table.take``, that import it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa


def _compute() -> Any:
    """The compiled module ``pyarrow.compute`` is built on. Importing ``pyarrow.compute``
    itself makes a Python wrapper and a parsed docstring for each of its ~300 functions
    (and imports pydoc): 30 ms, a seventh of a small trace's whole import."""
    try:
        import pyarrow._compute as mod
    except ImportError:  # (a pyarrow that moved it: the public module, and its import)
        import pyarrow.compute as mod
    return mod


def call(name: str, *args: Any, options: Any = None) -> Any:
    """Arrow's compute function ``name`` over ``args``, without importing
    ``pyarrow.compute`` (:func:`_compute`)."""
    return _compute().call_function(name, list(args), options)


def compute_options(kind: str, **kw: Any) -> Any:
    """An options object of ``pyarrow.compute`` (``kind``: its class name), without the
    module's import."""
    return getattr(_compute(), kind)(**kw)


def _validity(missing: np.ndarray) -> tuple[pa.Buffer | None, int]:
    nulls = int(missing.sum())
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(~missing, bitorder="little")), nulls


def numeric(values: np.ndarray, typ: pa.DataType, missing: np.ndarray | None = None
            ) -> pa.Array:
    """A numeric array over ``values`` (converted to ``typ``'s numpy type); ``missing`` marks
    nulls."""
    data = np.ascontiguousarray(values, dtype=typ.to_pandas_dtype())
    valid, nulls = _validity(missing) if missing is not None else (None, 0)
    return pa.Array.from_buffers(typ, len(data), [valid, pa.py_buffer(data)],
                                 null_count=nulls)


def ints(values: Sequence[int | None]) -> pa.Array:
    """int64 with None as null (values beyond int64 become null)."""
    try:
        if None not in values:
            return numeric(np.array(values, dtype=np.int64), pa.int64())
        missing = np.array([v is None for v in values], dtype=bool)
        return numeric(np.array([0 if v is None else v for v in values], dtype=np.int64),
                       pa.int64(), missing)
    except (OverflowError, TypeError, ValueError):
        pass  # some value beyond int64 (or an odd nested shape): one at a time below
    a = np.empty(len(values), dtype=object)
    a[:] = list(values)
    missing = np.equal(a, None)
    big = np.fromiter((v is not None and not -2**63 <= v < 2**63 for v in a), bool, len(a))
    a[missing | big] = 0
    return numeric(a.astype(np.int64), pa.int64(), missing | big)


def floats(values: Sequence[float]) -> pa.Array:
    return numeric(np.fromiter(values, np.float64, len(values)), pa.float64())


def strings(values: Sequence[str | None]) -> pa.Array:
    """UTF-8 strings with None as null (a lone surrogate, not encodable, becomes "?")."""
    if len(values) > 64:  # each distinct value encoded once (names and categories repeat)
        enc: dict[str | None, bytes | None] = {}
        for v in set(values):
            enc[v] = None if v is None else v.encode("utf-8", "replace")
        return utf8([enc[v] for v in values])
    return utf8([None if v is None else v.encode("utf-8", "replace") for v in values])


def utf8(values: Sequence[bytes | None], missing: np.ndarray | None = None) -> pa.Array:
    """Strings from their UTF-8 bytes, None as null (the bytes are not checked here).
    ``missing``: the nulls, given where the caller knows them (then ``values`` holds
    ``b""`` for each, not None)."""
    n = len(values)
    if missing is not None:
        enc = values
    elif None in values:
        missing = np.array([v is None for v in values], dtype=bool)
        enc = [b"" if v is None else v for v in values]
    else:
        missing, enc = np.zeros(n, dtype=bool), values
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, enc), np.int64, n), out=offsets[1:])
    typ = pa.string() if offsets[-1] < 2**31 else pa.large_string()
    off = offsets.astype(np.int32) if typ == pa.string() else offsets
    valid, nulls = _validity(missing)
    arr = pa.Array.from_buffers(typ, n, [valid, pa.py_buffer(off), pa.py_buffer(b"".join(enc))],
                                null_count=nulls)
    return arr if typ == pa.string() else call("cast", arr, options=compute_options(
        "CastOptions", target_type=pa.string()))


def repeated(value: str, n: int) -> pa.Array:
    """``value`` ``n`` times (a constant column)."""
    return call("take", strings([value]), numeric(np.zeros(n, np.int64), pa.int64()))


def values(arr: pa.Array) -> np.ndarray:
    """A numeric array without nulls as a numpy view (``to_numpy`` imports pandas too)."""
    if arr.null_count:
        raise ValueError("values() needs an array without nulls")
    dtype = np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr) + arr.offset)[arr.offset:]
