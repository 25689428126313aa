"""loss_spike's events: a batch that threw the run, and a new stage of the data (#45).

Spikes and throws group into events (a knocked model's loss spikes again as it settles; one
event lasts until the loss is back). One event far beyond all the others is a batch that
threw the run (item 4). An event that begins at the first batch of a new input shape, in a
run where new shapes are rare, is a new stage of the data by design (a length curriculum, a
new source): the loss jumps because the data changed, and the model re-learns (item 2).
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from . import _changes, _data
from .base import Context

DOMINANT = 10.0
"""An event (see :func:`batch_event`) whose excess over the level before it, relative to that
level, is at least this many times every other event's is a batch of its own (a corrupt
sample), not one of a family: spikes that the loop or the learning rate makes are within an
order of magnitude of each other, relative to the loss they sit on."""
EVENT_GAP = 2
"""Spikes and throws this close (steps between them) are one event: a knocked model's loss
spikes on the next step or the one after as it settles, while a loop's spikes (every 4th
step, every N) keep their own events and stay a family."""

KNOCKED_REL = 0.5
"""A loss more than this share of its level above the level before an event (loss_spike's own
floor for a spike, min_rel_jump) has not settled: a model knocked by a batch spikes again as
it flails, each spike smaller than the first relative to the level it left, but the loss
never back near it in between (a point cloud ×1000 at step 230: spikes at 230, 232, 235, 241,
the loss 2.4-50× its level between them). A loop's periodic spikes come back to the level
between them and stay a family."""
KNOCKED_GAP = 10
"""... and the next spike comes within this many steps (two recover_steps windows): the
flailing of one knock, not a later event on the level it settled at."""


def _back(loss: np.ndarray, bar: float, i: int) -> int:
    """The first index from ``i`` where the loss is at or below ``bar`` (not above it:
    NaN counts as back), or the series' end."""
    back = np.flatnonzero(~(loss[i:] > bar))
    return i + (int(back[0]) if len(back) else len(loss) - i)


def _knocked(loss: np.ndarray, level: float, a: int, b: int) -> bool:
    """Did the loss stay unsettled (above level by KNOCKED_REL of it) at every step between
    spikes ``a`` and ``b``, ``b`` within KNOCKED_GAP steps of ``a``?"""
    between = loss[a + 1:b]
    return (b - a <= KNOCKED_GAP and len(between) > 0
            and bool(np.all(between > level + KNOCKED_REL * abs(level))))


def events(loss: np.ndarray, prev: np.ndarray, idx: np.ndarray
           ) -> list[tuple[int, float, int, list[int]]]:
    """The spikes and throws ``idx`` (sorted) as events: (first index, largest excess over
    the level before the first, relative to it; the index where the loss came back to
    within 1/DOMINANT of the first jump above that level, or the series' end; members).
    An event takes in every later spike or throw before it came back, within EVENT_GAP
    steps of the last, or while the loss has not settled since the last (_knocked): what a
    knocked model does next."""
    out: list[tuple[int, float, int, list[int]]] = []
    k = 0
    while k < len(idx):
        i0 = int(idx[k])
        level = float(prev[i0]) if i0 else float(loss[i0])
        size = (float(loss[i0]) - level) / max(abs(level), 1e-12)
        bar = level + (float(loss[i0]) - level) / DOMINANT
        end = _back(loss, bar, i0)
        members = [i0]
        k += 1
        while k < len(idx) and (int(idx[k]) <= end or int(idx[k]) - int(idx[k - 1]) <= EVENT_GAP
                                or _knocked(loss, level, int(idx[k - 1]), int(idx[k]))):
            j = int(idx[k])
            size = max(size, (float(loss[j]) - level) / max(abs(level), 1e-12))
            members.append(j)
            if j > end:  # (the event lasts until the loss is back after its last member)
                end = _back(loss, bar, j)
            k += 1
        out.append((i0, size, end, members))
    return out


def batch_event(ctx: Context, step: np.ndarray, loss: np.ndarray, prev: np.ndarray,
                idx: np.ndarray) -> tuple[int | None, int]:
    """(the index of the batch that threw the run, or None; the index where its event ended:
    the loss back within 1/DOMINANT of the jump, or the series' end).

    The batch is the first step of the event (:func:`events`) that dominates every other
    (DOMINANT), or of the only one; not one right after a learning-rate jump or during a
    rising ramp (the rate's doing)."""
    evs = sorted(events(loss, prev, idx), key=lambda e: -e[1])
    if not evs or (len(evs) > 1 and evs[0][1] < DOMINANT * evs[1][1]):
        return None, 0
    b, _, until, _ = evs[0]
    if _changes.within(ctx, int(step[b]) - 10, int(step[b])) is not None:
        return None, 0
    return b, until


def throws(loss: np.ndarray, prev: np.ndarray, sigma: float, th: Thresholds) -> np.ndarray:
    """Indices of one-step jumps to ≥ (1 + DOMINANT × min_rel_jump) × the level before
    (``prev``: the median of the previous half window), beyond z σ, from a step still near
    that level, whether or not the loss came back (one that did not is no spike: the model
    was knocked back, or thrown into NaN). Its return is not needed, so it must clear the
    spike's relative floor DOMINANT times over."""
    t = np.arange(max(1, int(th.window) // 2), len(loss))  # (a full half window before)
    jump = loss[t] - prev[t]
    near = loss[t - 1] - prev[t] <= jump / 4
    hit = (jump > float(th.min_rel_jump) * DOMINANT * np.abs(prev[t])) & (
        jump > float(th.z) * sigma) & near
    return t[hit]


def new_stages(ctx: Context, r: int, step: np.ndarray, loss: np.ndarray, prev: np.ndarray,
               idx: np.ndarray) -> tuple[np.ndarray, list[dict[str, float]]]:
    """(the members of the events that begin at the first batch of a new input shape, in a
    run where new shapes are rare (_data.RARE_SHAPES); those stages: step, until, the loss
    before and at the jump). Nothing where the recorder did not count new shapes."""
    new = _data.new_shape_steps(_data.steps(ctx).get(r))
    none: tuple[np.ndarray, list[dict[str, float]]] = (np.zeros(0, dtype=int), [])
    if not new or not len(idx):
        return none
    explained: list[int] = []
    stages: list[dict[str, float]] = []
    for first, _, end, members in events(loss, prev, idx):
        if int(step[first]) in new:
            explained += members
            stages.append({"step": int(step[first]),
                           "until": int(step[min(end, len(step) - 1)]),
                           "level": float(prev[first]), "loss": float(loss[first])})
    return np.asarray(explained, dtype=int), stages

