"""The fast path of the streaming trace reader: the events array is cut into byte chunks
between two of its elements and each chunk is parsed whole (msgspec's typed decoding in
ingest, plain values by default here).

A chunk ends at a ``}`` followed by ``,`` and the next ``{``. Such a place inside a string or
inside a nested object would leave the chunk unbalanced (an unterminated string, an unclosed
bracket), so the parser refuses it: a cut that parses is a cut between elements. When no cut
parses, :class:`Fallback` is raised and the caller reads the trace with ijson instead, which
splits any valid JSON (slower). Every byte still goes through the guarded reader (bomb guard,
hash)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

CHUNK = 4 << 20
"""Bytes read per chunk (the chunk and its parsed events are what is in memory)."""
FIND_ARRAY = 16 << 20
"""The events array must start within this many bytes, else the fast path gives up."""
_CUT = re.compile(rb"\}\s*,\s*\{")
_END = re.compile(rb"\}\s*\]")
_OPEN = re.compile(rb'"traceEvents"\s*:\s*\[')


def json_value(data: bytes) -> Any:
    """``data`` parsed as JSON (dicts, lists, ...). ValueError: not JSON, or nested past
    msgspec's limit (Python's recursion limit: ~1,000 levels), which it checks as it goes.
    Not orjson: orjson 3.13 has no nesting limit on loads and overflows the C stack on
    ~200,000 open brackets, killing the process (a hostile trace crashed ``import-trace``
    and the analyzer of a run holding it)."""
    try:
        return msgspec.json.decode(data)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e


class Fallback(Exception):
    """This trace cannot be cut safely here: read it with the incremental parser."""


def _start(reader: Any, first: bytes) -> tuple[bytes, bool]:
    """The bytes right after the events array's ``[``, and whether the trace is the bare
    Chrome array form."""
    buf = first
    lead = buf.lstrip()[:1]
    if lead == b"[":
        return buf[buf.index(b"[") + 1:], True
    while True:
        m = _OPEN.search(buf)
        if m:
            return buf[m.end():], False
        if len(buf) > FIND_ARRAY:
            raise Fallback("no events array near the start")
        data = reader.read(CHUNK)
        if not data:
            raise Fallback("no events array")
        buf += data


def _last_cut(buf: bytes) -> list[int]:
    """Candidate cut positions (the index just after a ``}`` that ends an element), last
    first, looked for in the end of the buffer."""
    window = 1 << 16
    while True:
        lo = max(0, len(buf) - window)
        cuts = [m.start() + 1 for m in _CUT.finditer(buf, lo)]
        if cuts or lo == 0:
            return cuts[::-1][:4]
        window *= 4


def chunked_events(reader: Any, first: bytes,
                   parse: Callable[[bytes], list[Any]] = json_value) -> Iterator[list[Any]]:
    """Lists of the trace's events, in file order, each ``parse`` of a JSON array of them
    (``parse`` raises ValueError for text that is not JSON). Raises Fallback where it
    cannot go on safely (some lists may have been yielded: the caller starts again with
    ijson, which also gives the authoritative error for a truncated or broken trace)."""
    buf, bare = _start(reader, first)
    while True:
        data = reader.read(CHUNK)
        if not data:
            break
        buf += data
        for cut in _last_cut(buf):
            try:
                # (one copy: the slice is a view)
                events = parse(b"".join((b"[", memoryview(buf)[:cut], b"]")))
            except ValueError:
                continue
            yield events
            buf = buf[buf.index(b",", cut) + 1:]
            break
        else:
            if len(buf) > 8 * CHUNK:  # one element of 32 MB, or no safe cut at all
                raise Fallback("no safe cut")
    yield _finish(buf, bare, parse)


def _finish(buf: bytes, bare: bool, parse: Callable[[bytes], list[Any]]) -> list[Any]:
    """The last elements: up to the ``]`` that closes the array (the first ``}]`` at which
    the prefix parses), then the rest of the document must close too."""
    stripped = buf.lstrip()
    if stripped.startswith(b"]"):
        events: list[Any] = []
        rest = stripped[1:]
    else:
        for m in _END.finditer(buf):
            try:
                events = parse(b"[" + buf[:m.start() + 1] + b"]")
            except ValueError:
                continue
            rest = buf[m.end():]
            break
        else:
            raise Fallback("the events array does not end")
    try:
        if bare:
            if rest.strip():
                raise Fallback("data after the events array")
        else:
            json_value(b'{"_": 0' + rest)  # the remaining keys and the closing brace
    except ValueError as e:
        raise Fallback("the document does not end after the events array") from e
    return events
