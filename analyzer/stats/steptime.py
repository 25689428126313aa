"""The step-time outlier rule, one definition for the step_time_outlier detector, the report's
step-time chart (its caption counts the same steps as the finding) and ``compare``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import robust as _stats


def recorder_busy(knobs: Mapping[str, Any], step: np.ndarray) -> np.ndarray:
    """Steps at which the recorder itself did planned extra work (full statistics cadences,
    profiler windows and the trace export after them), from run.json's knobs. On a small
    model these steps are several times slower by design (e.g. every 10th step with the debug
    preset): they are the recorder's cost, not stalls of the training."""
    busy = np.zeros(len(step), dtype=bool)
    for k in ("tensor_stats_every", "param_stats_every", "activation_stats_every",
              "update_ratio_every"):
        every = int(knobs.get(k) or 0)
        if every > 0:
            busy |= step % every == 0
    start, every = int(knobs.get("profile_start") or 0), int(knobs.get("profile_every") or 0)
    if start > 0 or every > 0:
        warmup = int(knobs.get("profile_warmup") or 0)
        active = int(knobs.get("profile_active") or 1)
        windows = int(knobs.get("profile_max_windows") or 1)
        first = start - warmup  # as recorder/training/profiling.py schedules them
        starts = [max(first, 0)]
        if every > 0:
            starts += [first + k * every for k in range(1, windows)]
        for s0 in starts:
            busy |= (step >= s0) & (step <= s0 + warmup + active)
    return busy


def outliers(step: np.ndarray, dur: np.ndarray, knobs: Mapping[str, Any],
             th: Mapping[str, Any]) -> dict[str, Any] | None:
    """The outlier rule, shared with the report's step-time chart (so its caption counts
    the same steps as the finding): over the steps after warm-up that are not the
    recorder's own planned work, those slower than max(median + z·σ, (1 + min_rel)·median).
    None with fewer than min_steps such steps."""
    sel = (step >= step[0] + th["warmup_steps"]) & np.isfinite(dur) if len(step) else \
        np.zeros(0, dtype=bool)
    sel &= ~recorder_busy(knobs, step)
    if sel.sum() < th["min_steps"]:
        return None
    d = dur[sel]
    med = float(np.median(d))
    sigma = _stats.mad_sigma(d)
    threshold = max(med + th["z"] * max(sigma, 1e-9), (1 + th["min_rel"]) * med)
    out = np.zeros(len(step), dtype=bool)
    out[sel] = d > threshold
    return {"mask": out, "sel": sel, "med": med, "sigma": sigma, "threshold": threshold}
