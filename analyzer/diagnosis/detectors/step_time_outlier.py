"""step_time_outlier: steps far slower than the typical step (median/MAD)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...stats import hostwait
from ...stats.periodic import MIN_CYCLES
from ...stats.robust import stands_apart
from ...stats.steptime import outliers
from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _data, _machine, _slowdown
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
            "unless the excess time of the training's own slow steps is ≥ warn_time_share of "
            "the total and ≥ min_excess_s seconds (or they keep a schedule, below). Whose a "
            "slow step is: a stall that keeps a schedule is the training's own; otherwise, "
            "from the recorder's per-step host figures (steps.cpu_queue_s, Linux), a step is "
            "the machine's when its training thread waited for a free CPU, beyond the run's "
            "usual share of such waiting, for ≥ a quarter of its excess time (other processes "
            "held the CPUs), and the training's own otherwise (its own CPU work when "
            "steps.cpu_s grew with it, idle by itself when it did not: I/O, a lock, a child "
            "process, the device). Runs without those figures: the machine was busy when the "
            "system table's CPU during the slow steps was ≥ busy_cpu_percent and 20 points "
            "above its median, or other processes used ≥ others_cores cores then, unless the "
            "process's own CPU fell below half its median. Steps where the recorder computed "
            "full statistics or profiled are not judged. When the outliers cost ≥ "
            "min_excess_s, the message says when most of their extra time was data wait, and "
            "when 4 or more come exactly N steps apart with more than half of that phase's "
            "steps slow (dated then at the first of them; below that they cost nothing that "
            "matters, and a few ms of periodic noise, such as the recorder's writer waking "
            "every 64 queued items on a 2-core machine, is no schedule of the training's to "
            "report). Not stalls, at info: slow steps in a continuum with the ordinary ones (their "
            "relative excesses break nowhere by APART between them and the largest ordinary "
            "step: work that varies, such as long sequences; not one of the training's own "
            "through which its CPU time grew by less than WORK_SHARE of the excess: it sat "
            "idle, a stall wherever it sits) and a schedule through which "
            "the process's CPU time grew by at least WORK_SHARE of the excess (an "
            "evaluation every N steps) until that schedule's extra time is WORK_DOMINATES (half) "
            "of the run's step time or more (warning: the run spends as long on it as on "
            "training). The finding is dated at the first of the training's "
            "own slow steps; a schedule at its first cycle, also one that fell on a step the "
            "recorder's own work kept from being judged (at least half as slow as its "
            "mildest stall). A second finding: where each step's token count is recorded, "
            "seconds per token that shift up by SLOWER (2x) or more and stay so to the end "
            "(a median split, each side >= 5% of the steps) — the run slowed down (warning; "
            "info when the training thread waited for a CPU through the extra time); "
            "without token counts a curriculum and a slowdown look alike, and nothing is "
            "said.",
    "fixes": "Look at what runs on those steps: checkpointing, evaluation, logging with "
             ".item(), Python GC (gc.freeze), dataloader worker restarts, thermal/other jobs.",
}


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    knobs = ctx.run.meta.get("knobs") or {}
    rules = {r: outliers(d["step"], d["duration_s"], knobs, th)
             for r, d in _data.steps(ctx).items()}
    slow: list[Finding] = []
    for r, d in _data.steps(ctx).items():
        sd = None if rules[r] is None else _slowdown.slowdown(
            d["step"], d["duration_s"], d["tokens_per_s"], d["cpu_queue_s"], d["cpu_s"],
            rules[r]["sel"])
        if sd is not None and (not slow or sd["factor"] > slow[0].evidence["slowdown_factor"]):
            slow = [_slowdown.finding(ID, r, sd)]
    return _outliers(ctx, th, rules) + slow


def _outliers(ctx: Context, th: Thresholds, rules: dict[int, Any]) -> list[Finding]:
    """The slow steps' finding (one, the rank whose slow steps cost the largest share)."""
    best = None
    for r, d in _data.steps(ctx).items():
        rule = rules[r]
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
            host = hostwait.split(dur, hostwait.rebook(d["duration_s"], d["cpu_queue_s"])[sel],
                                  d["cpu_s"][sel], out, med)
            best = {"rank": r, "share": share, "excess": excess, "med": med, "sigma": sigma,
                    "steps": step[out], "durs": dur[out], "ends": ends, "all_steps": step,
                    "threshold": rule["threshold"], "total": float(dur.sum()),
                    "tail": _tail(dur, out, med, host),
                    "unjudged": _unjudged(d["step"], d["duration_s"], sel, th),
                    "waits": _extra_wait(d["data_wait_s"][sel], out), "host": host}
    if best is None:
        return []
    # what the slow steps have in common, when they cost something that matters: a second
    # in all, or (a schedule of them, however short the run) warn_time_share of its time; a
    # few ms every 64 steps (the recorder's writer waking on a 2-core machine) are neither
    cause, sched = _cause(best)
    if best["excess"] < th.min_excess_s and (
            sched is None or best["share"] < th.warn_time_share):
        cause, sched = "", None
    n = len(best["steps"])
    # a schedule leads: dated at its first slow step, counted apart from stray slow steps
    on = (best["steps"] % sched[0] == sched[1]) if sched is not None else \
        np.ones(n, dtype=bool)
    # Whose the slow steps are (issue 45, item 6): a stall that keeps a schedule (every N
    # steps) is the training's own, whatever else the machine was doing; so is one during
    # which its thread did not wait for a CPU (recorded per step: stats/hostwait.py). Runs
    # without those figures fall back on the 1 s system samples.
    host, busy = best["host"], None
    own = np.ones(n, dtype=bool)
    if host is not None:
        own = ~host["machine"] | (on if sched is not None else np.zeros(n, dtype=bool))
    elif sched is None:
        busy = _machine.busy(ctx, best, th.busy_cpu_percent, float(th.others_cores))
    # What the training's own slow steps were (#45, item 2): stray ones in a continuum with
    # its ordinary steps are its work varying (long sequences, big graphs), a schedule of
    # its own CPU work is work it was asked to do (an evaluation); neither is a stall
    tail = best["tail"] & ~(on if sched is not None else np.zeros(n, dtype=bool))
    work = (sched is not None and host is not None and (hostwait.cpu_share_of(
        host["cpu_busy"], host["excess"], on & own) or 0.0) >= WORK_SHARE)
    # ... until it takes as long as the training itself: scheduled work costing at least
    # WORK_DOMINATES of the run is no detail of the loop's design any more
    work_share = (float((best["durs"][on & own] - best["med"]).sum()) / best["total"]
                  if work else 0.0)
    dominant = work and work_share >= WORK_DOMINATES
    counted = own & ~tail & ~(on if work and not dominant else np.zeros(n, dtype=bool))
    own_excess = float((best["durs"][counted] - best["med"]).sum())
    own_share = own_excess / best["total"]
    # (a schedule of at least 4 costly stalls is no noise: its share of the run decides,
    # however short the run; stray slow steps must also cost min_excess_s)
    sev = ("warning" if counted.any() and own_share >= th.warn_time_share
           and (own_excess >= th.min_excess_s or (sched is not None and not work)
                or dominant)
           and busy is None else "info")
    i = int(np.argmax(best["durs"]))
    # the finding is dated at the first stall of the costly family among the training's
    # own (within FAMILY of the costliest): a 6 ms blip as it starts a process is its own
    # too, but not the 0.5 s stalls the finding is about
    ex = best["durs"] - best["med"]
    fam = counted & (ex >= (float(ex[counted].max()) / FAMILY if counted.any() else 0.0))
    lead = (on & own if sched is not None and (on & own).any() else
            fam if fam.any() else own & tail if (own & tail).any() else on)
    first = int(best["steps"][lead][0])
    if sched is not None:  # (a cycle inside the recorder's own busy steps, before it)
        first = _earlier_cycle(best, sched, on & own, first)
    k, m = int(fam.sum()), n - int(own.sum())
    title = (f"{int(on.sum())} slow steps every {sched[0]} steps: the training's scheduled "
             "work" + (f", {100 * work_share:.0f}% of the run" if dominant else "") if work else
             f"{int(on.sum())} stalls every {sched[0]} steps" if sched is not None else
             f"{k} slow step{'s' if k > 1 else ''}" if k else
             f"{int((own & tail).sum())} slow step{'s' if (own & tail).sum() > 1 else ''}: "
             "the step time's own heavy tail"
             if (own & tail).any() else
             f"{n} slow step{'s' if n > 1 else ''} while the machine was busy")
    j = int(np.argmax(np.where(fam if k else lead, best["durs"], -1.0)))
    return [Finding(
        id=ID, severity=sev, subject=f"rank {best['rank']}", first_step=first,
        title=f"{title} (up to {best['durs'][j] / best['med']:.1f}× the median)",
        message=(f"{n} step(s) on rank {best['rank']} took far longer than the median "
                 f"{1e3 * best['med']:.1f} ms (the slowest, step {int(best['steps'][i])}, "
                 f"took {1e3 * best['durs'][i]:.0f} ms); together they cost "
                 f"{best['excess']:.1f} s ({100 * best['share']:.1f}% of the run)." + cause
                 + _whose(host, own, float(ex[own].sum()))
                 + _design(int((own & tail).sum()), int((on & own).sum()) if work else 0,
                           work_share if dominant else None)
                 + (f" The machine was busy with other work meanwhile (CPU {busy[0]:.0f}% "
                    f"during the slow steps, {busy[1]:.0f}% typically): likely not the "
                    "training's own stall." if busy is not None else "")),
        advice=(DOC["fixes"] if counted.any() or not ((own & tail).any() or work) else
                "Nothing to fix if the work varies like this: bucketing batches by length "
                "evens the steps out; an evaluation every N steps costs what it costs."),
        chart=anchors.STEP_TIME,
        evidence={"count": n, "outlier_steps": [int(s) for s in best["steps"][:20]],
                  "own_steps": [int(s) for s in best["steps"][counted][:20]],
                  "own_excess_s": own_excess, "machine_count": m,
                  "tail_count": int((own & tail).sum()), "scheduled_work": bool(work),
                  "cpu_wait_share": host["wait_share"] if host else None,
                  "median_s": best["med"], "robust_sigma_s": best["sigma"],
                  "threshold_s": best["threshold"],
                  "max_s": float(best["durs"][i]), "excess_s": best["excess"],
                  "time_share": best["share"], "rank": best["rank"],
                  "extra_data_wait_s": best["waits"],
                  "period_steps": sched[0] if sched is not None else None,
                  "machine_cpu_pct_during": busy[0] if busy else None})]


