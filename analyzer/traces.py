"""Ingestion of Chrome/Kineto (torch.profiler) traces into the ``trace_events`` table.

``read_trace`` turns one trace file into a pyarrow table with the FORMAT.md ``trace_events``
columns plus ``rank``; ``import_traces`` writes such tables into a run directory (the
``tracealyze import-trace`` command). Nothing here imports torch.

What is kept: complete events (``ph == "X"``) only. Metadata (``M``), flow arrows
(``s``/``f``/``t``; the correlation they draw is already in ``args.correlation``), instants
(``i``/``I``), counters (``C``) and the profiler's own ``Trace`` span are skipped. Timestamps
are microseconds in every Kineto trace, whatever ``displayTimeUnit`` says (it only tells the
viewer how to label the axis); ns-resolution traces just carry fractional microseconds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tracealyze.format.parts import (
    MAX_RANK,
)

from .errors import TraceError

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")

try:  # orjson parses a 15 MB Kineto trace ~4x faster than the standard library
    import orjson

    def _loads(data: bytes) -> Any:
        return orjson.loads(data)

    def _dumps(obj: Any) -> str:
        return orjson.dumps(obj).decode()

    _JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - orjson is a dependency; keep working without it

    def _loads(data: bytes) -> Any:
        return json.loads(data)

    def _dumps(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"), default=str)

    _JSON_ERRORS = (json.JSONDecodeError, ValueError)


TRACE_EVENTS_SCHEMA = pa.schema(
    [
        ("trace_id", pa.string()),
        ("step", pa.int64()),
        ("cat", pa.string()),
        ("name", pa.string()),
        ("ts_us", pa.float64()),
        ("dur_us", pa.float64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("stream", pa.int64()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("device", pa.int64()),
        ("args", pa.string()),
        ("rank", pa.int32()),
    ]
)
"""FORMAT.md trace_events columns, in order, plus ``rank``."""

GPU_ACTIVITY_CATS: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
"""Categories that are work on the device (DESIGN 'GPU time breakdown')."""

GPU_SIDE_CATS: frozenset[str] = frozenset(
    (*GPU_ACTIVITY_CATS, "cuda_sync", "gpu_user_annotation")
)
"""Categories drawn on the device timeline; their step comes from the launching event."""

LAUNCH_CATS: tuple[str, ...] = ("cuda_runtime", "cuda_driver")
"""Host-side API calls that carry the correlation id of the device work they launch."""

# Old (PyTorch 1.8-1.10) Kineto traces and some ROCm builds use other spellings of the same
# categories. They are stored under the current names so one set of queries fits all traces.
_CAT_ALIASES: dict[str, str] = {
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Operator": "cpu_op",
    "hip_runtime": "cuda_runtime",
    "hip_driver": "cuda_driver",
    "gpu_kernel": "kernel",
    "Sync": "cuda_sync",
}

# Keys promoted to columns (or pure bookkeeping) are not repeated in the args JSON.
_PROMOTED_ARGS = frozenset(("stream", "correlation", "External id", "device", "Ev Idx"))
_PROMOTED_HOST_ARGS = _PROMOTED_ARGS - {"stream"}
ARGS_MAX_BYTES = 2048
"""args JSON longer than this keeps only its scalar values (or is dropped if still longer)."""

_NO_STREAM = frozenset((-1, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF))
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _to_int(v: Any) -> int | None:
    """Integer from an int, an integral float or a decimal/hex string ('0x0' on ROCm)."""
    if type(v) is int:
        return v
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else None
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            try:
                return int(v)  # "007": int(x, 0) refuses leading zeros
            except ValueError:
                return None
    return None


def _read_bytes(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from e
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"trace {path} is a truncated or corrupt gzip file ({e})") from e
    return data


def _load(path: Path) -> tuple[dict[str, Any], list[Any], bytes]:
    raw = _read_bytes(path)
    if not raw.strip():
        raise TraceError(f"trace {path} is empty")
    try:
        doc = _loads(raw)
    except _JSON_ERRORS as e:
        raise TraceError(
            f"trace {path} is not valid JSON (truncated or not a Chrome/Kineto trace): {e}"
        ) from e
    if isinstance(doc, list):  # the Chrome 'JSON array' form: just the events
        return {}, doc, raw
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc, doc["traceEvents"], raw
    raise TraceError(f"trace {path} has no 'traceEvents' list; not a Chrome/Kineto trace")


def _trace_stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or "trace"


def _trace_id(path: Path, meta: dict[str, Any], raw: bytes) -> str:
    # Kineto writes its own id into traces from managed jobs; otherwise the file name keeps
    # it readable and a content hash keeps it stable and unique (re-imports are detectable).
    own = meta.get("trace_id")
    if isinstance(own, str) and own.strip():
        return own.strip()
    digest = hashlib.sha1(raw).hexdigest()[:12]
    stem = _trace_stem(path)
    # import_traces names a copy '<trace_id>.<ext>' when the file name is taken: the id of
    # that copy must stay the id of the original.
    return stem if stem.endswith(f"-{digest}") else f"{stem}-{digest}"


def trace_id_for(path: Path) -> str:
    """The trace_id ``read_trace`` gives ``path``, without building the table.

    Cheap unless the trace carries its own ``trace_id`` (then the JSON is parsed). Used by the
    catalog to skip raw traces whose events are already in ``trace_events`` parts.
    """
    path = Path(path)
    raw = _read_bytes(path)
    meta: dict[str, Any] = {}
    if b'"trace_id"' in raw:
        meta = _load(path)[0]
    return _trace_id(path, meta, raw)


def _args_json(args: dict[str, Any], promoted: frozenset[str]) -> str | None:
    kept = {k: v for k, v in args.items() if k not in promoted}
    if not kept:
        return None
    text = _dumps(kept)
    if len(text) > ARGS_MAX_BYTES:
        # Long input-shape lists and concrete inputs of big ops: keep the scalars only.
        kept = {k: v for k, v in kept.items() if not isinstance(v, (list, dict))}
        text = _dumps(kept) if kept else ""
        if not text or len(text) > ARGS_MAX_BYTES:
            return None
    return text


def read_trace(path: Path, *, rank: int | None = None) -> pa.Table:
    """Parse one Chrome/Kineto trace (.json or .json.gz) into ``trace_events`` rows.

    Columns are :data:`TRACE_EVENTS_SCHEMA`. ``step`` is N of the enclosing
    ``ProfilerStep#N`` span for host events, and the step of the launching runtime event
    (joined on ``correlation``) for device events; null outside steps or without steps.
    ``rank`` is the argument, else ``distributedInfo.rank`` of the trace, else 0.
    Raises :class:`TraceError` with one clear message for unreadable, truncated or
    non-trace files.
    """
    return _parse(Path(path), rank)[0]


def _parse(path: Path, rank: int | None) -> tuple[pa.Table, str, int]:
    """read_trace's work; also returns trace_id and rank, which an empty table cannot carry."""
    meta, events, raw = _load(path)
    if rank is None:
        dist = meta.get("distributedInfo")
        rank = _to_int(dist.get("rank")) if isinstance(dist, dict) else None
        rank = rank if rank is not None else 0
    if not 0 <= rank <= MAX_RANK:
        raise TraceError(f"trace {path} has rank {rank}: a rank must be between 0 and "
                         f"{MAX_RANK}")
    trace_id = _trace_id(path, meta, raw)

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
    aliases = _CAT_ALIASES
    for e in events:
        if type(e) is not dict or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "Trace":  # the profiler's own whole-trace span, not an event of the program
            continue
        try:
            t = float(e["ts"])
            d = float(e.get("dur") or 0.0)
        except (KeyError, TypeError, ValueError):
            continue  # an event without a usable timestamp cannot be placed; skip it
        if not isinstance(cat, str):
            cat = None if cat is None else str(cat)
        else:
            cat = aliases.get(cat, cat)
        args = e.get("args")
        if type(args) is dict:
            corr = args.get("correlation")
            ext = args.get("External id")
            dev = args.get("device")
            if cat in GPU_SIDE_CATS:
                stream = args.get("stream")
                argss.append(_args_json(args, _PROMOTED_ARGS))
            else:
                # A runtime call's 'stream' is an API argument (a hex handle on ROCm), not
                # the device stream the work ran on: it stays in args, the column stays null.
                stream = None
                argss.append(_args_json(args, _PROMOTED_HOST_ARGS))
        else:
            stream = corr = ext = dev = None
            argss.append(None)
        cats.append(cat)
        name = e.get("name")
        names.append(name if isinstance(name, str) else ("" if name is None else str(name)))
        ts.append(t)
        dur.append(d)
        pid = e.get("pid")
        tid = e.get("tid")
        pids.append(pid if type(pid) is int else _to_int(pid))
        tids.append(tid if type(tid) is int else _to_int(tid))
        stream = stream if type(stream) is int else _to_int(stream)
        # Kineto writes 'no stream' (device-wide Context Sync) as uint32(-1).
        streams.append(None if stream in _NO_STREAM else stream)
        corrs.append(corr if type(corr) is int else _to_int(corr))
        exts.append(ext if type(ext) is int else _to_int(ext))
        devs.append(dev if type(dev) is int else _to_int(dev))

    n = len(ts)
    ts_a = np.asarray(ts, dtype=np.float64)
    dur_a = np.asarray(dur, dtype=np.float64)
    steps = _assign_steps(cats, names, ts_a, dur_a, corrs)

    # Time order makes the Parquet statistics useful and range queries cheap.
    order = np.argsort(ts_a, kind="stable")

    def col(values: list[Any], typ: pa.DataType) -> pa.Array:
        return pa.array(values, type=typ).take(pa.array(order))

    step_arr = pa.array(steps[0], type=pa.int64(), mask=~steps[1]).take(pa.array(order))
    table = pa.Table.from_arrays(
        [
            pa.array(np.full(n, trace_id, dtype=object), type=pa.string()),
            step_arr,
            col(cats, pa.string()),
            col(names, pa.string()),
            pa.array(ts_a[order]),
            pa.array(dur_a[order]),
            col(pids, pa.int64()),
            col(tids, pa.int64()),
            col(streams, pa.int64()),
            col(corrs, pa.int64()),
            col(exts, pa.int64()),
            col(devs, pa.int64()),
            col(argss, pa.string()),
            pa.array(np.full(n, rank, dtype=np.int32)),
        ],
        schema=TRACE_EVENTS_SCHEMA,
    )
    return table, trace_id, rank


