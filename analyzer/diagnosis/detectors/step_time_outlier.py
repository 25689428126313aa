"""step_time_outlier: steps far slower than the typical step (median/MAD)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats.periodic import MIN_CYCLES
from ...stats.steptime import outliers
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data
from .base import Context

ID = "step_time_outlier"
NEEDS: tuple[str, ...] = ("step time",)
DEFAULTS: dict[str, Any] = {
    "warmup_steps": 3,        # compilation / cudnn autotune / first batches are slow
    "z": 6.0,                 # outlier: duration − median > z × robust σ ...
    "min_rel": 1.0,           # ... and > (1 + min_rel) × median (jitter of tiny steps is ~1.5×)
    "warn_time_share": 0.1,   # warning when outliers cost ≥ this share of the run's time
    "min_excess_s": 1.0,      # ... and at least this many seconds (a stall shorter than this
                              #     costs nothing that matters)
    "busy_cpu_percent": 80.0,  # machine CPU (system table) during the slow steps at or above
                               # this, and 20 points above the run's median: other processes
                               # kept the machine busy (info, not a warning about the run)
    "others_cores": 0.5,       # ... or other processes held at least this many cores' worth
                               # of CPU during the slow steps (the machine's CPU minus this
                               # process's, over run.json's cpu_count): a machine busy for
                               # the whole run is still busy; half a core taken by others
                               # stalls a loop whose threads use every core
    "min_steps": 20,
}
DOC = {
    "meaning": "Some steps take much longer than the rest (stalls, GC, checkpoints, syncs).",
    "rule": "after warm-up, duration − median > z × 1.4826·MAD and > min_rel × median; info "
            "unless the excess time of the outliers is ≥ warn_time_share of the total and ≥ "
            "min_excess_s seconds (or they keep a schedule, below), and the machine was not busy "
            "with other work during the slow steps (system table CPU ≥ busy_cpu_percent and 20 "
            "points above its median, or other processes using ≥ others_cores cores then) — "
            "unless the stall is the training's own: its slow steps come exactly N steps apart, "
            "or the process's own CPU fell below half its median during them. Steps where the "
            "recorder computed full statistics or profiled are not judged. When the outliers cost"
            " ≥ min_excess_s, the message says when most of their extra time was data wait, and "
            "when 4 or more come exactly N steps apart with more than half of that phase's steps "
            "slow (dated then at the first of them; below that they cost nothing that matters, "
            "and a few ms of periodic noise, such as the recorder's writer waking every 64 queued"
            " items on a 2-core machine, is no schedule of the training's to report).",
    "fixes": "Look at what runs on those steps: checkpointing, evaluation, logging with "
             ".item(), Python GC (gc.freeze), dataloader worker restarts, thermal/other jobs.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    best = None
    knobs = ctx.run.meta.get("knobs") or {}
    for r, d in _data.steps(ctx).items():
        rule = outliers(d["step"], d["duration_s"], knobs, th)
        if rule is None:
            continue
        sel = rule["sel"]
        dur, step = d["duration_s"][sel], d["step"][sel]
        med, sigma = rule["med"], rule["sigma"]
        out = rule["mask"][sel]
        if not out.any():
            continue
        excess = float((dur[out] - med).sum())
        share = excess / float(dur.sum())
        if best is None or share > best["share"]:
            ends = d["time"][sel][out]
            best = {"rank": r, "share": share, "excess": excess, "med": med, "sigma": sigma,
                    "steps": step[out], "durs": dur[out], "ends": ends, "all_steps": step,
                    "threshold": rule["threshold"],
                    "waits": _extra_wait(d["data_wait_s"][sel], out)}
    if best is None:
        return []
    # what the slow steps have in common, when they cost something that matters: a second
    # in all, or (a schedule of them, however short the run) warn_time_share of its time; a
    # few ms every 64 steps (the recorder's writer waking on a 2-core machine) are neither
    cause, sched = _cause(best)
    if best["excess"] < th.min_excess_s and (
            sched is None or best["share"] < th.warn_time_share):
        cause, sched = "", None
    period = sched[0] if sched is not None else None
    # A stall that keeps a schedule (every N steps) or during which this process idled
    # is the training's own, whatever else the machine was doing (issue 45, item 6).
    busy = (None if period is not None else
            _machine_busy(ctx, best, th.busy_cpu_percent, float(th.others_cores)))
    # (a schedule of at least 4 costly stalls is no noise: its share of the run decides,
    # however short the run; stray slow steps must also cost min_excess_s)
    sev = ("warning" if best["share"] >= th.warn_time_share
           and (best["excess"] >= th.min_excess_s or sched is not None)
           and busy is None else "info")
    n = len(best["steps"])
    i = int(np.argmax(best["durs"]))
    # a schedule leads: dated at its first slow step, counted apart from stray slow steps
    on = (best["steps"] % sched[0] == sched[1]) if sched is not None else \
        np.ones(n, dtype=bool)
    first = int(best["steps"][on][0])
    title = (f"{int(on.sum())} stalls every {sched[0]} steps" if sched is not None else
             f"{n} slow step{'s' if n > 1 else ''}")
    return [Finding(
        id=ID, severity=sev, subject=f"rank {best['rank']}", first_step=first,
        title=f"{title} (up to {best['durs'][i] / best['med']:.1f}× the median)",
        message=(f"{n} step(s) on rank {best['rank']} took far longer than the median "
                 f"{1e3 * best['med']:.1f} ms (the slowest, step {int(best['steps'][i])}, "
                 f"took {1e3 * best['durs'][i]:.0f} ms); together they cost "
                 f"{best['excess']:.1f} s ({100 * best['share']:.1f}% of the run)." + cause
                 + (f" The machine was busy with other work meanwhile (CPU {busy[0]:.0f}% "
                    f"during the slow steps, {busy[1]:.0f}% typically): likely not the "
                    "training's own stall." if busy is not None else "")),
        advice=DOC["fixes"], chart=anchors.STEP_TIME,
        evidence={"count": n, "outlier_steps": [int(s) for s in best["steps"][:20]],
                  "median_s": best["med"], "robust_sigma_s": best["sigma"],
                  "threshold_s": best["threshold"],
                  "max_s": float(best["durs"][i]), "excess_s": best["excess"],
                  "time_share": best["share"], "rank": best["rank"],
                  "extra_data_wait_s": best["waits"], "period_steps": period,
                  "machine_cpu_pct_during": busy[0] if busy else None})]


def _extra_wait(wait: np.ndarray, out: np.ndarray) -> float | None:
    """How much longer the slow steps waited for their batch than the typical step did
    (seconds, summed); None where the run has no data-wait times."""
    if not np.isfinite(wait[out]).any() or not np.isfinite(wait[~out]).any():
        return None
    typical = float(np.nanmedian(wait[~out]))
    return float(np.nansum(np.maximum(wait[out] - typical, 0.0)))


def _cause(best: dict[str, Any]) -> tuple[str, tuple[int, int] | None]:
    """What the slow steps have in common, as a sentence (or ""), and their period: where
    most of their extra time was spent waiting for the batch, the input pipeline stalled,
    not the model; where 4 or more come exactly N steps apart, the cause is periodic (a
    stall every epoch or every N steps is a schedule, not chance)."""
    sched = _period(best["steps"], best["durs"] - best["med"], best["all_steps"])
    period = sched[0] if sched is not None else None
    data = best["waits"] is not None and best["waits"] >= 0.5 * best["excess"]
    text = ""
    if data:
        text += (f" {best['waits']:.1f} s of it was spent waiting for the next batch: the "
                 "input pipeline stalled there, not the model.")
    if sched is not None:
        on = best["steps"][best["steps"] % period == sched[1]]
        text += (f" {len(on)} of them come every {period} steps (from step {int(on[0])})")
        text += (": likely the DataLoader restarting at each epoch (its worker processes "
                 "start again unless persistent_workers=True, and the first batches load "
                 "before training goes on), or a periodic job that reads data." if data else
                 ": a periodic cause (a checkpoint, an evaluation or logging every "
                 f"{period} steps, or the epoch boundary).")
    return text, sched


FAMILY = 10.0
"""Slow steps whose excess time is within this factor of the costliest are one family (what
a schedule would be made of): loss_spike's DOMINANT, for time."""


