"""vanishing_gradient: a layer's gradient is tiny relative to its weights and to the other
layers, consistently over the later part of the run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...stats.onset import departure
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _changes, _collapse, _data, _structure
from .base import Context

ID = "vanishing_gradient"
NEEDS: tuple[str, ...] = ("gradients",)
DEFAULTS: dict[str, Any] = {
    "window_frac": 0.5,        # look at the last half of the run
    "max_grad_weight": 1e-5,   # ‖grad‖ / ‖weight‖ below this ...
    "max_rel_median": 1e-3,    # ... and ‖grad‖ below this × the median layer's ‖grad‖
    "min_frac": 0.8,           # in at least this share of the window's steps
    "min_points": 5,
    "early_frac": 0.1,         # a layer below no_grad_rel × the median layer already in this
    "no_grad_rel": 1e-2,       # first share of the run, alone in its module and flat after
                               # (its late level within a decade of its early maximum),
                               # receives no gradient (info, not a trend): two decades below
                               # the median layer from the first steps is never a normal
                               # gradient, so not a decline; rounding noise of a sum that
                               # cancels sits at ~1e-7 of the median layer in float32 and
                               # ~1e-3 under bf16 autocast (MLP-Mixer's token bias before
                               # LayerNorm)
}
DOC = {
    "meaning": "Some layers get (almost) no gradient: they do not learn.",
    "rule": "over the last window_frac of the run, in ≥ min_frac of the steps, ‖grad‖/‖weight‖ "
            "< max_grad_weight and ‖grad‖ < max_rel_median × the median layer's ‖grad‖ "
            "(geometric means per step bucket; exact zeros count). A parameter already below "
            "no_grad_rel × the median layer in the first early_frac of the run while its "
            "module's other parameters are not, and whose late median level is within a decade "
            "of its early median level (medians at both ends: rounding noise scatters "
            "several-fold from step to step, so an early maximum against a late median reads "
            "that scatter as a decline), receives no gradient by construction (an attention key "
            "bias, rounding noise under bf16): info, not a trend. So does a parameter the "
            "model's structure makes zero (a bias right before BatchNorm/InstanceNorm, seen by "
            "the recorder in the first forward), whatever its numbers, and a parameter "
            "below max_rel_median × the median layer from its first step while its module's "
            "other parameters learn (it never had a gradient to lose). Dated where the "
            "worst tensor's gradient fell below max_rel_median × the median layer's for "
            "good (the onset engine's departure), or its first step when it never was "
            "above that. Every layer at once (_collapse.py): the total gradient norm falls "
            "FALL (1000) times from its earlier level (the highest rolling median before the "
            "last quarter) to its late one (the last quarter's median), held to the end, while "
            "the loss falls less than LOSS_FALL (10) times over the same steps (a converging "
            "model's loss falls with its gradient): error, dated where the norm went below the "
            "middle of the two levels for good.",
    "fixes": "Use ReLU/GELU instead of saturating sigmoid/tanh, residual connections, "
             "normalisation (LayerNorm/BatchNorm), better init (Kaiming/Xavier); check for "
             "detach()/no_grad cutting the graph.",
}


def _matrix(series: Mapping[str, Mapping[str, np.ndarray]], names: list[str], nb: int
            ) -> np.ndarray:
    """names × buckets of ln ‖·‖ (−inf where the whole bucket was exactly zero)."""
    m = np.full((len(names), nb), np.nan)
    for i, n in enumerate(names):
        s = series[n]
        b = s["bucket"].astype(np.int64)
        v = s["log_norm"].copy()
        v[(s["n_zero"] >= s["n"]) & (s["n"] > 0)] = -np.inf
        m[i, b] = v
    return m


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    out = _layers(ctx, th)
    if not any(f.severity != "info" for f in out):  # (every layer fell together)
        col = _collapse.collapse(ctx)
        if col is not None:
            out.append(_collapse.finding(col, ID, DOC["fixes"]))
    return out


def _layers(ctx: Context, th: Thresholds) -> list[Finding]:
    """Layers whose gradient is tiny beside the other layers'."""
    grads = _data.series_of(ctx, "grad")
    if not grads:
        return []
    params = _data.series_of(ctx, "param")
    names = _data.model_order(ctx, "grad")
    names = [n for n in names if n in grads]
    nb = int(max(s["bucket"].max() for s in grads.values())) + 1
    g = _matrix(grads, names, nb)
    w = _matrix(params, names, nb) if params else np.full_like(g, np.nan)
    for i, n in enumerate(names):
        if n not in params:
            w[i] = np.nan
    start = int(nb * (1 - float(th.window_frac)))
    # Parameters whose gradient is (numerically) zero from the very first steps do not
    # *vanish*: they receive no gradient by construction (BERT's attention key bias: softmax
    # is invariant to it), or are unused. That is a different, informational finding.
    early = g[:, :max(1, int(nb * float(th.early_frac)))]
    with np.errstate(all="ignore"):  # (all-NaN columns give NaN)
        early_med = _stats.nanmedian(np.where(np.isfinite(early), early, np.nan), axis=0)
        early_dev = early - early_med if len(names) >= 2 else early
        early_rel = _stats.nanmax(early_dev, axis=1)
        # its typical early level, for the decline test below: the same statistic as the
        # late level (a median), since rounding noise scatters by several times from bucket
        # to bucket, and the early maximum against the late median read that scatter as a
        # decade's decline (MLP-Mixer's token-MLP output bias: ~1e-9 throughout, 1e-7 of
        # its weight's gradient, flagged as vanishing)
        early_typ = _stats.nanmedian(np.where(np.isfinite(early_dev), early_dev, np.nan),
                                     axis=1)
    # ... and isolated: its module's other parameters get a normal gradient (a depth-wise
    # vanishing gradient shrinks a whole layer, weight and bias alike).
    # ... and flat: still that low later, with no decline after those first steps (a
    # vanishing gradient falls by orders of magnitude; rounding noise stays within a decade
    # of its typical early level; BERT's key weights start tiny and grow: they learn)
    with np.errstate(all="ignore"):
        med_all = _stats.nanmedian(np.where(np.isfinite(g), g, np.nan), axis=0)
        late = g[:, start:] - med_all[start:]
        late_rel = _stats.nanmedian(np.where(np.isfinite(late), late, np.nan), axis=1)
    tiny = {names[i] for i in range(len(names))
            if not np.isfinite(early_rel[i]) or (
                early_rel[i] < math.log(th.no_grad_rel)
                and not late_rel[i] >= math.log(th.no_grad_rel)  # (a weight that grows)
                and not late_rel[i] < early_typ[i] - math.log(10.0))}
    learning = {n.rpartition(".")[0] for n in names if n not in tiny}  # modules
    no_grad = [i for i, n in enumerate(names) if n in tiny and n.rpartition(".")[0] in learning]
    # the structure says so (a bias before BatchNorm): zero by construction, whatever the
    # float noise of its numbers
    built = _structure.structure(ctx)["zero_by_construction"]
    no_grad = sorted(set(no_grad) | {i for i, n in enumerate(names) if n in built})
    g_all = g
    g, w = g[:, start:], w[:, start:]
    present = ~np.isnan(g)
    if present.sum(axis=1).max(initial=0) < th.min_points:
        return []
    with np.errstate(all="ignore"):
        finite_g = np.where(np.isfinite(g), g, np.nan)
        med = _stats.nanmedian(finite_g, axis=0)  # median layer per bucket
        rel_ok = (g - med < math.log(th.max_rel_median)) if len(names) >= 2 else present
        gw = g - w
        gw_ok = np.where(np.isnan(w), True, gw < math.log(th.max_grad_weight))
        if len(names) < 2 and np.isnan(w).all():
            return []  # nothing to compare against
        hit = present & rel_ok & gw_ok
    frac = hit.sum(axis=1) / np.maximum(present.sum(axis=1), 1)
    bad = [i for i in range(len(names))
           if present[i].sum() >= th.min_points and frac[i] >= th.min_frac]
    dead = [i for i in no_grad if i in set(bad) or names[i] in built]
    # A parameter below the bar from its first step did not vanish: it never had a
    # gradient, whatever its tiny level did later (an MLP-Mixer's token bias before
    # LayerNorm, 1e-9 of the median layer, falls further when the learning rate jumps). When
    # its module's other parameters learn, it is zero by construction too (info); a whole
    # layer below the bar from the start (a deep sigmoid stack) stays a vanishing gradient.
    dead += [i for i in bad if i not in set(dead) and (_onset(
        g_all[i], med_all, start, float(th.max_rel_median)) or (0, False))[1] and any(
        n.rpartition(".")[0] == names[i].rpartition(".")[0] and n not in tiny
        for j, n in enumerate(names) if j != i and j not in set(bad))]
    bad = [i for i in bad if i not in set(dead)]
    info = [_zero_by_construction([names[i] for i in dead], len(names), built)] if dead \
        else []
    if not bad:
        return info
    with np.errstate(all="ignore"):
        rel = np.array([np.nanmedian(np.where(np.isfinite(g[i] - med), g[i] - med, np.nan))
                        if np.isfinite(g[i] - med).any() else -np.inf for i in bad])
    worst = bad[int(np.argmin(rel))]
    tb = _data.tensor_buckets(ctx)
    s = grads[names[worst]]
    onset = _onset(g_all[worst], med_all, start, float(th.max_rel_median))
    first_bucket = onset[0] if onset is not None else \
        start + int(np.flatnonzero(hit[worst])[0])
    first_step = int(s["step0"][np.searchsorted(s["bucket"], first_bucket)]
                     if first_bucket <= s["bucket"].max() else s["step0"][-1])
    gmed = float(np.nanmedian(finite_g[worst])) if np.isfinite(finite_g[worst]).any() else None
    wmed = float(np.nanmedian(w[worst])) if np.isfinite(w[worst]).any() else None
    gnorm = math.exp(gmed) if gmed is not None else 0.0
    ratio = math.exp(gmed - wmed) if gmed is not None and wmed is not None else None
    layer_med = float(np.nanmedian(med)) if np.isfinite(med).any() else None
    return [*info, Finding(
        id=ID, severity="warning", subject=names[worst], first_step=first_step,
        title=f"Vanishing gradients in {len(bad)} layer(s)",
        message=(f"{len(bad)} of {len(names)} layers get almost no gradient in the last "
                 f"{100 * th.window_frac:.0f}% of the run; worst {names[worst]}: "
                 f"‖grad‖ ≈ {gnorm:.3g}"
                 + (f", {ratio:.2g} of its weight norm" if ratio is not None else "")
                 + (f", vs {math.exp(layer_med):.3g} for the median layer"
                    if layer_med is not None else "") + "."
                 + _collapse_note(ctx, early_med, layer_med)),
        advice=DOC["fixes"], chart=anchors.GRAD_HEATMAP,
        evidence={"layers": [names[i] for i in bad[:20]], "layers_vanishing": len(bad),
                  "layers_total": len(names), "grad_norm": gnorm, "grad_weight_ratio": ratio,
                  "median_layer_grad_norm": math.exp(layer_med) if layer_med is not None
                  else None, "bucket_steps": int(tb["bucket_size"])})]


