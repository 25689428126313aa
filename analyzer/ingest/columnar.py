"""The first pass's per-event work done a column at a time (issue 31).

A chunk of the events array is decoded by msgspec straight into small typed records: the
eight fields a ``trace_events`` row is made of, with ``args`` kept as the raw JSON bytes it
was written as (no dict, no list, no number object per argument: the 1 KB of input shapes
on every op of a ``record_shapes=True`` trace is skipped over in C, not built and thrown
away). The columns are then taken out with one list comprehension each and handed to Arrow
as buffers; the args are handled for the whole chunk at once:

* the four promoted values (``stream``, ``correlation``, ``External id``, ``device``) by a
  second typed decode of all the chunk's args joined into one array;
* the ``args`` column's JSON text by one ``msgspec.json.format`` of that array (compact,
  each value spelt as the trace spelt it) and one split of it into rows (the bytes are
  then handed to Arrow as they are, checked as UTF-8 there).

The rules are :func:`.stream._convert`'s, which stays the reference (and the path for a
chunk this one declines: a field of a type Kineto does not write, args that are not an
object, text that is not UTF-8; args longer than ARGS_MAX_BYTES go to the reference row by
row). The two give the same rows, the args as the same JSON values (tested on generated
traces and the shipped ones).

Why msgspec (a dependency since issue 31): typed JSON decoding into C structs with a raw
pass-through type, maintained since 2021. Decoding the A100 trace tiled to 174 MB runs at
~270 MB/s here, against ~100 MB/s for orjson building every dict (and then the per-event
Python that read them: 25-47 MB/s in all).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec
import numpy as np
import pyarrow as pa

from . import fields
from .arrow_build import call, ints, numeric, strings, utf8
from .fields import ARGS_MAX_BYTES, CAT_ALIASES, GPU_SIDE_CATS, NO_STREAM, to_int


class Event(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event (``"ph": "X"``): the fields a row is made of (others are skipped
    unparsed)."""

    cat: msgspec.Raw = msgspec.Raw(b"null")
    """(``cat`` and ``name`` as raw JSON: a column of plain strings is built from the bytes,
    without a Python string per event)"""
    name: msgspec.Raw = msgspec.Raw(b"null")
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = msgspec.Raw(b"{}")
    """(an event without args reads as one with empty args: no row has none to join)"""


class Instant(Event, tag="i"):
    """An instant event: a row when it is the allocator's (``[memory]``)."""


# Every other phase of the Trace Event Format (and any letter) decodes to an empty record:
# flow arrows, metadata, counters, ... are a third of a GPU trace's events, never rows. An
# event without ``ph``, or with another value, makes the chunk go to the reference path.
_OTHERS = tuple(msgspec.defstruct(f"Phase{ord(c)}", [], tag_field="ph", tag=c, gc=False)
                for c in "ABCDEFGHIJKLMNOPQRSTUVWYZabcdefghjklmnopqrstuvwxyz()")


class Promoted(msgspec.Struct, gc=False):
    """The args promoted to columns (the rest of an event's args is skipped)."""

    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    device: Any = None


class Events(list):
    """A chunk decoded by :func:`decode` (what :func:`convert` takes)."""


_EVENTS = msgspec.json.Decoder(list[Union[(Event, Instant, *_OTHERS)]])
_PROMOTED = msgspec.json.Decoder(list[Promoted])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_TRACE = msgspec.Raw(b'"Trace"')
_MEMORY = msgspec.Raw(b'"[memory]"')
_NUM = frozenset((int, float))
_NUM_NONE = frozenset((int, float, type(None)))
_INT_NONE = frozenset((int, type(None)))
_STR_NONE = frozenset((str, type(None)))


def decode(data: bytes) -> Events:
    """``data`` (a JSON array of events) as typed events. Raises ``msgspec.DecodeError``
    for text that is not JSON (a cut in the wrong place) and its subclass
    ``msgspec.ValidationError`` for JSON that is not an array of objects with a one-letter
    ``ph``."""
    return Events(_EVENTS.decode(data))


def as_dict(e: msgspec.Struct) -> dict[str, Any]:
    """A typed event as the reference path reads it."""
    if not isinstance(e, Event):
        return {"ph": e.__struct_config__.tag}
    return {"ph": e.__struct_config__.tag, "cat": msgspec.json.decode(e.cat),
            "name": msgspec.json.decode(e.name), "ts": e.ts, "dur": e.dur, "pid": e.pid,
            "tid": e.tid, "args": msgspec.json.decode(e.args)}


def _ints(values: list[Any]) -> list[int | None]:
    """A column of promoted integers as :func:`.fields.to_int` reads each."""
    if set(map(type, values)) <= _INT_NONE:
        return values
    return [v if type(v) is int or v is None else to_int(v) for v in values]


def _args(raws: list[msgspec.Raw]) -> tuple[list[Promoted], pa.Array] | None:
    """(promoted values per row, the args column), or None where a row's args is not an
    object (``null`` included: no profiler writes it), or not valid UTF-8."""
    joined = b"[" + b",".join(raws) + b"]"
    try:
        promoted = _PROMOTED.decode(joined)
        rows: list[Any] = _RAWS.decode(msgspec.json.format(joined, indent=-1))
        lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        missing = np.zeros(len(rows), dtype=bool)
        # null, {} and args long enough to be cut to their scalars: looked at one by one
        for k in np.flatnonzero((lengths <= 4) | (lengths > ARGS_MAX_BYTES)).tolist():
            r = bytes(rows[k])
            if r in (b"null", b"{}"):
                rows[k], missing[k] = b"", True
            elif len(r) > ARGS_MAX_BYTES:
                text = fields.args_json(msgspec.json.decode(r))
                rows[k] = b"" if text is None else text.encode("utf-8", "replace")
                missing[k] = text is None
    except ValueError:  # (msgspec's Validation/DecodeError, UnicodeDecodeError)
        return None
    arr = utf8(rows, missing)
    try:
        arr.validate(full=True)  # (the raw bytes were never decoded: UTF-8 is checked here)
    except pa.ArrowInvalid:
        return None
    return promoted, arr