def _period(steps: np.ndarray, excess: np.ndarray, judged: np.ndarray | None = None
            ) -> tuple[int, int] | None:
    """(N, phase) when the slow steps keep a schedule: MIN_CYCLES (4) or more of them on one
    phase of a period N (a gap between two of them), holding at least two thirds of
    their excess time, and keeping the appointment: more than half of the ``judged``
    steps on that phase, from its first slow one to its last, are slow
    (stats/periodic.py's principle: a design shows in most cycles; a 300 ms checkpoint
    every 50 steps among noise-slow steps is every 50, not "every 2" because half the
    odd steps are slow too). A stray slow step between them (a busy machine) does not
    break the schedule."""
    steps, excess = np.asarray(steps, dtype=np.int64), np.asarray(excess, dtype=np.float64)
    judged = steps if judged is None else np.asarray(judged, dtype=np.int64)
    # the costly family: a checkpoint's or an evaluation's stalls are within an order of
    # magnitude of each other; a busy machine's 2-5x slow steps, ~100x smaller, are another
    # family, and their many small excesses must not dilute the schedule's share
    if len(excess):
        fam = excess >= float(np.max(excess)) / FAMILY
        steps, excess = steps[fam], excess[fam]
    if len(steps) > 200:  # (bounded work: the 200 costliest, in step order)
        keep = np.sort(np.argsort(excess)[-200:])
        steps, excess = steps[keep], excess[keep]
    total = float(np.sum(excess))
    best: tuple[float, int] | None = None
    # candidate periods: the gaps between consecutive slow steps, and between any two of
    # the 20 costliest (noise-slow steps between two checkpoints hide their gap otherwise)
    top = np.sort(steps[np.argsort(excess)[-20:]])
    gaps = {int(g) for g in np.diff(steps) if g > 1} | {
        int(b - a) for i, a in enumerate(top) for b in top[i + 1:] if b - a > 1}
    for gap in sorted(gaps):
        for phase in {int(s) % gap for s in steps}:
            on = steps % gap == phase
            share = float(np.sum(excess[on])) / total if total > 0 else 0.0
            if on.sum() < MIN_CYCLES or share < 2 / 3:
                continue
            lo, hi = int(steps[on][0]), int(steps[on][-1])
            cycles = int(np.sum((judged % gap == phase) & (judged >= lo) & (judged <= hi)))
            # the appointment best kept (the share of its cycles that were slow), then the
            # most time explained: every 50, not every 25 because one noise-slow step sits
            # between two checkpoints
            key = (int(on.sum()) / max(cycles, 1), share)
            if 2 * int(on.sum()) > cycles and (best is None or key > best[0]):
                best = (key, (gap, phase))
    return best[1] if best is not None else None


