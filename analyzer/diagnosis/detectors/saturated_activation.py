"""saturated_activation: a bounded activation sits at its bounds for most of its output."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data, _structure
from .base import Context

ID = "saturated_activation"
NEEDS: tuple[str, ...] = ("NaN origin by module",)  # (module hooks, as dead_activation)
DEFAULTS: dict[str, Any] = {
    "window_frac": 0.5,    # judged on the last half of the run's statistics steps
    "min_sat_frac": 0.5,   # median share of the output within 1% of the range of a bound
    "min_points": 3,
    "episode_frac": 0.1,   # an episode that ended: consecutive saturated statistics steps
                           # spanning this share of the run (a fifth of the judged window:
                           # long enough that its layers lost a stretch of training, not
                           # one odd batch), begun after an unsaturated one
}
DOC = {
    "meaning": "A bounded activation (tanh, sigmoid, hardtanh, softsign, hardsigmoid, the top "
               "of ReLU6, softmax) sits at its bounds for most of its output: those units "
               "pass almost no gradient (a tanh at |y| ≥ 0.98 passes under 4% of what it "
               "passes at 0; hardtanh none).",
    "rule": "median, over the statistics steps of the last window_frac of the run, of the "
            "module's sat_frac (share of its output within 1% of its range from a bound; "
            "softmax: share of its distributions whose top probability is ≥ 0.99) ≥ "
            "min_sat_frac, on ≥ min_points steps; or an episode that ended: ≥ min_points "
            "consecutive statistics steps at ≥ min_sat_frac spanning ≥ episode_frac of the "
            "run, begun after a step below it (an onset: saturation present from "
            "initialisation that training removes is the init's scale learned away, "
            "not a change). The module whose output is the model's "
            "output is left out (a confident prediction is saturated by design). Softmax is "
            "info (peaked attention and confident outputs are often healthy); the others "
            "warning. Needs activation statistics (preset debug).",
    "fixes": "Scale the pre-activation down: a smaller init (Xavier for tanh/sigmoid), a "
             "normalisation before the activation, a lower LR; for a gate, check its bias.",
}


def _rows(ctx: Context, rank: int) -> dict[str, dict[str, np.ndarray]]:
    cols = ctx.arrays(
        f"SELECT name, step::DOUBLE AS step, sat_frac::DOUBLE AS sat, norm::DOUBLE AS norm, "
        f"numel::DOUBLE AS numel, seq::DOUBLE AS seq FROM tensor_stats "
        f"WHERE rank = {int(rank)} AND kind = 'activation' "
        f"AND (sat_frac IS NOT NULL OR name = '<model>') "
        f"ORDER BY name, step")
    out: dict[str, dict[str, np.ndarray]] = {}
    names = np.asarray(cols["name"], dtype=object)
    for name in dict.fromkeys(names):
        sel = names == name
        out[str(name)] = {k: np.asarray(cols[k], np.float64)[sel]
                          for k in ("step", "sat", "norm", "numel", "seq")}
    return out


def _last_seq(ctx: Context, rank: int) -> dict[float, float]:
    """Per statistics step, the forward-completion position of the last module output
    recorded (the root's own row aside)."""
    rows = ctx.rows(f"SELECT step::DOUBLE, max(seq)::DOUBLE FROM tensor_stats WHERE "
                    f"rank = {int(rank)} AND kind = 'activation' AND name <> '<model>' AND "
                    f"seq IS NOT NULL GROUP BY step")
    return {float(a): float(b) for a, b in rows}


def _is_output(s: dict[str, np.ndarray], root: dict[str, np.ndarray] | None,
               last: dict[float, float]) -> bool:
    """The module's output is the model's. With a row of the root module: the same
    statistics as the root's at every step both have (the same tensor). Without one (the
    root returned its last child's output as it is, so the recorder did not write it
    twice): the module's output is the last one of every forward pass."""
    if root is not None:
        common, i, j = np.intersect1d(s["step"], root["step"], return_indices=True)
        return bool(len(common)) and bool(np.all((s["norm"][i] == root["norm"][j])
                                                 & (s["numel"][i] == root["numel"][j])))
    return bool(len(s["step"])) and all(last.get(float(st)) == float(q)
                                        for st, q in zip(s["step"], s["seq"], strict=True))


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    bounded = _structure.structure(ctx)["bounded"]
    rank = _data.tensor_rank(ctx)
    if not bounded or rank is None:
        return []
    series = _rows(ctx, rank)
    root = series.pop("<model>", None)
    last = _last_seq(ctx, rank) if root is None else {}
    lo, hi = _data.step_range(ctx)
    span = float(hi - lo) if lo is not None and hi is not None else 0.0
    found = []
    for name, s in series.items():
        ok = np.isfinite(s["sat"])
        steps, sat = s["step"][ok], s["sat"][ok]
        if not len(steps) or name not in bounded or _is_output(s, root, last):
            continue
        late = steps >= steps[0] + (steps[-1] - steps[0]) * (1 - float(th.window_frac))
        med = float(np.median(sat[late])) if late.sum() >= th.min_points else 0.0
        if med >= th.min_sat_frac:
            # dated where its last saturated stretch began (the last point may be below:
            # a median over the window is saturated, not every step)
            hot = np.flatnonzero(sat >= th.min_sat_frac)
            below = np.flatnonzero(sat[:hot[-1]] < th.min_sat_frac)
            onset = int(steps[below[-1] + 1]) if len(below) else int(steps[0])
            found.append((bounded[name] == "softmax", False, -med, name, onset, med, None))
            continue
        ep = _episode(steps, sat, th, span)
        if ep is not None:
            a, b, m = ep
            found.append((bounded[name] == "softmax", b is not None, -m, name, a, m, b))
    if not found:
        return []
    found.sort()
    soft, _, _, name, onset, med, until = found[0]
    kind = bounded[name]
    what = "distributions with a top probability ≥ 0.99" if kind == "softmax" else \
        "output within 1% of its range from a bound"
    return [Finding(
        id=ID, severity="info" if soft else "warning", subject=name, first_step=onset,
        title=f"Saturated {kind} in {len(found)} module(s)" if len(found) > 1
        else f"Saturated {kind}: {name}",
        message=((f"{name} ({kind}) has {100 * med:.0f}% of its {what} in the last part "
                  f"of the run (median of its statistics steps), from step {onset:,}: those "
                  "units pass almost no gradient.") if until is None else
                 (f"{name} ({kind}) had {100 * med:.0f}% of its {what} from step {onset:,} "
                  f"until step {until:,} (median of its statistics steps there; below "
                  "before and after): those units passed almost no gradient, so nothing "
                  "before them learned for that stretch. Look at what changed at its "
                  "start: the inputs' scale (a refitted normaliser), the weights (a resume, "
                  "a learning-rate rise).")),
        advice=DOC["fixes"], chart=anchors.ACTIVATIONS,
        evidence={"modules": [f[3] for f in found[:20]], "kind": kind,
                  "sat_frac": med, "count": len(found), "until_step": until})]


def _episode(steps: np.ndarray, sat: np.ndarray, th: Thresholds, span: float
             ) -> tuple[int, int | None, float] | None:
    """(first step, first step after it (None: to the end), median share) of the longest
    stretch of consecutive statistics steps at ≥ min_sat_frac that began after one below
    it and spans ≥ episode_frac of the run (``span`` steps); None without one."""
    hot = sat >= float(th.min_sat_frac)
    edges = np.diff(hot.astype(np.int8))
    starts = np.flatnonzero(edges == 1) + 1  # (after a step below: never at index 0)
    stops = np.r_[np.flatnonzero(edges == -1) + 1, len(hot)]
    best = None
    for i in starts:
        j = int(stops[np.searchsorted(stops, i)])  # the first step below after it
        end = float(steps[j]) if j < len(hot) else float(steps[-1])
        if j - i >= int(th.min_points) and end - float(steps[i]) >= \
                float(th.episode_frac) * span and (best is None or j - i > best[1] - best[0]):
            best = (int(i), j)
    if best is None:
        return None
    i, j = best
    return (int(steps[i]), int(steps[j]) if j < len(steps) else None,
            float(np.median(sat[i:j])))
