"""dataloader_bottleneck: a large share of step time is spent waiting for the next batch."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data
from .base import Context

ID = "dataloader_bottleneck"
NEEDS: tuple[str, ...] = ("data loading",)
DEFAULTS: dict[str, Any] = {
    "warmup_steps": 3,      # first batches include worker start-up
    "warn_share": 0.25,     # data_wait_s / duration_s over the run ≥ this → warning
    "error_share": 0.5,     # ≥ this → error
    "min_steps": 10,
    "window": 20,           # first_step: first window of this many steps above warn_share
    "min_wait_s": 0.001,    # ... and only a warning when the mean wait is ≥ this per step and
    "min_total_s": 1.0,     # the waits add up to ≥ this: below, the "wait" is the Python cost
                            # of a tiny loader next to sub-millisecond steps (info)
}
DOC = {
    "meaning": "The GPU/CPU waits for input data: the data pipeline limits throughput.",
    "rule": "sum(data_wait_s) / sum(duration_s) after warm-up ≥ warn_share (warning) or "
            "error_share (error), per rank (worst reported); info when the mean wait is "
            "below min_wait_s or the waits total less than min_total_s. Dated at the first "
            "window of `window` steps that waits at least max(warn_share, half the run's "
            "share), at its first step whose wait is that share of the window's mean step.",
    "fixes": "Raise DataLoader num_workers, pin_memory=True, persistent_workers=True, "
             "prefetch_factor, move decoding/augmentation off the hot path or cache it.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    worst = None
    shares = {}
    for r, d in _data.steps(ctx).items():
        sel = (d["step"] >= d["step"][0] + th.warmup_steps) & np.isfinite(d["data_wait_s"]) \
            & np.isfinite(d["duration_s"]) & (d["duration_s"] > 0)
        if sel.sum() < th.min_steps:
            continue
        wait, dur, step = d["data_wait_s"][sel], d["duration_s"][sel], d["step"][sel]
        share = float(np.clip(wait, 0, None).sum() / dur.sum())
        shares[r] = share
        if worst is None or share > worst[1]:
            worst = (r, share, wait, dur, step)
    if worst is None or worst[1] < th.warn_share:
        return []
    r, share, wait, dur, step = worst
    k = int(th.window)
    first = int(step[0])
    if len(wait) >= k:
        # the onset of the waiting the finding is about: the first window that waits at
        # least half the run's share (the part of a run that makes its average waits more
        # than half of it; a loader that keeps up but for ~25% noise is not that part) ...
        bar = max(th.warn_share, share / 2)
        cw, cd = np.cumsum(np.r_[0, wait]), np.cumsum(np.r_[0, dur])
        win = (cw[k:] - cw[:-k]) / np.maximum(cd[k:] - cd[:-k], 1e-12)
        above = np.flatnonzero(win >= bar)
        if len(above):
            # ... at its first step that waits at that rate of the window's mean step (a
            # 1.5 s hiccup among 30 ms steps, not an ordinary step's 10 ms of 30)
            a = int(above[0])
            mean = (cd[a + k] - cd[a]) / k
            own = np.flatnonzero(wait[a:a + k] >= bar * mean)
            first = int(step[a + (own[0] if len(own) else 0)])
    sev = "error" if share >= th.error_share else "warning"
    if float(wait.mean()) < th.min_wait_s or float(wait.sum()) < th.min_total_s:
        sev = "info"  # a large share of almost nothing
    return [Finding(
        id=ID, severity=sev, subject="dataloader", first_step=first,
        title=f"{100 * share:.0f}% of step time waits for data",
        message=(f"On rank {r}, {100 * share:.0f}% of the step time ({wait.sum():.1f} s of "
                 f"{dur.sum():.1f} s) was spent waiting for the next batch; median wait "
                 f"{1e3 * np.median(wait):.1f} ms per step of {1e3 * np.median(dur):.1f} ms."),
        advice=DOC["fixes"], chart=anchors.STEP_TIME,
        evidence={"data_wait_share": share, "rank": r, "shares_by_rank": shares,
                  "median_wait_s": float(np.median(wait)),
                  "median_step_s": float(np.median(dur))})]
