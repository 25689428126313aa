"""What the recorder learned about the model's parameters: the last ``param_coverage`` event
(which parameters never got a gradient, are frozen, or sit outside the optimizer) and the
``model_structure`` event (gradients zero by construction, modules not called in the first
training forward). Both come from a run directory, i.e. from strangers: every field is
checked for its type and anything else is ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from .base import Context

STATES = ("no_grad", "frozen", "not_in_optimizer", "frozen_in_optimizer")


def _names(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def _last(ctx: Context, kind: str) -> tuple[int | None, dict[str, Any]] | None:
    """(step, details) of the last event of ``kind`` on the lowest rank that has one."""
    rows = ctx.rows("SELECT step, details FROM events WHERE kind = ? "
                    "ORDER BY rank, step DESC NULLS LAST, time DESC LIMIT 1", [kind])
    if not rows:
        return None
    step, text = rows[0]
    try:
        d = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return (int(step) if step is not None else None, d) if isinstance(d, dict) else None


def coverage(ctx: Context) -> dict[str, Any] | None:
    """{first_step, no_grad, frozen, not_in_optimizer, frozen_in_optimizer (name lists),
    counts (per state), numel (per state), parameters, optimizer_known, onset (per state:
    the step from which every event listed the last one's names, _onsets)} or None."""

    def load() -> dict[str, Any] | None:
        last = _last(ctx, "param_coverage")
        if last is None:
            return None
        step, d = last
        first = ctx.rows("SELECT min(step) FROM events WHERE kind = 'param_coverage'")
        out: dict[str, Any] = {s: _names(d.get(s)) for s in STATES}
        for key in ("counts", "numel"):
            raw = d.get(key) if isinstance(d.get(key), dict) else {}
            for s in STATES:
                # (a missing count is the listed names' number; a missing numel unknown: 0)
                fallback = len(out[s]) if key == "counts" else 0
                out.setdefault(key, {})[s] = raw[s] if isinstance(raw.get(s), int) \
                    else fallback
        out["parameters"] = d.get("parameters") if isinstance(d.get("parameters"), int) \
            else None
        out["optimizer_known"] = d.get("optimizer_known") is True
        out["first_step"] = first[0][0] if first and first[0][0] is not None else step
        out["step"] = step
        out["onset"] = _onsets(ctx, out)
        return out

    return ctx.cached("param_coverage", load)


MAX_EVENTS = 256
"""param_coverage events read for the onsets (a handful per run: one per change of state)."""


def _onsets(ctx: Context, cov: dict[str, Any]) -> dict[str, int | None]:
    """Per state, the step of the earliest event from which every later event (of the rank
    the last one came from) listed all of the last event's names in that state: a state the
    run entered mid-way dates from there (an encoder unfrozen at step 200 and left out of the
    optimizer is outside it from 200, not from the first event at step 0, when it was frozen;
    an optimizer bound at a resume to a model the checkpoint was not loaded into, from the
    resume), one held from the start from the first event."""
    rows = ctx.rows("SELECT step, details FROM events WHERE kind = 'param_coverage' AND rank = "
                    "(SELECT min(rank) FROM events WHERE kind = 'param_coverage') "
                    "AND step IS NOT NULL ORDER BY step DESC, time DESC LIMIT ?", [MAX_EVENTS])
    listed: list[tuple[int, dict[str, Any] | None]] = []  # newest first
    for step, text in rows:
        try:
            d = json.loads(text) if isinstance(text, str) else None
        except ValueError:
            d = None
        listed.append((int(step), d if isinstance(d, dict) else None))
    out: dict[str, int | None] = {}
    for state in STATES:
        final, onset = set(cov[state]), None
        for step, d in listed:
            if d is None or not final <= set(_names(d.get(state))):
                break
            onset = step
        out[state] = onset
    return out


def structure(ctx: Context) -> dict[str, Any]:
    """{zero_by_construction: {param: {consumer, consumer_type, why}}, not_called: [module],
    output_features: the logits' last dimension or None, bounded: {module: activation
    kind}} (empty when the run has no model_structure event)."""

    def load() -> dict[str, Any]:
        last = _last(ctx, "model_structure")
        d = last[1] if last is not None else {}
        zero: dict[str, dict[str, str]] = {}
        items = d.get("zero_by_construction")
        for z in items if isinstance(items, list) else []:
            if isinstance(z, dict) and isinstance(z.get("param"), str):
                zero[z["param"]] = {k: str(z.get(k, "")) for k in
                                    ("consumer", "consumer_type", "why")}
        feats = d.get("output_features")
        raw = d.get("bounded") if isinstance(d.get("bounded"), dict) else {}
        return {"zero_by_construction": zero, "not_called": _names(d.get("not_called")),
                "output_features": feats if isinstance(feats, int) and feats >= 2 else None,
                "bounded": {k: v for k, v in raw.items()
                            if isinstance(k, str) and isinstance(v, str)},
                "known": last is not None}

    return ctx.cached("model_structure", load)


def module_of(name: str) -> str:
    return name.rpartition(".")[0]


def covering_modules(names: Iterable[str], others: Iterable[str]) -> list[str]:
    """The fewest module paths that hold exactly ``names``: a module stands for its
    parameters when none of ``others`` (the model's other parameters) lies under it; the
    highest such module is named (``blocks.2`` rather than each of its layers). In order
    of first appearance."""
    others = list(others)
    blocked: set[str] = set()  # modules holding a parameter outside ``names``
    for o in others:
        parts = o.split(".")[:-1]
        for i in range(len(parts) + 1):
            blocked.add(".".join(parts[:i]))
    out: list[str] = []
    seen: set[str] = set()
    for n in names:
        parts = n.split(".")[:-1]
        best = n
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            if m not in blocked:
                best = m
                break
        if best not in seen:
            seen.add(best)
            out.append(best)
    return out


def describe(modules: list[str], limit: int = 4) -> str:
    shown = ", ".join(modules[:limit])
    return shown + (f" and {len(modules) - limit} more" if len(modules) > limit else "")


CHANCE_TOL = 0.05
"""|level − ln C| ≤ this × ln C: at chance for the C the model's logits have."""
SMALL_K_TOL = 0.01
"""Without the logits' width: |level − ln k| ≤ this for an integer 2 ≤ k ≤ SMALL_K (ln k are
≥ 0.095 apart up to 10, so a match is not a coincidence of dense values)."""
SMALL_K = 10


def chance_level(ctx: Context, level: float) -> int | None:
    """The number of classes C whose uniform guess has cross-entropy ``level`` (ln C), from
    the logits' width the recorder saw, else from the level alone for small C."""
    if not (level > 0 and math.isfinite(level)):
        return None
    c = structure(ctx)["output_features"]
    if c is not None and abs(level - math.log(c)) <= CHANCE_TOL * math.log(c):
        return int(c)
    if level > math.log(SMALL_K) + SMALL_K_TOL:
        return None  # (and exp() of a loss that blew up to 1e35 overflows a float)
    k = round(math.exp(level))
    if 2 <= k <= SMALL_K and abs(level - math.log(k)) <= SMALL_K_TOL:
        return k
    return None
