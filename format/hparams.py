"""Hyperparameters: what a run was configured to do, flattened to ``dotted.key -> value``.

The recorder flattens what it is given (a dict, a dataclass, an argparse ``Namespace``, a
Hugging Face ``TrainingArguments`` or model config, Lightning's ``hparams``) into run.json's
``"hparams"``: an object whose values are JSON scalars or short lists of them. The analyzer
serves them as the view ``hparams(key, value, type)`` (:func:`rows`). Both sides use this
module, so the rules are one:

- nested mappings and objects are flattened with dots (``{"optimizer": {"lr": 3e-4}}`` ->
  ``optimizer.lr``); an object is read through ``to_dict()`` (transformers' configs and
  arguments), ``dataclasses.fields`` or ``vars()``; anything else is its ``str()``;
- values are JSON-safe: NaN and infinities become the strings ``"nan"``, ``"inf"``,
  ``"-inf"``; an Enum is its value; bytes and paths are text;
- sizes are bounded, because a config can hold a vocabulary or a label map: at most
  :data:`MAX_KEYS` keys (the rest are counted, never raise), keys of at most
  :data:`MAX_KEY_CHARS`, text of at most :data:`MAX_TEXT_CHARS`, lists of at most
  :data:`MAX_LIST` scalars (a longer list, or one holding objects, is its ``str()`` cut to
  size), nesting of at most :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Any

MAX_KEYS = 1000
"""Keys kept per run: a whole transformers config plus TrainingArguments is ~250."""
MAX_KEY_CHARS = 200
MAX_TEXT_CHARS = 1000
MAX_LIST = 64
"""A list longer than this (a vocabulary, per-class weights) is kept as text, cut short."""
MAX_DEPTH = 8

Scalar = str | int | float | bool | None
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SECRET = re.compile(r"(^|_)(token|secret|password|passwd|api_?key|credentials?|"
                     r"private_?key|access_?key)$", re.IGNORECASE)
REDACTED = "<redacted>"
"""The value kept for a text value whose key's last part names a secret (``hub_token``,
``api_key``, ``password``; not ``max_tokens``, a count): run directories are copied to
buckets and shared, run.json with them."""


def _secret(key: str) -> bool:
    return bool(_SECRET.search(key.rsplit(".", 1)[-1].replace("-", "_")))


def _text(s: str) -> str:
    return s if len(s) <= MAX_TEXT_CHARS else s[: MAX_TEXT_CHARS - 1] + "…"


def _scalar(v: Any) -> tuple[bool, Scalar]:
    """(True, v as a JSON scalar) for a scalar-like value, else (False, None)."""
    if v is None or isinstance(v, bool):
        return True, v
    if isinstance(v, enum.Enum):
        return _scalar(v.value) if isinstance(v.value, (str, int, float)) else (True, v.name)
    if isinstance(v, int):
        return True, v if -(1 << 63) <= v < (1 << 63) else str(v)
    if isinstance(v, float):
        return True, v if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return True, _text(v)
    if isinstance(v, bytes):
        return True, _text(v.decode("utf-8", "replace"))
    if isinstance(v, os.PathLike):
        return True, _text(os.fspath(v)) if isinstance(os.fspath(v), str) else str(v)
    item = getattr(v, "item", None)  # a NumPy scalar or one-element tensor
    if callable(item) and getattr(v, "ndim", None) == 0:
        try:
            return _scalar(item())
        except Exception:
            return False, None
    return False, None


def _children(v: Any) -> Mapping[str, Any] | None:
    """The fields of an object that flattens into keys, or None."""
    if isinstance(v, Mapping):
        return v
    to_dict = getattr(v, "to_dict", None)
    if callable(to_dict) and not isinstance(v, type):
        try:
            d = to_dict()
            if isinstance(d, Mapping):
                return d
        except Exception:
            pass
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: getattr(v, f.name, None) for f in dataclasses.fields(v)}
    if type(v).__name__ in ("Namespace", "SimpleNamespace", "AttributeDict"):
        try:
            return dict(vars(v))
        except TypeError:
            return None
    return None


def flatten(obj: Any, *, prefix: str = "") -> tuple[dict[str, Any], int]:
    """``obj`` (a mapping or an object with fields) as ``{dotted key: JSON value}``, and
    the number of keys left out past :data:`MAX_KEYS`. ValueError when ``obj`` has no
    fields to flatten (a number, a string, a list)."""
    top = _children(obj)
    if top is None:
        raise ValueError(f"hparams must be a mapping or an object with fields (a dataclass, "
                         f"a Namespace, a config with to_dict()), not {type(obj).__name__}")
    out: dict[str, Any] = {}
    dropped = 0
    seen: set[int] = set()

    def put(key: str, value: Any) -> None:
        nonlocal dropped
        if isinstance(value, str) and _secret(key):
            value = REDACTED
        if key in out:
            out[key] = value  # (the later value of a key given twice)
        elif len(out) >= MAX_KEYS:
            dropped += 1
        else:
            out[key] = value

    def walk(node: Mapping[str, Any], path: str, depth: int) -> None:
        if id(node) in seen:  # a config that refers to itself
            return
        seen.add(id(node))
        for k, v in list(node.items()):
            key = f"{path}{k}"[:MAX_KEY_CHARS]
            ok, s = _scalar(v)
            if ok:
                put(key, s)
                continue
            kids = _children(v) if depth < MAX_DEPTH else None
            if kids is not None:
                if kids:
                    walk(kids, key + ".", depth + 1)
                else:
                    put(key, None)  # an empty dict: the key was set, to nothing
                continue
            if isinstance(v, (list, tuple, set, frozenset)):
                items = [_scalar(x) for x in (sorted(v, key=str) if isinstance(
                    v, (set, frozenset)) else v)]
                if len(items) <= MAX_LIST and all(ok for ok, _ in items):
                    put(key, [x for _, x in items])
                    continue
            put(key, _text(_safe_str(v)))
        seen.discard(id(node))

    walk(top, f"{prefix}." if prefix else "", 0)
    return out, dropped


def _safe_str(v: Any) -> str:
    """``str(v)`` without the memory address of a default repr (``<Foo object at 0x7f..>``):
    two runs of one configuration must not differ in it."""
    try:
        return _ADDRESS.sub("", str(v))
    except Exception:
        return f"<{type(v).__name__}>"


def from_command(argv: Any) -> dict[str, Any]:
    """What a command line says of a run: ``command`` (the line, shell-quoted) and each
    ``--name value`` / ``--name=value`` / ``--flag`` option as ``cli.name`` (dashes as
    underscores; numbers and true/false read as such), the way argparse, click, fire and
    HF's ``HfArgumentParser`` take them. ``{}`` for anything but a list of strings."""
    import shlex

    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return {}
    shown = list(argv)  # the line as kept: a secret option's value redacted
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--") or a == "--" or len(a) == 2:
            continue
        name, eq, value = a[2:].partition("=")
        key = f"cli.{name.replace('-', '_')}"[:MAX_KEY_CHARS]
        if not eq:
            if i < len(argv) and _value(argv[i]):
                value, i = argv[i], i + 1
                if _secret(key):
                    shown[i - 1] = REDACTED
            else:
                out[key] = True
                continue
        elif _secret(key):
            shown[i - 1] = f"--{name}={REDACTED}"
        out[key] = REDACTED if _secret(key) else _typed(value)
    return dict(list({"command": _text(shlex.join(shown)), **out}.items())[:MAX_KEYS])