def _design(tail: int, work: int, dominant: float | None = None) -> str:
    """The sentence on the slow steps that are the training's work, not stalls
    (``dominant``: the scheduled work's share of the run, where it reached WORK_DOMINATES)."""
    text = ""
    if tail:
        text += (f" {tail} of them sit in a continuum with the ordinary steps (no break of "
                 f"{APART:.0f}x between them and the rest): steps that did more work (long "
                 "sequences, large graphs or batches), not stalls.")
    if work and dominant is not None:
        text += (f" The process worked on the CPU through the {work} scheduled ones, and "
                 f"that work took {100 * dominant:.0f}% of the run's time: more than the "
                 "training's own steps, so the run would take less than half as long "
                 "without it. Make it rarer or cheaper, or move it off the training "
                 "thread.")
    elif work:
        text += (f" The process worked on the CPU through the {work} scheduled ones: work "
                 "the loop does on purpose (an evaluation, serialising a checkpoint), at "
                 "info; make it rarer or cheaper if its share is too high.")
    return text


def _unjudged(step: np.ndarray, dur: np.ndarray, sel: np.ndarray, th: Thresholds
              ) -> tuple[np.ndarray, np.ndarray]:
    """(steps, durations) after warm-up that the rule did not judge: the recorder's own
    busy steps (full statistics, a profiler window)."""
    keep = ~sel & np.isfinite(dur) & (step >= (step[0] if len(step) else 0) + th.warmup_steps)
    return step[keep], dur[keep]