def _machine_busy(ctx: Context, best: dict[str, Any], limit: float, others_cores: float
                  ) -> tuple[float, float] | None:
    """(machine CPU % during the slow steps, typical machine CPU %) when other work kept the
    machine busy then (system table, sampled in the background); None otherwise."""
    cores = ctx.run.meta.get("cpu_count")
    cores = cores if isinstance(cores, int) and cores > 0 else None
    ends = [float(t) for t in best["ends"] if np.isfinite(t)]
    if not ends:
        return None
    starts = [t - float(d) - 1.0 for t, d in zip(ends, best["durs"], strict=False)]
    cond = " OR ".join("(time BETWEEN ? AND ?)" for _ in ends[:200])
    params: list[Any] = [best["rank"]]
    for a, b in zip(starts[:200], ends[:200], strict=False):
        params += [a, b + 1.0]
    during, others, proc = ctx.rows(
        f"SELECT avg(cpu_percent), avg(cpu_percent - proc_cpu_percent / {cores or 1}), "
        f"avg(proc_cpu_percent) FROM system WHERE rank = ? AND ({cond})", params)[0]
    typical, proc_typical = ctx.rows(
        "SELECT median(cpu_percent), median(proc_cpu_percent) FROM system WHERE rank = ?",
        [best["rank"]])[0]
    if during is None or typical is None:
        return None
    if proc is not None and proc_typical and proc < 0.5 * proc_typical:
        return None  # the training process itself went idle: its own stall (I/O, a lock)
    if during >= limit and during >= typical + 20.0:
        return float(during), float(typical)
    if cores is not None and others is not None and others * cores / 100.0 >= others_cores:
        return float(during), float(typical)
    return None