COLLAPSE = 100.0
"""The median layer's gradient falling this many times from the first steps (at
initialisation, before a bad learning rate does its damage) to the late window is a collapse
of the whole model (dead units, saturated norms), not a depth effect."""


def _onset(g: np.ndarray, med: np.ndarray, start: int, rel: float
           ) -> tuple[int, bool] | None:
    """The bucket where a tensor's gradient fell below ``rel`` × the median layer's for good
    (the onset engine's departure, on the negated log ratio; exact zeros are far below):
    its first bucket when it was never above that bar before the judged window ``start``.
    (bucket, whether it never was above the bar); None without enough points."""
    with np.errstate(invalid="ignore"):
        r = np.where(np.isneginf(g), -50.0, g - med)
    idx = np.flatnonzero(np.isfinite(r))
    if len(idx) < 3:
        return None
    x = -r[idx]
    wv = max(3, len(x) // 20)
    sm = _stats.rolling_median(x, wv)
    bar = -math.log(rel)
    before = max(1, int(np.searchsorted(idx, start)))
    best = int(np.argmin(sm[:before]))
    never = bool(sm[best] > bar)
    at = int(idx[0]) if never else int(idx[min(departure(x, sm, best, bar, wv), len(idx) - 1)])
    return at, never


def _collapse_note(ctx: Context, early_med: np.ndarray, late_med: float | None) -> str:
    """When every layer's gradient collapsed together: say so, with the learning rate (a far
    too high one kills units and saturates norms; the usual cause)."""
    ok = early_med[:3][np.isfinite(early_med[:3])]  # the first steps, at initialisation
    if late_med is None or not len(ok):
        return ""
    fall = math.exp(float(np.median(ok)) - late_med)
    if fall < COLLAPSE:
        return ""
    lr = _changes.lr_summary(ctx)
    return (f" The median layer's gradient itself fell {fall:.3g}× since the first steps: "
            "the whole model stopped learning (dead units, saturated normalisation)"
            + (f", at a learning rate of {lr['max']:.3g}; a learning rate far too high "
               "is the usual cause" if lr is not None else "") + ".")


def _zero_by_construction(names: list[str], total: int,
                          built: dict[str, dict[str, str]]) -> Finding:
    why = [f"{n}: {built[n]['why']} ({built[n]['consumer']})" for n in names if n in built]
    return Finding(
        id=ID, severity="info", subject=names[0], first_step=None,
        title=f"{len(names)} parameter(s) have a gradient of zero by construction",
        message=(f"{', '.join(names[:5])}{' …' if len(names) > 5 else ''}: the gradient is "
                 "(numerically) zero from the first steps on, not a decline. "
                 + (why[0] + "." if why else "Usually by construction (an attention key "
                    "bias: softmax ignores it).")),
        advice="Nothing to do: the parameter cannot change the output (it may be removed, "
               "e.g. bias=False on a conv before BatchNorm).",
        chart=anchors.GRAD_HEATMAP,
        evidence={"parameters": names[:20], "count": len(names), "layers_total": total,
                  "reasons": why[:20]})
