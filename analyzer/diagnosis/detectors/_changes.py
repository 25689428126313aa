"""What changed during a run that can explain a finding: learning-rate jumps (a broken
schedule, a resumed run with the wrong LR), loss-scale collapses (fp16 overflows) and resumes.

Detectors attach the change that precedes their onset (:func:`within`) to their finding, so
the finding names it ("right after the learning rate went from 3e-4 to 3e-2 at step 100").
Every change is ``{step, kind, text}`` (LR jumps also carry ``from``, ``to``, ``factor``).
Smooth schedules (warm-up, cosine decay) are not changes: a change is a jump of at least
``MIN_JUMP``× between two consecutive recorded steps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _data
from .base import Context

MIN_JUMP = 3.0
"""Consecutive-step LR ratio (either way) that counts as a jump."""


def lr_changes(ctx: Context) -> list[dict[str, Any]]:
    """The primary rank's LR jumps (kind ``lr``, with from, to, factor), in step order."""

    def load() -> list[dict[str, Any]]:
        r = _data.primary_rank(ctx, "lr")
        if r is None:
            return []
        d = _data.steps(ctx)[r]
        ok = np.isfinite(d["lr"]) & (d["lr"] > 0)
        step, lr = d["step"][ok], d["lr"][ok]
        if len(lr) < 2:
            return []
        ratio = lr[1:] / lr[:-1]
        idx = np.flatnonzero((ratio >= MIN_JUMP) | (ratio <= 1 / MIN_JUMP))
        return [{"step": int(step[i + 1]), "kind": "lr", "from": float(lr[i]),
                 "to": float(lr[i + 1]), "factor": float(ratio[i]),
                 "text": f"the learning rate went from {lr[i]:.3g} to {lr[i + 1]:.3g} "
                         f"(×{ratio[i]:.3g}) at step {int(step[i + 1])}"} for i in idx]

    return ctx.cached("lr_changes", load)


SCALE_DROP = 8.0
"""A GradScaler scale falling this many times within SCALE_WINDOW steps is a collapse (one
halving per overflow is the scaler's normal work)."""
SCALE_WINDOW = 10


def other_changes(ctx: Context) -> list[dict[str, Any]]:
    """Resumes (``resumed`` events) and loss-scale collapses, as changes: {step, kind, text}."""

    def load() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for (step,) in ctx.rows("SELECT DISTINCT step FROM events WHERE kind = 'resumed' "
                                "AND step IS NOT NULL ORDER BY step"):
            out.append({"step": int(step), "kind": "resume",
                        "text": f"the run was resumed at step {int(step)}"})
        r = _data.primary_rank(ctx, "loss_scale")
        if r is not None:
            d = _data.steps(ctx)[r]
            ok = np.isfinite(d["loss_scale"]) & (d["loss_scale"] > 0)
            step, sc = d["step"][ok], d["loss_scale"][ok]
            i = 0
            while i < len(sc):
                j = int(np.searchsorted(step, step[i] + SCALE_WINDOW, side="right"))
                k = i + int(np.argmin(sc[i:j]))
                if sc[i] / sc[k] >= SCALE_DROP:
                    a = i + int(np.argmax(sc[i:k + 1] < sc[i]))  # the first halving
                    out.append({"step": int(step[a]), "kind": "loss_scale",
                                "text": f"the loss scale collapsed from {sc[i]:g} to "
                                        f"{sc[k]:g} (steps {int(step[a])}–{int(step[k])})"})
                    i = k + 1
                else:
                    i += 1
        return sorted(out, key=lambda c: c["step"])

    return ctx.cached("other_changes", load)


def within(ctx: Context, lo: int, hi: int) -> dict[str, Any] | None:
    """The last change in [lo, hi] that can start an instability: an LR increase, a resume,
    a loss-scale collapse (an onset estimate can come a few steps early on a noisy loss: the
    change before the rise is *clear* is the one that caused it). Without one, a learning
    rate still rising into the instability (:func:`lr_ramp`, kind ``lr_ramp``, whose step is
    where the rise began: not a change to date the instability by)."""
    cands = [c for c in lr_changes(ctx) if c["factor"] > 1] + other_changes(ctx)
    inside = [c for c in cands if lo <= c["step"] <= hi]
    if inside:
        return max(inside, key=lambda c: c["step"])
    # (callers pass lo = onset − 10: the ramp is judged at the onset, not where the damage
    # is clear)
    return lr_ramp(ctx, lo, min(hi, lo + 10))


RAMP_FACTOR = MIN_JUMP
"""A gradual rise counts as a cause when the LR at the instability is at least this many
times its lowest level before (the same size as a jump, spread over many steps)."""
RAMP_RECENT = 0.05
"""... and it was still rising: the LR then is above its level this share of the run
earlier (a warm-up that ended long before is not a cause)."""


