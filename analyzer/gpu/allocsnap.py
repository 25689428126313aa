"""CUDA caching-allocator memory snapshots: the pickles ``torch.cuda.memory._dump_snapshot()``
writes (the files pytorch.org/memory_viz opens), decoded without running any of their code and
summarised: what holds the memory, how fragmented the cache is, what the OOM asked for.

The format is the dict ``torch.cuda.memory._snapshot()`` returns (described in its docstring,
``torch/cuda/memory.py``; key names are kept as they are there):

* ``segments``: one dict per ``cudaMalloc`` the cache holds: ``address``, ``total_size``
  (bytes reserved from the driver), ``allocated_size``, ``stream``, ``segment_type``
  (``large`` or ``small`` pool), ``is_expandable``, ``device``, and ``blocks``, the pieces it
  is split into: ``address``, ``size``, ``requested_size`` (before rounding), ``state``
  (``active_allocated``: a live tensor; ``active_pending_free``: freed, waiting on another
  stream; ``inactive``: cached, free for reuse) and ``frames`` (the allocating stack,
  innermost first, each ``{filename, line, name}``);
* ``device_traces`` (with ``_record_memory_history`` on): per device, the allocator's last
  ``max_entries`` actions, oldest first: ``action`` (``alloc``, ``free_requested``,
  ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``, ``segment_unmap``,
  ``snapshot``, ``oom``), ``addr``, ``size``, ``stream``, ``time_us``, ``frames``, and for an
  ``oom`` the ``size`` asked for and ``device_free`` (what the driver still had free). A ring
  buffer: a long run's first actions have left it, so what it shows as still live is a lower
  bound, where the blocks in ``segments`` are the whole state at the snapshot;
* ``allocator_settings``: the ``PYTORCH_CUDA_ALLOC_CONF`` options in force.

These files come from strangers, and unpickling runs code, so :func:`decode` never hands them
to ``pickle.load``. It first walks the opcodes (:func:`_scan`), refusing object construction,
extension codes, out-of-band buffers and two things the C unpickler itself does not survive:
tuples nested so deep that hashing one as a dict key overflows the C stack (a 1 MB file kills
the interpreter) and memo indexes far past the entries so far (a 12-byte file makes it
allocate 2 GiB). Then an unpickler whose ``find_class`` and ``persistent_load`` refuse decodes
it: only dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None can be built,
so no callable reaches REDUCE or BUILD. :func:`summarize` reads only the fields it knows,
skips entries with missing or mistyped ones, and visits each container once however often the
pickle's memo repeats it, ``max_visits`` entries at most.
"""

from __future__ import annotations

import io
import itertools
import math
import pickle
import pickletools
from typing import Any

from ..errors import TracealyzeError
from ..units import fmt_bytes, single_line

MAX_BYTES = 512 << 20
"""Snapshots larger than this are refused before decoding (a 20,000-entry trace is ~5 MiB)."""
MAX_VISITS = 20_000_000
"""Entries (segments, blocks, trace entries, frames) :func:`summarize` looks at, at most."""
MAX_TUPLE_DEPTH = 64
"""Real snapshots nest tuples one deep (``segment_pool_id``)."""
MAX_TIMES = 4096  # allocation times kept per repeated_allocations group (leak vs. model)
MAX_FRAMES_SCANNED = 256
"""Frames of one stack looked at when searching for the innermost user frame."""
_INT_DIGITS = 4300
"""Longest decimal integer read (Python's own limit; before 3.11 parsing one is quadratic)."""
_LIBRARY_DIRS = ("/torch/", "/site-packages/", "/dist-packages/")
"""A frame whose file is under one of these is not the user's (torch reports them relative)."""
_FREES = ("free_requested", "free_completed")
_ACTIONS = {"alloc", *_FREES, "segment_alloc", "segment_free", "oom", "snapshot", "segment_map",
            "segment_unmap"}
_ONLY = "only dicts, lists, strings and numbers are read"


class SnapshotError(TracealyzeError, ValueError):
    """The bytes are not a memory snapshot this module will read; the message is one line."""


def _refuse(name: str, why: str) -> SnapshotError:
    what = "" if name == "snapshot" else f" {single_line(name, 200)}"
    return SnapshotError(single_line(f"memory snapshot{what}: {why}", 400))


