"""What a host leak is made of, when it is copies of the model's weights.

A snapshot bank (``snapshots[step] = copy.deepcopy(model.state_dict())``), an ensemble or
averaging buffer appended to instead of updated, a checkpoint kept in memory: each keeps one
copy of the parameters, so the counter rises by the model's parameter bytes at every kept
step (held-out ah_*: 714 KiB a step for a 182,854-parameter float32 model; 0.49 MiB every 50
steps for 125,570). The run knows the model's size (run.json ``model``), so a leak whose rises
are that size names its unit: the user finds the line by what it copies. A rise counts when it
is over a quarter of the copy's size and five sigmas of the counter's step noise; the unit is
their median, within [UNIT_LO, UNIT_HI] of the parameter bytes (buffers and the container's
own objects add a little; a copy in another dtype is another size)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats import robust as _stats
from ...units import fmt_bytes

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
UNIT_LO, UNIT_HI = 0.9, 1.3
MIN_RISES = 3


def param_bytes(meta: dict[str, Any]) -> int | None:
    """The model's parameter bytes from run.json (one dtype only), or None."""
    model = meta.get("model") or {}
    n, dtypes = model.get("parameters"), model.get("dtypes") or []
    if not isinstance(n, int) or n <= 0 or len(dtypes) != 1 or dtypes[0] not in ITEMSIZE:
        return None
    return n * ITEMSIZE[dtypes[0]]


def weight_copies(meta: dict[str, Any], step: np.ndarray, val: np.ndarray, first: int
                  ) -> dict[str, Any] | None:
    """{param_bytes, unit_bytes, count, every (None: no one period)} when the counter's rises
    since ``first`` are copies of the weights; None otherwise."""
    size = param_bytes(meta)
    keep = (step >= first) & np.isfinite(val)
    s, v = step[keep], val[keep]
    if size is None or len(v) < 2 * MIN_RISES:
        return None
    d = np.diff(v)
    bar = max(size / 4, 5 * _stats.mad_sigma(d))
    up = np.flatnonzero(d > bar)
    if len(up) < MIN_RISES:
        return None
    unit = float(np.median(d[up]))
    if not UNIT_LO * size <= unit <= UNIT_HI * size:
        return None
    gaps = np.diff(s[up + 1])
    g = float(np.median(gaps))
    # a period only when two gaps in three are within a quarter of it (a bank kept every
    # 50 steps, and a burst of copies around a resume, have no one period)
    regular = 3 * int((np.abs(gaps - g) <= max(1.0, 0.25 * g)).sum()) >= 2 * len(gaps) \
        and 2 * g * len(gaps) >= float(gaps.sum())  # (and it spans them)
    return {"param_bytes": size, "unit_bytes": unit, "count": len(up),
            "every": max(int(g), 1) if regular else None}


def sentence(c: dict[str, Any]) -> str:
    """What the copies are, for the leak's message."""
    when = ("at irregular steps" if c["every"] is None else "every step"
            if c["every"] == 1 else f"about every {c['every']} steps")
    return (f" Each rise is about the size of the model's parameters "
            f"({fmt_bytes(c['param_bytes'])}; {c['count']} rises, {when}): a copy of the "
            "weights is kept each time (a state_dict or deepcopy(model) snapshot, an "
            "ensemble or averaging buffer appended to). Keep such copies on disk, or a "
            "bounded number of them.")
