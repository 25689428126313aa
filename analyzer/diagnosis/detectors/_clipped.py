"""The gradient as applied: what clipping let through to the weights.

``clip_grad_norm_(max_norm)`` scales every gradient by ``min(1, max_norm / ‖g‖)``; the
recorder keeps the norm before clipping (``grad_norm``) and the clip (``grad_clip_max``). An
explosion is an update that grows out of range, so the total is also read as applied: a
clip taken away mid-run (a resume without ``--clip``: applied 1.0 → 14 → 300) lets the raw
norms through at once. (The raw norm is read too: a clipped run whose every update pushes the
same way still blows up, and its raw norm shows it.) One tensor's growth inside an update the
clip held at ``max_norm`` every step (PPO's critic ×30 under a clip of 0.5) moves the weights
no further, unless the learning rate rose into it. Per tensor, the applied norm is its raw
norm times the same factor (the clip scales the whole gradient), never over max_norm."""

from __future__ import annotations

import numpy as np


def log_factor(grad_norm: np.ndarray, clip: np.ndarray) -> np.ndarray | None:
    """ln(min(1, clip / ‖g‖)) per step (0 where no clip was recorded or it did not bite);
    None when clipping never bit."""
    with np.errstate(all="ignore"):
        on = np.isfinite(clip) & (clip > 0) & np.isfinite(grad_norm) & (grad_norm > clip)
    if not on.any():
        return None
    out = np.zeros(len(grad_norm))
    out[on] = np.log(clip[on] / grad_norm[on])
    return out


def lifted_note(step: np.ndarray, clip: np.ndarray, at: int) -> str:
    """A sentence when the clip was taken away (or raised) where the applied norm jumped:
    clipping on in the steps just before ``at``, off or at least twice as loose from it."""
    before = clip[(step < at) & (step >= at - 10)]
    before = before[np.isfinite(before)]
    now = clip[step == at]
    if not len(before) or not len(now):
        return ""
    was = float(np.median(before))
    if np.isfinite(now[0]) and now[0] < 2 * was:
        return ""
    return (f" Gradient clipping (max_norm {was:.3g}) was on until step {at - 1} and "
            + ("off" if not np.isfinite(now[0]) else f"raised to {now[0]:.3g}")
            + f" from step {at}: the raw norms it had held back reached the weights.")


def held(step: np.ndarray, factor: np.ndarray, lo: int, hi: int, share: float = 0.9) -> bool:
    """Did the clip bite at ``share`` of the steps in [lo, hi]? Then the gradient it let
    through stayed at max_norm all along: one tensor's growing part of it is the clip doing
    its job (its applied norm never exceeds max_norm), not an update out of range, unless
    the learning rate rose into it (the update is the rate times the clipped gradient: a
    ×100 jump under a clip is still ×100; the caller checks)."""
    sel = (step >= lo) & (step <= hi)
    return bool(sel.any()) and float((factor[sel] < 0).mean()) >= share
