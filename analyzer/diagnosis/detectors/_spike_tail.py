"""loss_spike's line between instability and the data's heavy tail (#45).

A loss whose batches are heavy-tailed by the data (outlier targets, two wrong labels in a batch
of six, a long sequence summed over its tokens) puts batches 5-12x above the local level into
every run, each back at the level on the next step. What marks an accident of training is that
it did damage (the model, knocked by the update, climbs back over the next steps) or that it
stands APART times beyond everything else the loss does (an overflow, a corrupt batch); the
rest is the data.
"""

from __future__ import annotations

import warnings

import numpy as np

from ...stats import robust as _stats
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds

APART = 5.0
"""A spike stands apart from the loss's own tail when the sorted sizes (excess over the level,
relative to it) break by this factor between it and the largest step under the spike bar.
Why 5: a tail that is heavy by the data runs on in steps of under 3x among its largest
batches (the held-out lognormal, negative-binomial, label-noise and Pareto-length runs; a
mixer's noisy batches end at ~3x their level), while a corrupt batch (x100 its loss) sat
9.8x beyond them and an overflow x1e4 orders beyond; 10 (DOMINANT) missed three of the
matrix's mixer bad batches. Measured cost: 3 of 20 synthetic infinite-variance runs (Pareto
1.6, squared Student-t 2.5) have one draw 5x beyond all the others, and are flagged."""
WANDER_Z = 4.0
"""A spike did damage when the floor of the steps after it rises this many robust sigmas of
how that floor wanders after any step. Why 4: the held-out heavy-tailed healthy runs' largest
batches reach at most 2.7 (a Pareto-length sequence batch); a knocked CNN (the matrix's bad
batch on a BN CNN, per-batch noise 0.24 at a level of 0.3) reached 4.8, and Adam's state
lost on a resume reaches hundreds."""


def instability(loss: np.ndarray, prev: np.ndarray, idx: np.ndarray, sigma: float,
                 th: Thresholds, over: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(spikes, the data's tail): a spike is an accident of training when the update it
    drove did damage (the lower quartile of the next 2 x recover_steps losses stays WANDER_Z
    times what that floor wanders after any step above the level before it: the model was
    knocked and is climbing back) or when it stands APART times beyond the loss's own tail
    (its excess over the level, relative to that level, against the largest among the steps
    under the spike bar, ``over``: a corrupt batch, an overflow).
    The others are the data's heavy tail (Student-t or lognormal targets, 2 wrong labels in
    a batch of 6, a long sequence summed over its tokens): one step up, the next back where
    it was, in a continuum of sizes with the steps under the bar; nothing went wrong."""
    if not len(idx):
        return idx, idx
    k = 2 * max(1, int(th.recover_steps))
    n = len(loss)
    h = max(1, int(th.window) // 2)  # (damage is judged against a full level before it)
    # the floor of the next k steps (their lower quartile) over the level before it: a
    # model knocked by its update is worse on every batch that follows, so the floor rises;
    # a heavy tail's chance cluster of large batches leaves the others at the bulk. Against
    # how far that floor wanders after any step, robustly (MAD: the spikes' own aftermaths
    # do not widen it)
    nxt = np.lib.stride_tricks.sliding_window_view(
        np.concatenate([loss.astype(np.float64)[1:], np.full(k, np.nan)]), k)[:n]
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the last steps: all-NaN windows)
        aft = np.nanquantile(nxt, 0.25, axis=1) - prev
    ok = np.isfinite(aft)
    wander = _stats.mad_sigma(aft[ok]) if ok.sum() > 10 else 0.0
    later = aft[idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        hurt = later > WANDER_Z * wander
        rel = (loss - prev) / np.maximum(np.abs(prev), 1e-12)
    # the steps right after a spike are its consequences (a knocked model's losses, far
    # above the level before it), not draws of the data's tail
    after = np.zeros(n, dtype=bool)
    for i in idx:
        after[i + 1:i + 1 + k] = True
    valid = np.isfinite(rel) & ~after
    valid[:h] = False  # (no level before them to be relative to)
    rest = valid & ~over
    rest[idx] = False
    others = rel[rest]
    floor = max(float(np.max(others)) if len(others) else 0.0, 1e-12)
    # apart: between it and the largest step under the bar, the sizes (all steps' and every
    # spike's, sorted) break somewhere by APART; a heavy tail's run on without a break
    valid[idx] = True
    apart = _stats.stands_apart(rel[idx], rel[valid], floor, APART)
    keep = hurt | apart  # (the last step, with nothing after it, only by standing apart)
    return idx[keep], idx[~keep]


def finding(detector: str, r: int, step: np.ndarray, loss: np.ndarray, prev: np.ndarray,
            tail: np.ndarray) -> Finding:
    """The info finding for spikes that are the data's heavy tail."""
    worst = int(tail[np.argmax(loss[tail] / np.maximum(np.abs(prev[tail]), 1e-12))])
    return Finding(
        id=detector, severity="info", subject="loss", first_step=int(step[tail[0]]),
        title=f"{len(tail)} hard batch{'es' if len(tail) > 1 else ''}: the loss's own "
              "heavy tail",
        message=(f"{len(tail)} step(s) sit far above the loss's local level (the largest at "
                 f"step {int(step[worst])}: {loss[worst]:.4g} against {prev[worst]:.4g}), "
                 "each back at the level on the next steps and none standing apart from "
                 "the loss's other large batches: heavy-tailed data (outliers in the "
                 "targets, noisy labels in small batches, long sequences), not instability."),
        advice="Nothing to fix if the data is like this; a robust loss (Huber), larger "
               "batches or gradient clipping make single batches weigh less.",
        chart=anchors.LOSS,
        evidence={"count": len(tail), "spike_steps": [int(s) for s in step[tail][:20]],
                  "rank": r, "worst_step": int(step[worst]), "heavy_tail": True})