def check_size(nbytes: int, name: str = "snapshot", max_bytes: int = MAX_BYTES) -> None:
    """Refuse a file of ``nbytes`` over ``max_bytes``: for callers, before they read it."""
    if nbytes > max_bytes:
        raise _refuse(name, f"is {fmt_bytes(nbytes)}, over the {fmt_bytes(max_bytes)} limit")


_CODE = {op.name: ord(op.code) for op in pickletools.opcodes}
_NAME = {c: n for n, c in _CODE.items()}
_ARG: list[int | None] = [None] * 256
"""Per opcode byte: its argument's byte count (>= 0), or pickletools' codes (-1: up to a
newline; -2/-3/-4/-5: a 1/4/4/8-byte length, then that many bytes); None: not an opcode."""
for _op in pickletools.opcodes:
    _ARG[ord(_op.code)] = _op.arg.n if _op.arg is not None else 0
_LEN_BYTES = {-2: 1, -3: 4, -4: 4, -5: 8}


def _codes(names: str) -> frozenset[int]:
    return frozenset(_CODE[n] for n in names.split())


_PUSH = _codes("INT BININT BININT1 BININT2 LONG LONG1 LONG4 STRING BINSTRING SHORT_BINSTRING "
               "BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8 NONE NEWTRUE NEWFALSE UNICODE "
               "SHORT_BINUNICODE BINUNICODE BINUNICODE8 FLOAT BINFLOAT EMPTY_LIST EMPTY_DICT "
               "EMPTY_SET")
_SHORT_PUSH = _codes("SHORT_BINUNICODE SHORT_BINBYTES SHORT_BINSTRING LONG1")
_FIXED_PUSH = {c: 1 + (_ARG[c] or 0) for c in _codes(
    "EMPTY_DICT EMPTY_LIST BININT1 BININT2 BININT NONE NEWTRUE NEWFALSE BINFLOAT EMPTY_SET")}
_TO_MARK_KEEP, _TO_MARK_PUSH = _codes("SETITEMS APPENDS ADDITEMS"), _codes("LIST DICT FROZENSET")
_GET, _PUT = _codes("GET BINGET LONG_BINGET"), _codes("PUT BINPUT LONG_BINPUT")
_NOOP, _DIGITS = _codes("PROTO FRAME"), _codes("INT LONG")
_HANDOVER = _codes("GLOBAL STACK_GLOBAL INST PERSID BINPERSID")  # the unpickler names them
_TUPLE_N = {_CODE["TUPLE1"]: 1, _CODE["TUPLE2"]: 2, _CODE["TUPLE3"]: 3}
_POPS = {_CODE["APPEND"]: 1, _CODE["SETITEM"]: 2}
_BINGET, _LONG_BINGET, _MEMOIZE, _MARK = (_CODE[n] for n in ("BINGET", "LONG_BINGET",
                                                             "MEMOIZE", "MARK"))


def _scan(data: bytes, name: str) -> None:
    """Walk the opcodes as the C unpickler would, tracking how deep each stack item and memo
    entry nests tuples; return at STOP or at a global or persistent lookup (the unpickler
    refuses those by name), raise on anything else not to pass. Commonest opcodes first."""
    stack, memo = bytearray(), bytearray()  # per item and memo entry: its tuple nesting depth
    marks: list[int] = []
    i, n, at = 0, len(data), 0
    try:
        while i < n:
            at, op = i, data[i]
            if op == _BINGET:
                stack.append(memo[data[i + 1]])
                i += 2
            elif op == _MEMOIZE:
                memo.append(stack[-1])
                i += 1
            elif op == _MARK:
                marks.append(len(stack))
                i += 1
            elif op in _SHORT_PUSH:  # a one-byte length, then that many bytes
                stack.append(0)
                i += 2 + data[i + 1]
            elif op in _FIXED_PUSH:  # no argument or a fixed-size one
                stack.append(0)
                i += _FIXED_PUSH[op]
            elif op == _LONG_BINGET:
                stack.append(memo[int.from_bytes(data[i + 1:i + 5], "little")])
                i += 5
            elif op in _TO_MARK_KEEP:
                del stack[marks.pop():]
                i += 1
            elif (i := _other_op(data, i, op, stack, memo, marks, name)) < 0:
                return
    except (IndexError, ValueError) as e:
        if isinstance(e, SnapshotError):
            raise
        raise _refuse(name, f"is not a readable pickle (bad {_NAME.get(data[at], '?')} at "
                            f"offset {at})") from None
    raise _refuse(name, "is truncated (ends before the pickle's STOP)")