def _value(token: str) -> bool:
    """Whether ``token`` after ``--name`` is its value: anything but another option (a
    negative number is a value)."""
    if not token.startswith("-"):
        return True
    return isinstance(_typed(token), (int, float))


def _typed(s: str) -> Scalar:
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return _scalar(kind(s))[1]
        except ValueError:
            pass
    return _text(s)


def type_of(value: Any) -> str:
    """The ``type`` column of the view: bool, int, float, str, list or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "list"
    return "str"


def text_of(value: Any) -> str | None:
    """The ``value`` column: text as it is, true/false, numbers as JSON writes them, a list
    as JSON; None stays NULL. ``TRY_CAST(value AS DOUBLE)`` reads numbers back."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def rows(hparams: Any) -> list[tuple[str, str | None, str]]:
    """run.json's ``hparams`` as the view's rows (key, value, type), sorted by key; a
    stranger's malformed entries (a non-string key, a nested object) are read as text."""
    if not isinstance(hparams, Mapping):
        return []
    out = []
    for k, v in list(hparams.items())[:MAX_KEYS]:
        if not isinstance(k, str):
            continue
        plain = (all(_scalar(x)[0] for x in v) if isinstance(v, list)
                 else v is None or isinstance(v, (str, int, float, bool)))
        if not plain:
            v = _text(json.dumps(v, default=str))
        out.append((k[:MAX_KEY_CHARS], text_of(v), type_of(v)))
    return sorted(out)


def differences(a: Any, b: Any) -> list[tuple[str, str | None, str | None]]:
    """Keys whose value differs between two runs' ``hparams``, as (key, value in a, value
    in b) sorted by key: values as the view's text (``"null"`` for a null), None where a
    run lacks the key."""
    ra = {k: "null" if v is None else v for k, v, _ in rows(a)}
    rb = {k: "null" if v is None else v for k, v, _ in rows(b)}
    missing = object()
    out = []
    for k in sorted(set(ra) | set(rb)):
        va, vb = ra.get(k, missing), rb.get(k, missing)
        if va != vb:
            out.append((k, None if va is missing else va, None if vb is missing else vb))
    return out
