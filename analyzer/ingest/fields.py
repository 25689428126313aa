"""What a Chrome/Kineto trace event becomes in ``trace_events``: the columns, the category
spellings, the args that are promoted to columns, and the trace's id. Shared by the streaming
reader (:mod:`.stream`) and the trace helpers (:mod:`.read`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..gpu import vocabulary


def dumps(obj: Any) -> str:
    """``obj`` as compact JSON. orjson (imported on first use: 2 ms of every start-up, and
    the columnar path rarely needs it) serialises ~4x faster than the standard library."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - orjson is a dependency; keep working without it
        return json.dumps(obj, separators=(",", ":"), default=str)
    try:
        return orjson.dumps(obj, default=str).decode()
    except TypeError:  # an integer beyond 64 bits: the standard library writes it
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


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

GPU_ACTIVITY_CATS: tuple[str, ...] = vocabulary.GPU_ACTIVITY
"""Categories that are work on the device (DESIGN 'GPU time breakdown')."""

GPU_SIDE_CATS: frozenset[str] = frozenset(vocabulary.GPU_SIDE)
"""Categories drawn on the device timeline; their step comes from the launching event."""

LAUNCH_CATS: tuple[str, ...] = vocabulary.LAUNCH
"""Host-side API calls that carry the correlation id of the device work they launch."""

CAT_ALIASES: dict[str, str] = vocabulary.ALIASES
"""Other spellings of the same categories, stored under the current names."""

ARGS_MAX_BYTES = 2048
"""args JSON longer than this keeps only its scalar values (or is dropped if still longer)."""

NO_STREAM = frozenset((-1, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF))
"""How Kineto writes 'no stream' (a device-wide Context Sync)."""


def to_int(v: Any) -> int | None:
    """Integer from an int, an integral float or a decimal/hex string ('0x0' on ROCm)."""
    if type(v) is int:
        return v
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float):
        return int(v) if v.is_integer() and abs(v) < 2**63 else None
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            try:
                return int(v)  # "007": int(x, 0) refuses leading zeros
            except ValueError:
                return None
    return None


def name_text(v: Any) -> str:
    """An event's ``name`` as stored: itself when text, "" when missing, else its str()."""
    return v if type(v) is str else ("" if v is None else str(v))


def args_json(args: dict[str, Any]) -> str | None:
    """The ``args`` column's text for an event's args object: all of it (the promoted
    values are columns too, and stay here as the trace wrote them), compact; None when
    empty. Longer than ARGS_MAX_BYTES: its scalar values only."""
    if not args:
        return None
    try:
        text = dumps(args)
    except (TypeError, ValueError, RecursionError):
        # nested past orjson's 255 levels: no profiler writes such args
        return None
    if len(text) > ARGS_MAX_BYTES:
        # Long input-shape lists and concrete inputs of big ops: keep the scalars only.
        kept = {k: v for k, v in args.items() if not isinstance(v, (list, dict))}
        text = dumps(kept) if kept else ""
        if not text or len(text) > ARGS_MAX_BYTES:
            return None
    return text


def trace_stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or "trace"


def trace_id(path: Path, meta: dict[str, Any], digest: str) -> str:
    """The trace's id: Kineto writes its own into traces from managed jobs; otherwise the
    file name keeps it readable and ``digest`` (12 hex digits of the SHA-1 of the
    decompressed bytes) keeps it stable and unique (re-imports are detectable)."""
    own = meta.get("trace_id")
    if isinstance(own, str) and own.strip():
        return own.strip()
    stem = trace_stem(path)
    # import_traces names a copy '<stem>-<digest>.<ext>' when the file name is taken: the id
    # of that copy must stay the id of the original.
    return stem if stem.endswith(f"-{digest}") else f"{stem}-{digest}"