def _other_op(data: bytes, i: int, op: int, stack: bytearray, memo: bytearray,
              marks: list[int], name: str) -> int:
    """One of :func:`_scan`'s rarer opcodes: the offset of the next, or -1 to stop walking."""
    kind, at = _ARG[op], i + 1
    if kind is None:
        raise _refuse(name, f"is not a pickle (byte {op:#04x} at offset {i})")
    if kind >= 0:
        i = at + kind
    elif kind == -1:
        i = data.find(b"\n", at) + 1 or len(data) + 1
    else:
        i = at + _LEN_BYTES[kind] + int.from_bytes(data[at:at + _LEN_BYTES[kind]], "little")
    if i > len(data):
        return i
    if op in _GET or op in _PUT:
        if kind == -1 and not data[at:i - 1].isdigit():  # as text: plain digits only
            raise IndexError
        idx = int(data[at:i]) if kind == -1 else int.from_bytes(data[at:i], "little")
        if op in _GET:
            stack.append(memo[idx])
        elif idx > len(memo):
            raise _refuse(name, f"stores memo entry {idx} after only {len(memo)}")
        else:
            memo[idx:idx + 1] = bytes((stack[-1],))
    elif op in _PUSH:
        if op in _DIGITS and i - at > _INT_DIGITS:
            raise _refuse(name, f"holds an integer of more than {_INT_DIGITS} digits")
        stack.append(0)
    elif op in _TUPLE_N or op == _CODE["TUPLE"] or op == _CODE["EMPTY_TUPLE"]:
        k = _TUPLE_N.get(op, 0) if op != _CODE["TUPLE"] else len(stack) - marks.pop()
        if not 0 <= k <= len(stack):
            raise IndexError
        depth = 1 + max(stack[len(stack) - k:], default=0)
        if depth > MAX_TUPLE_DEPTH:
            raise _refuse(name, f"nests tuples more than {MAX_TUPLE_DEPTH} deep")
        stack[len(stack) - k:] = bytes((depth,))
    elif op in _TO_MARK_PUSH or op == _CODE["POP_MARK"]:
        stack[marks.pop():] = b"\0" if op in _TO_MARK_PUSH else b""
    elif op in _POPS:  # APPEND, SETITEM: the container stays
        if len(stack) <= _POPS[op]:
            raise IndexError
        del stack[-_POPS[op]:]
    elif op == _CODE["POP"]:  # pops the mark if it is on top, as the C unpickler does
        marks.pop() if marks and marks[-1] == len(stack) else stack.pop()
    elif op == _CODE["DUP"]:
        stack.append(stack[-1])
    elif op == _CODE["STOP"] or op in _HANDOVER:
        return -1
    elif op not in _NOOP:
        raise _refuse(name, f"refuses opcode {_NAME[op]}: {_ONLY}")
    return i


class _DataOnly(pickle.Unpickler):
    """The C unpickler, with both ways to reach a Python object refused."""

    name = "snapshot"

    def find_class(self, module: str, name: str) -> Any:
        raise _refuse(self.name, f"refuses to load a Python object ({single_line(module, 80)}."
                                 f"{single_line(name, 80)}): {_ONLY}")

    def persistent_load(self, pid: Any) -> Any:
        raise _refuse(self.name, f"refuses a persistent reference: {_ONLY}")


