"""The one schema of run.json and ``ranks/rank=<r>.json``, field by field.

A run directory comes from strangers: a field of the wrong type (``"model": "x"``) used to be a
traceback deep in the analyzer. :func:`check_meta` returns the metadata with every field
that has the wrong type left out (as if absent: each reader has its default), and one line
per field it left out. Unknown fields are kept (newer recorders add some).
"""

from __future__ import annotations

from typing import Any

NUMBER = (int, float)
_N = type(None)

RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "run_id": (str,), "source": (str,), "started": NUMBER,
    "started_iso": (str,), "ended": (*NUMBER, _N), "status": (str,), "heartbeat": NUMBER,
    "flush_interval_s": (*NUMBER, _N), "host": (str,), "pid": (int,), "world_size": (int,),
    "versions": (dict,), "preset": (str, _N), "knobs": (dict, _N), "model": (dict, _N),
    "device": (dict, _N), "resumes": (list,), "counters": (dict,), "exit_code": (int, _N),
    "data": (dict,),
}
"""run.json's fields and the JSON types each may hold (``float`` fields take integers)."""

RANK_FIELDS: dict[str, tuple[type, ...]] = {
    "rank": (int,), "run_id": (str, _N), "status": (str,), "started": NUMBER,
    "ended": (*NUMBER, _N), "heartbeat": NUMBER, "host": (str, _N), "pid": (int,),
    "steps": (int,), "counters": (dict,),
}
"""A rank file's fields."""

NESTED: dict[str, dict[str, tuple[type, ...]]] = {
    "model": {"class": (str,), "parameters": (int,), "trainable_parameters": (int,),
              "tensors": (int,), "modules": (int,), "dtypes": (list,), "devices": (list,),
              "sharded": (bool,)},
    "device": {"type": (str,), "name": (str,), "total_memory_bytes": (int,),
               "count": (int,)},
    "counters": {"dropped": (dict,), "recorder_errors": (int,)},
    "data": {"batch_size": (int, _N)},
    "versions": {"python": (str, _N), "torch": (str, _N), "cuda": (str, _N),
                 "tracealyze": (str, _N), "platform": (str, _N)},
}
"""Fields of the objects inside run.json and the rank files."""


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    if value is None:
        return True  # null: not known (see check_meta for containers)
    if isinstance(value, bool) and bool not in types:
        return False  # JSON true is not a number
    if isinstance(value, float) and float not in types:
        return False
    return isinstance(value, types)


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value),
                                                                        type(value).__name__)


def check_meta(meta: dict[str, Any], fields: dict[str, tuple[type, ...]] = RUN_FIELDS,
               where: str = "") -> tuple[dict[str, Any], list[str]]:
    """``meta`` without the fields whose type is wrong, and what was left out."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for key, value in meta.items():
        types = fields.get(key)
        if value is None and types is not None and _N not in types and (
                dict in types or list in types):
            continue  # a null object or array: absent, as readers expect to descend into it
        if types is not None and not _fits(value, types):
            problems.append(f"field '{where}{key}' is {_json_type(value)}: left out")
            continue
        inner = NESTED.get(key) if not where else None
        if inner is not None and isinstance(value, dict):
            value, sub = check_meta(value, inner, f"{key}.")
            problems += sub
        out[key] = value
    dropped = out.get("counters", {}).get("dropped")
    if isinstance(dropped, dict):
        bad = [k for k, v in dropped.items() if not _fits(v, (int,))]
        if bad:
            out["counters"]["dropped"] = {k: v for k, v in dropped.items() if k not in bad}
            problems += [f"counters.dropped.{k} is not a count: left out" for k in bad]
    resumes = out.get("resumes")
    if isinstance(resumes, list) and not all(isinstance(r, dict) for r in resumes):
        out["resumes"] = [r for r in resumes if isinstance(r, dict)]
        problems.append("resumes holds entries that are not objects: left out")
    return out, problems
