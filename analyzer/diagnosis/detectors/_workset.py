"""memory_leak's line between a leak and a working set that grew with the work (#45).

A curriculum that doubles the sequence length, a progressive image size or a batch longer
than any before raises what a step needs; the allocator (malloc's arenas, the OS's pages,
oneDNN's scratch) keeps that high-water mark, so the memory floor rises in a staircase whose
risers come where the work per step reached a new high. A leak grows at its own rate whatever
the work: its rises are spread over the run, and the few windows where the work sets a record
hold about their share of them.
"""

from __future__ import annotations

import numpy as np

RECORD = 0.1
"""A window sets a work record when its work exceeds every earlier window's by this share
(step-to-step noise of a steady loop's step time is a few per cent; a curriculum's stage is
1.5-4x)."""
WORK_GROWTH = 0.5
"""The floor's rise is the working set's when at least this share of it comes in or right
after a record window. A leak's share is about the share of windows that are records (on
the matrix's 150 leak runs at most 0.19: ~5 record windows of 50); the held-out curricula
(a TCN whose length doubles three times, a ViT 16->24->32 px) put 0.6-1.0 of their growth
there."""


def work_series(d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, bool]:
    """(steps, work per step, by_tokens) from a rank's steps columns: the token count where
    the recorder has it for most steps (a window's work is then its largest batch), else
    the step time (then a window's median, so that a stall sets no record)."""
    step, dur = d["step"], d["duration_s"]
    tok = d["tokens_per_s"] * dur
    if np.isfinite(tok).mean() > 0.8:
        return step, tok, True
    return step, dur, False


def share_with_work(x: np.ndarray, y: np.ndarray, work: tuple[np.ndarray, np.ndarray, bool]
                    ) -> float:
    """The share of the floor series' rise (windows starting at ``x``, floors ``y``) that
    comes in a window where the work per step set a record, or in the window after it (a
    window's floor is its minimum: a riser inside it shows in the next one)."""
    step, val, by_tokens = work
    if len(x) < 3 or not np.isfinite(val).any():
        return 0.0
    edges = np.concatenate([x, [np.inf]])
    # the reference: the work before the analysed windows (past the first 3 steps, which
    # compile and tune)
    ok = np.isfinite(val) & (step >= (step[0] if len(step) else 0) + 3)
    pre = val[ok & (step < x[0])]
    top = float(np.max(pre) if by_tokens else np.median(pre)) if len(pre) else -np.inf
    rec = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        seg = val[ok & (step >= edges[i]) & (step < edges[i + 1])]
        if not len(seg):
            continue
        w = float(np.max(seg) if by_tokens else np.median(seg))
        rec[i] = w > (1 + RECORD) * top
        top = max(top, w)
    rise = np.maximum(np.diff(y), 0.0)
    total = float(rise.sum())
    return float(rise[rec[1:] | rec[:-1]].sum() / total) if total > 0 else 0.0