def decode(data: bytes, name: str = "snapshot", max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """The snapshot dict in ``data`` (a pickle written by ``_dump_snapshot``), decoded as the
    module docstring says; ``name`` (the file's) is only for messages. Raises
    :class:`SnapshotError` (one line) on anything it will not read."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise _refuse(name, f"is {type(data).__name__}, not bytes")
    check_size(len(data), name, max_bytes)
    data = bytes(data)
    if not data.startswith(b"\x80"):
        raise _refuse(name, "is not a binary pickle (torch writes protocol 2 or later)")
    _scan(data, name)
    unpickler, unpickler.name = _DataOnly(io.BytesIO(data)), name
    try:
        snap = unpickler.load()
    except SnapshotError:
        raise
    except Exception as e:  # whatever a corrupt stream makes the C unpickler raise
        raise _refuse(name, f"is not a readable pickle ({type(e).__name__})") from None
    _check_shape(snap, name)
    return snap


def _check_shape(snap: Any, name: str) -> None:
    if not isinstance(snap, dict):
        raise _refuse(name, f"holds a {type(snap).__name__}, not the snapshot dict")
    if not isinstance(snap.get("segments"), list):
        raise _refuse(name, "has no 'segments' list: not a CUDA allocator snapshot")
    traces = snap.get("device_traces", [])
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise _refuse(name, "has a 'device_traces' that is not a list of lists")


# -- the summary ----------------------------------------------------------------------------------

def _size(x: Any) -> bool:
    """A byte count or address: an int in [0, 2**64) (no bool, no 10**9-digit monster)."""
    return type(x) is int and 0 <= x < 1 << 64


class _Walk:
    """Visit counting, the once-only rule for containers, and frames to text (cached per
    frames list, which a crafted file may share between a million entries)."""

    def __init__(self, max_visits: int) -> None:
        self.left = self.limit = max_visits
        self.seen: set[int] = set()
        self.frames: dict[int, str] = {}

    def first(self, obj: Any, kind: type) -> bool:
        """Whether ``obj`` is a ``kind`` not seen before (and count the visit)."""
        self.left -= 1
        if self.left < 0:
            raise SnapshotError(f"memory snapshot: more than {self.limit:,} entries visited "
                                "(a structure repeated through the pickle memo?)")
        if not isinstance(obj, kind) or id(obj) in self.seen:
            return False
        self.seen.add(id(obj))
        return True

    def frame(self, frames: Any) -> str:
        """``file:line in name`` of the innermost user frame (not torch, not site-packages),
        else of the innermost frame; ``<no stack>`` without one."""
        if not isinstance(frames, list):
            return "<no stack>"
        if id(frames) not in self.frames:
            self.left -= min(len(frames), MAX_FRAMES_SCANNED)
            ok = [f for f in frames[:MAX_FRAMES_SCANNED]
                  if isinstance(f, dict) and isinstance(f.get("filename"), str)]
            f = next((f for f in ok if not any(d in "/" + f["filename"].replace("\\", "/")
                                                for d in _LIBRARY_DIRS)), ok[0] if ok else None)
            line, fn = (f.get("line"), f.get("name")) if f else (None, None)
            self.frames[id(frames)] = "<no stack>" if f is None else single_line(
                f"{f['filename'][:300]}:{line if _size(line) and line < 1 << 31 else '?'} "
                f"in {fn[:200] if isinstance(fn, str) else '?'}")
        return self.frames[id(frames)]


def _ranked(groups: dict[Any, dict[str, Any]], top: int) -> list[dict[str, Any]]:
    return sorted(groups.values(), key=lambda g: (-g["bytes"], g["frame"], g.get("size")))[:top]


def summarize(snap: dict[str, Any], top: int = 10, max_visits: int = MAX_VISITS
              ) -> dict[str, Any]:
    """JSON-safe summary of a decoded snapshot: ``segments`` (totals over all segments:
    ``largest_inactive_block_bytes`` is the biggest request the cache could serve without a
    new ``cudaMalloc``; ``largest``: the ``top`` largest), ``live_by_frame`` (live blocks by
    innermost user frame), ``trace`` (``actions`` counted, the last ``oom``, and as
    ``repeated_allocations`` the allocations it never saw freed, by frame and size: a leak is
    many of one size from one line) and ``allocator_settings`` (its scalar entries)."""
    _check_shape(snap, "snapshot")
    top, walk = max(0, int(top)), _Walk(max_visits)
    rows: list[dict[str, Any]] = []
    live: dict[str, dict[str, Any]] = {}
    reserved = allocated = inactive = largest_free = 0
    expandable = False
    for seg in snap["segments"]:
        if not walk.first(seg, dict) or not _size(seg.get("total_size")):
            continue
        reserved += seg["total_size"]
        expandable = expandable or seg.get("is_expandable") is True
        blocks = seg.get("blocks")
        seg_alloc = n_blocks = 0
        for b in blocks if walk.first(blocks, list) else ():
            if not walk.first(b, dict) or not _size(b.get("size")):
                continue
            size, state, n_blocks = b["size"], b.get("state"), n_blocks + 1
            if state == "active_allocated":
                seg_alloc += size
                frame = walk.frame(b.get("frames"))
                g = live.setdefault(frame, {"frame": frame, "bytes": 0, "count": 0,
                                            "largest_bytes": 0})
                g["bytes"], g["count"] = g["bytes"] + size, g["count"] + 1
                g["largest_bytes"] = max(g["largest_bytes"], size)
            elif state == "inactive":
                inactive, largest_free = inactive + size, max(largest_free, size)
        allocated += seg_alloc
        addr, stype, stream = seg.get("address"), seg.get("segment_type"), seg.get("stream")
        rows.append({"address": hex(addr) if _size(addr) else None,
                     "total_size": seg["total_size"], "allocated_size": seg_alloc,
                     "segment_type": single_line(stype, 40) if isinstance(stype, str) else None,
                     "stream": stream if _size(stream) else None, "blocks": n_blocks})
    rows.sort(key=lambda r: (-r["total_size"], r["address"] or ""))
    out: dict[str, Any] = {
        "segments": {"count": len(rows), "reserved_bytes": reserved,
                     "allocated_bytes": allocated, "inactive_bytes": inactive,
                     "largest_inactive_block_bytes": largest_free, "expandable": expandable,
                     "largest": rows[:top]},
        "live_by_frame": _ranked(live, top),
        "trace": _trace(snap.get("device_traces") or [], walk, top)}
    if isinstance(snap.get("allocator_settings"), dict):
        out["allocator_settings"] = _settings(snap["allocator_settings"])
    return out


def _trace(traces: list[Any], walk: _Walk, top: int) -> dict[str, Any]:
    actions: dict[str, int] = {}
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    oom: dict[str, Any] | None = None
    entries = 0
    for device, trace in enumerate(traces):
        live: dict[int, tuple[str, int]] = {}
        for e in trace if walk.first(trace, list) else ():
            if not walk.first(e, dict) or not isinstance(e.get("action"), str):
                continue
            action, addr, size = e["action"], e.get("addr"), e.get("size")
            key, entries = action if action in _ACTIONS else "other", entries + 1
            actions[key] = actions.get(key, 0) + 1
            if action == "alloc" and _size(addr) and _size(size):
                t = e.get("time_us")
                live[addr] = (walk.frame(e.get("frames")), size, t if _size(t) else None)
            elif action in _FREES and _size(addr):
                live.pop(addr, None)
            elif action == "oom":
                free, t = e.get("device_free"), e.get("time_us")
                oom = {"device": device, "size": size if _size(size) else None,
                       "device_free": free if _size(free) else None,
                       "frame": walk.frame(e.get("frames")),
                       "time_us": t if type(t) is int and abs(t) < 1 << 63 else None}
        for frame, size, t in live.values():  # (times_us: when each was made, ≤ MAX_TIMES)
            g = groups.setdefault((frame, size), {"frame": frame, "size": size, "count": 0,
                                                  "bytes": 0, "times_us": []})
            g["count"], g["bytes"] = g["count"] + 1, g["bytes"] + size
            if t is not None and len(g["times_us"]) < MAX_TIMES:
                g["times_us"].append(t)
    return {"entries": entries, "actions": dict(sorted(actions.items())), "oom": oom,
            "repeated_allocations": _ranked(groups, top)}


def _settings(raw: dict[Any, Any]) -> dict[str, Any]:
    """The scalar entries of ``allocator_settings`` (real files also hold a dict,
    ``roundup_power2_divisions``, left out)."""
    out: dict[str, Any] = {}
    for k, v in itertools.islice(raw.items(), 100):
        if not isinstance(k, str):
            continue
        if isinstance(v, str):
            out[single_line(k, 100)] = single_line(v, 200)
        elif v is None or isinstance(v, bool) or (type(v) is int and abs(v) < 1 << 63) or (
                isinstance(v, float) and math.isfinite(v)):
            out[single_line(k, 100)] = v
    return out