def _earlier_cycle(best: dict[str, Any], sched: tuple[int, int], on: np.ndarray,
                   first: int) -> int:
    """The schedule's first cycle when it fell on a step the rule did not judge (the
    recorder's profiler window took step 49 of a checkpoint every 50): an unjudged step on
    the schedule's phase, before its first judged stall, at least half as slow as the
    mildest of its stalls (a periodic job costs about the same each time; the recorder's
    own extra work, a few times the median, is far below)."""
    if not on.any():
        return first
    steps, durs = best["unjudged"]
    bar = 0.5 * float(np.min(best["durs"][on] - best["med"]))
    hit = (steps < first) & (steps % sched[0] == sched[1]) & (durs - best["med"] >= bar)
    return int(steps[hit][0]) if hit.any() else first


def _tail(dur: np.ndarray, out: np.ndarray, med: float, host: dict[str, Any] | None = None
          ) -> np.ndarray:
    """Over the slow steps: those in a continuum with the ordinary ones (their excess over
    the median, relative to it, breaks nowhere by APART between them and the largest
    ordinary step): the step time's own heavy tail, not stalls. A step that did more work
    computed more: one of the training's own (``host``: not the machine's) through which
    the process's CPU time grew by less than WORK_SHARE of its excess sat idle (a lock,
    blocking I/O) and is a stall, wherever it sits (a busy machine's 2-400 ms steps bridged
    3 ms steps and a snapshot thread's 0.5 s lock waits into one continuum)."""
    rel = (dur - med) / max(med, 1e-12)
    floor = float(np.max(rel[~out])) if (~out).any() else 0.0
    tail = ~stands_apart(rel[out], rel, floor, APART)
    if host is not None:
        with np.errstate(invalid="ignore"):
            idle = ~host["machine"] & (host["cpu_busy"] < WORK_SHARE)
        tail &= ~idle
    return tail