def _assign_steps(
    cats: list[str | None],
    names: list[str],
    ts: np.ndarray,
    dur: np.ndarray,
    corrs: list[int | None],
) -> tuple[np.ndarray, np.ndarray]:
    """(step values, valid mask): ProfilerStep#N containment, then correlation for GPU rows."""
    n = len(ts)
    values = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    step_rows = [
        (i, int(m.group(1)))
        for i, nm in enumerate(names)
        if nm.startswith("ProfilerStep#") and (m := _STEP_RE.match(nm))
        and cats[i] not in GPU_SIDE_CATS
    ]
    if not step_rows or n == 0:
        return values, valid
    idx = np.array([i for i, _ in step_rows])
    nums = np.array([s for _, s in step_rows], dtype=np.int64)
    starts = ts[idx]
    ends = starts + dur[idx]
    o = np.argsort(starts, kind="stable")
    starts, ends, nums = starts[o], ends[o], nums[o]

    gpu = np.fromiter((c in GPU_SIDE_CATS for c in cats), dtype=bool, count=n)
    # Host rows: the step whose span contains the row's start (any thread: backward and
    # data-loader threads run inside the main thread's ProfilerStep span).
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts <= ends[np.clip(k, 0, None)]) & ~gpu
    values[inside] = nums[k[inside]]
    valid[inside] = True

    # Device rows: the step of the runtime call that launched them (same correlation id).
    corr = np.fromiter((-1 if c is None else c for c in corrs), dtype=np.int64, count=n)
    launch = valid & (corr >= 0) & np.fromiter((c in LAUNCH_CATS for c in cats), bool, n)
    if launch.any():
        lc = corr[launch]
        ls = values[launch]
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


# --------------------------------------------------------------------------- import-trace
