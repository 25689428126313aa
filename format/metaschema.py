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
    "cpu_count": (int, _N),
    "versions": (dict,), "preset": (str, _N), "knobs": (dict, _N), "model": (dict, _N),
    "device": (dict, _N), "resumes": (list,), "counters": (dict,), "exit_code": (int, _N),
    "data": (dict,), "hparams": (dict,),
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

ITEMS: dict[str, tuple[type, ...]] = {"resumes": (dict,), "counters.dropped": (int,)}
"""What every entry of an array (or every value of an object used as a map) must be."""


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
        items = ITEMS.get(where + key)
        if items is not None:
            value, bad = _entries(value, items)
            if bad:
                problems.append(f"field '{where}{key}' holds {bad} entries of the wrong type: "
                                "left out")
        out[key] = value
    return out, problems


def _entries(value: Any, types: tuple[type, ...]) -> tuple[Any, int]:
    """``value`` (an array, or an object used as a map) without the entries that are not of
    ``types``, and how many there were."""
    if isinstance(value, list):
        kept: Any = [v for v in value if v is not None and _fits(v, types)]
    elif isinstance(value, dict):
        kept = {k: v for k, v in value.items() if v is not None and _fits(v, types)}
    else:
        return value, 0
    return kept, len(value) - len(kept)