def _texts(raws: list[msgspec.Raw]) -> pa.Array | None:
    """A string column from raw JSON values, straight from their bytes; None unless every
    value is a plain string (no escapes: then its only quotes are the two around it)."""
    joined = b"".join(raws)
    if b"\\" in joined:
        return None
    n = len(raws)
    lengths = np.fromiter(map(len, raws), np.int64, n)
    ends = np.cumsum(lengths)
    b = np.frombuffer(joined, np.uint8)
    if n and (lengths.min() < 2 or (b[ends - lengths] != 0x22).any()
              or (b[ends - 1] != 0x22).any()):
        return None
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths - 2, out=offsets[1:])
    if offsets[-1] >= 2**31:
        return None
    arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                 pa.py_buffer(joined.replace(b'"', b""))])
    try:
        arr.validate(full=True)  # (UTF-8)
    except pa.ArrowInvalid:
        return None
    return arr


def _values(raws: list[msgspec.Raw]) -> list[Any] | None:
    """The values themselves; None where one is not valid JSON text (not UTF-8)."""
    try:
        return [msgspec.json.decode(r) for r in raws]
    except ValueError:  # (msgspec.DecodeError, UnicodeDecodeError)
        return None


def _categories(raws: list[msgspec.Raw]) -> tuple[pa.Array, list[bool]] | None:
    """The category column (older spellings mapped to today's) and which rows are drawn
    on the device; None where a category is neither a string nor null."""
    arr = _texts(raws)
    if arr is None:
        cats = _values(raws)
        if cats is None or not set(map(type, cats)) <= _STR_NONE:
            return None
        cats = [CAT_ALIASES.get(c, c) for c in cats]
        return strings(cats), [c in GPU_SIDE_CATS for c in cats]
    enc = call("dictionary_encode", arr)  # (a handful of distinct values)
    names = enc.dictionary.to_pylist()
    mapped = [CAT_ALIASES.get(c, c) for c in names]
    if mapped != names:
        arr = pa.DictionaryArray.from_arrays(enc.indices, strings(mapped)).dictionary_decode()
    codes = np.frombuffer(enc.indices.buffers()[1], np.int32, count=len(enc))
    device = [k for k, c in enumerate(mapped) if c in GPU_SIDE_CATS]
    return arr, np.isin(codes, device).tolist()


def _names(raws: list[msgspec.Raw]) -> pa.Array | None:
    arr = _texts(raws)
    if arr is not None:
        return arr
    names = _values(raws)
    if names is None:
        return None
    return strings([fields.name_text(n) for n in names])


def convert(events: Events, start: int, schema: pa.Schema
            ) -> tuple[pa.RecordBatch, int] | None:
    """The complete events (and allocator instants) of ``events`` as a first-pass record
    batch (``i``: ``start`` + the position among them) and how many positions it used; None
    where some field is of a type the reference path must judge."""
    kept = [e for e in events
            if type(e) is Event or (type(e) is Instant and e.name == _MEMORY)]
    used = len(kept)
    cats = [e.cat for e in kept]
    if _TRACE in cats:  # the profiler's own whole-trace span
        pos = [k for k, c in enumerate(cats) if c != _TRACE]
        kept = [kept[k] for k in pos]
        cats = [cats[k] for k in pos]
        idx = np.asarray(pos, dtype=np.int64) + start
    else:
        idx = np.arange(start, start + used, dtype=np.int64)
    ts = [e.ts for e in kept]
    dur = [e.dur for e in kept]
    if not (set(map(type, ts)) <= _NUM and set(map(type, dur)) <= _NUM_NONE):
        return None  # text, null or missing times: the reference skips or converts each
    try:
        ts_a = np.array(ts, dtype=np.float64)
        # (a JSON number is never NaN: NaN here is a missing duration, which counts as 0)
        dur_a = np.array(dur, dtype=np.float64)
    except OverflowError:  # an integer beyond a double: the reference skips the event
        return None
    dur_a[np.isnan(dur_a)] = 0.0
    got_cats = _categories(cats)
    got = _args([e.args for e in kept])
    if got_cats is None or got is None:
        return None
    cat_arr, gpu = got_cats
    promoted, args = got
    name_arr = _names([e.name for e in kept])
    if name_arr is None:
        return None
    no_stream = NO_STREAM
    streams = _ints([p.stream if g else None for p, g in zip(promoted, gpu, strict=True)])
    streams = [None if s in no_stream else s for s in streams]
    arrays = [
        numeric(idx, pa.int64()), cat_arr, name_arr,
        numeric(ts_a, pa.float64()),
        numeric(dur_a, pa.float64()), ints(_ints([e.pid for e in kept])),
        ints(_ints([e.tid for e in kept])), ints(streams),
        ints(_ints([p.correlation for p in promoted])),
        ints(_ints([p.external_id for p in promoted])),
        ints(_ints([p.device for p in promoted])),
        args,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema), used