def lr_ramp(ctx: Context, lo: int, hi: int) -> dict[str, Any] | None:
    """A learning rate that rose gradually (a ramp, a warm-up that does not end, a schedule
    going the wrong way) by ≥ RAMP_FACTOR up to the instability in [lo, hi], and was still
    rising then. {step (where the rise began), kind 'lr_ramp', from, to, factor, text}."""
    r = _data.primary_rank(ctx, "lr")
    if r is None:
        return None
    d = _data.steps(ctx)[r]
    ok = np.isfinite(d["lr"]) & (d["lr"] > 0)
    step, lr = d["step"][ok], d["lr"][ok]
    if len(lr) < 3:
        return None
    at = np.flatnonzero(step <= hi)
    if not len(at):
        return None
    i = int(at[-1])
    j = int(np.argmin(lr[:i + 1]))
    s_lo, s_hi = _data.step_range(ctx)
    span = max(1, int(RAMP_RECENT * ((s_hi or 0) - (s_lo or 0) + 1)))
    k = int(np.searchsorted(step, max(int(step[i]) - span, int(step[0]))))
    if lr[i] < RAMP_FACTOR * lr[j] or lr[i] <= lr[k] * 1.01 or j >= i:
        return None
    f = float(lr[i] / lr[j])
    # a rise that one step made most of (half of it or more, in logs) is a jump, not a ramp
    # (lr_changes names it): a ×100 resume at step 240 is no steady rise from step 0
    steps_up = np.diff(np.log(lr[j:i + 1]))
    if len(steps_up) and float(steps_up.max()) >= 0.5 * math.log(f):
        return None
    return {"step": int(step[j]), "kind": "lr_ramp", "from": float(lr[j]), "to": float(lr[i]),
            "factor": f,
            "text": f"the learning rate rose steadily ×{f:.3g}, from {lr[j]:.3g} at step "
                    f"{int(step[j])} to {lr[i]:.3g} at step {int(step[i])}, and was still "
                    "rising"}


def lr_summary(ctx: Context) -> dict[str, Any] | None:
    """The run's learning rate at a glance: first, max, and whether it was constant."""
    r = _data.primary_rank(ctx, "lr")
    if r is None:
        return None
    lr = _data.steps(ctx)[r]["lr"]
    lr = lr[np.isfinite(lr)]
    if not len(lr):
        return None
    return {"first": float(lr[0]), "max": float(lr.max()),
            "constant": bool(np.allclose(lr, lr[0], rtol=1e-6))}


DECAYED = 1e-3
"""A learning rate this small a share of its peak has stopped learning (Adam's step is ~lr)."""


def lr_decayed(ctx: Context, at: int) -> dict[str, Any] | None:
    """The learning rate's trajectory when, by the end of the run, it had decayed below
    DECAYED × its peak, and it was already falling towards it by step ``at`` (a per-batch
    scheduler meant per epoch, a decay too fast): {peak, at_onset, end, text}; else None."""
    r = _data.primary_rank(ctx, "lr")
    if r is None:
        return None
    d = _data.steps(ctx)[r]
    ok = np.isfinite(d["lr"]) & (d["lr"] > 0)
    step, lr = d["step"][ok], d["lr"][ok]
    if len(lr) < 3:
        return None
    peak, end = float(lr.max()), float(lr[-1])
    i = min(int(np.searchsorted(step, at)), len(lr) - 1)
    if end > DECAYED * peak or lr[i] >= peak or int(np.argmax(lr)) >= i:
        return None
    gone = int(step[int(np.argmax(lr <= DECAYED * peak))])
    return {"peak": peak, "at_onset": float(lr[i]), "end": end, "below_at": gone,
            "text": f"The learning rate had fallen from {peak:.3g} to {lr[i]:.3g} by step "
                    f"{int(step[i])}, below {DECAYED:g}× its peak from step {gone}, and "
                    f"{end:.3g} at the end"}


EARLY_FRAC = 0.1
"""Share of the run that counts as 'from the start' for :func:`early_lr_note`."""


def early_lr_note(ctx: Context, first_step: int | None) -> str:
    """For an instability (spikes, explosion, divergence, NaN) with no LR jump before it: in
    the first EARLY_FRAC of the run, a sentence naming the learning rate the run started
    with, the usual culprit; later, with a constant learning rate, that rate as context.
    Empty otherwise (a schedule's LR at that step is in the lr chart)."""
    if first_step is None:
        return ""
    lo, hi = _data.step_range(ctx)
    lr = lr_summary(ctx)
    if lo is None or lr is None or any(c["step"] <= first_step for c in lr_changes(ctx)):
        return ""
    if first_step > lo + EARLY_FRAC * (hi - lo + 1):
        if not lr["constant"]:
            return ""
        return (f" The learning rate was {lr['first']:.3g} throughout (no schedule change "
                "came before it).")
    return (f" It starts within the first {100 * EARLY_FRAC:.0f}% of the run at a learning "
            f"rate of {lr['first']:.3g}"
            + (" (constant)" if lr["constant"] else "")
            + ": instability from the first steps usually means the learning rate is too "
            "high (try 3–10× lower, or a warm-up).")


def dated_by(cause: dict[str, Any] | None, first: Any) -> tuple[Any, str]:
    """(onset, ", because ..." clause) of a finding that ``cause`` (from :func:`within`)
    explains: a sudden change dates the finding at its own step; a ramp began long before
    and does not date it, it only explains it."""
    if cause is None:
        return first, ""
    if cause["kind"] == "lr_ramp":
        return first, f", as {cause['text']}"
    return cause["step"], f", right after {cause['text']}"