def _whose(host: dict[str, Any] | None, own: np.ndarray, own_excess: float) -> str:
    """The sentence on whose the slow steps are, from the per-step host figures."""
    if host is None:
        return ""
    m = int((~own).sum())
    text = ""
    if m:
        text += (f" {'All' if not own.any() else m} of them came while other processes held "
                 "the CPUs (the training thread waited for a free CPU for "
                 f"{100 * (host['wait_share'] or 0.0):.0f}% of their extra time): not the "
                 "training's own stall" + ("." if not own.any() else
                                           f"; the other {int(own.sum())} "
                                           f"{'is' if own.sum() == 1 else 'are'} its own "
                                           f"({own_excess:.1f} s)."))
    if own.any():
        text += hostwait.own_kind(host["own_cpu_share"])
    return text


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


APART = 5.0
"""A slow step stands apart from the step time's own tail when the sorted relative excesses
break by this factor between it and the largest ordinary step (loss_spike's APART: one rule
for a series' heavy tail). Steps whose work varies (Pareto sequence lengths, power-law graph
sizes, padded long-tail batches) run on in steps of under 2x among their slowest (the
held-out GRU LM, transformer and GCN runs); a stall (a blocked write, a 1 s I/O hiccup among
20 ms steps) sits tens of times beyond them."""
WORK_SHARE = 0.5
"""A schedule of slow steps is the training's own scheduled work when the process's CPU time
grew by at least this share of their excess (hostwait's own_kind line: an evaluation
computes; a blocking checkpoint write or a sleep sits idle, ~0)."""
WORK_DOMINATES = 0.5
"""Scheduled work is reported (warning) once its extra time is at least this share of the
run's step time: the loop then spends as long on it as on training, and the run would take
under half as long without it. Below that, an evaluation or a checkpoint every N steps is
the loop's design and its cost the user's choice (the held-out evaluation every 37 steps at
27% of a run, a checkpoint every 30 at 40%); a pure-Python debug index rebuilt every 30
steps took 85-90%."""
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
