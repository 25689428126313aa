"""Slow steps that are the training's work, not stalls (issue 45, item 2): a step time whose
work varies by design (Pareto sequence lengths, power-law graph sizes) has a heavy tail that
runs on without a break from the ordinary steps; an evaluation every N steps is scheduled
work the process computes through. Both are reported at info, the scheduled work until it
takes half the run's time. A stall — the training thread
blocked, idle, far beyond every ordinary step — is still a warning, with a heavy tail or a
schedule of work beside it.

Runs are simulated from a step's cost: a fixed overhead plus a cost per token, with
log-normal jitter; the process's CPU time is the work it did (a blocked stall adds none).
"""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.stats.robust import stands_apart

from tests.runfactory import make_run

N = 400


def _work(rng: np.random.Generator, lengths: str) -> np.ndarray:
    """Seconds of CPU work per step: 4 ms + 40 µs per token, tokens per batch heavy-tailed."""
    if lengths == "pareto":  # 6 x Pareto(1.2), capped at 300 tokens: most 7-20, ~3% > 100
        tokens = np.minimum(6 * (1 + rng.pareto(1.2, N)), 300) * 4
    else:  # log-normal lengths, sigma 1.1
        tokens = rng.lognormal(np.log(60), 1.1, N)
    return (0.004 + 4e-5 * tokens) * np.exp(rng.normal(0, 0.05, N))


def _finding(tmp_path, dur, cpu):
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N), cpu=cpu,
                   cpu_queue=np.zeros(N))
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier"]
    return hits[0] if hits else None


def _stray(rng: np.random.Generator, k: int) -> list[int]:
    return sorted(int(s) for s in rng.choice(np.arange(20, N - 5), k, replace=False))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lengths", ["pareto", "lognormal"])
def test_steps_whose_work_varies_are_the_step_times_own_tail(tmp_path, seed, lengths):
    """Long batches take up to ~10x the median step, in a continuum with the rest: info."""
    rng = np.random.default_rng(seed)
    work = _work(rng, lengths)
    f = _finding(tmp_path, work, work)
    assert f is not None, "the slow steps are still reported"
    assert f["severity"] == "info", f
    assert "heavy tail" in f["title"] and f["evidence"]["tail_count"] > 0, f


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("lengths", ["pareto", "lognormal"])
def test_stalls_beside_a_heavy_tail_are_still_a_warning(tmp_path, seed, lengths):
    """Four 1.5 s blocked stalls (a hung file system) at irregular steps, among the same
    heavy-tailed work: a warning about them, dated at the first, the tail counted apart."""
    rng = np.random.default_rng(20 + seed)
    work = _work(rng, lengths)
    at = _stray(rng, 4)
    dur = work.copy()
    dur[at] += 1.5
    f = _finding(tmp_path, dur, work)
    assert f is not None and f["severity"] == "warning", f
    assert f["first_step"] == at[0] and f["evidence"]["own_steps"][:4] == at, f["evidence"]
    assert f["title"].startswith("4 slow steps"), f["title"]


def _evaluation(rng: np.random.Generator, every: int, seconds: float, blocked: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    work = 0.01 * np.exp(rng.normal(0, 0.08, N))
    dur, cpu = work.copy(), work.copy()
    on = np.arange(every - 1, N, every)
    dur[on] += seconds
    if not blocked:
        cpu[on] += seconds * rng.uniform(0.9, 1.0, len(on))
    return dur, cpu


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("every", [37, 80])
def test_an_evaluation_every_n_steps_is_scheduled_work(tmp_path, seed, every):
    """0.25 s of computing every N steps (24-38% of the run's time): the loop's design, info,
    dated at its first, the period named."""
    rng = np.random.default_rng(40 + seed)
    dur, cpu = _evaluation(rng, every, 0.25, blocked=False)
    f = _finding(tmp_path, dur, cpu)
    assert f is not None and f["severity"] == "info", f
    assert f["evidence"]["scheduled_work"] and f["evidence"]["period_steps"] == every
    assert f["first_step"] == every - 1 and "scheduled work" in f["title"], f


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("seconds", [0.6, 2.0])
def test_scheduled_work_that_outlasts_the_training_is_a_warning(tmp_path, seed, seconds):
    """The same evaluation every 37 steps, costing 0.6 s or 2 s (60% or 83% of the run's
    time): the run spends longer on it than on training, a warning that says its share."""
    rng = np.random.default_rng(80 + seed)
    dur, cpu = _evaluation(rng, 37, seconds, blocked=False)
    f = _finding(tmp_path, dur, cpu)
    assert f is not None and f["severity"] == "warning", f
    assert f["evidence"]["scheduled_work"] and f["first_step"] == 36, f
    share = (dur - np.median(dur)).clip(0)[36::37].sum() / dur.sum()
    assert f"{100 * share:.0f}% of the run" in f["title"], (share, f["title"])


@pytest.mark.parametrize("seed", range(3))
def test_an_idle_stall_every_n_steps_is_the_trainings_own(tmp_path, seed):
    """The same schedule with the process idle (a blocking checkpoint write): a warning."""
    rng = np.random.default_rng(60 + seed)
    dur, cpu = _evaluation(rng, 50, 0.25, blocked=True)
    f = _finding(tmp_path, dur, cpu)
    assert f is not None and f["severity"] == "warning", f
    assert not f["evidence"]["scheduled_work"] and f["first_step"] == 49
    assert "stalls every 50 steps" in f["title"], f["title"]


@pytest.mark.parametrize("seed", range(3))
def test_stray_stalls_beside_an_evaluation_schedule_are_a_warning(tmp_path, seed):
    """An evaluation every 40 steps (info by itself) and three 2 s blocked stalls elsewhere:
    the stalls cost the run a tenth of its time, and are warned about."""
    rng = np.random.default_rng(80 + seed)
    dur, cpu = _evaluation(rng, 40, 0.2, blocked=False)
    at = [s for s in _stray(rng, 6) if s % 40 != 39][:3]
    dur[at] += 2.0
    f = _finding(tmp_path, dur, cpu)
    assert f is not None and f["severity"] == "warning", f


@pytest.mark.parametrize("seed", range(3))
def test_a_schedules_first_cycle_inside_the_profiler_window_dates_it(tmp_path, seed):
    """A blocking checkpoint every 50 steps whose first cycle (step 49) falls in the
    recorder's profiler window (warm-up 49, active 50-51, export 52; not judged): the
    schedule is dated at 49, not at its first judged cycle, 99. The window's own slower
    steps (a few times the median) are no cycle of it."""
    rng = np.random.default_rng(100 + seed)
    dur = 0.06 * np.exp(rng.normal(0, 0.08, N))
    cpu = dur.copy()
    dur[[50, 51]] *= 1.6
    dur[52] += 0.11  # the trace export
    on = np.arange(49, N, 50)
    dur[on] += 1.5
    knobs = {"profile_start": 50, "profile_warmup": 1, "profile_active": 2,
             "profile_max_windows": 5, "profile_every": 0}
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N), cpu=cpu,
                   cpu_queue=np.zeros(N), run_meta={"knobs": knobs})
    f = next(f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier")
    assert f["severity"] == "warning" and f["first_step"] == 49, f
    assert f["evidence"]["period_steps"] == 50


def test_stands_apart_is_a_break_between_the_value_and_the_ordinary():
    sizes = np.array([0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 40.0, 50.0])
    # 40 and 50 sit 13x beyond 3; 3 and 2 run on from the ordinary (floor 0.5)
    assert stands_apart(np.array([50.0, 40.0, 3.0, 2.0]), sizes, 0.5, 5.0).tolist() == [
        True, True, False, False]
    # no break at all: a continuum
    assert not stands_apart(np.array([8.0]), np.array([1.0, 2.0, 4.0, 8.0]), 1.0, 5.0).any()
    # the break may lie below the candidate (a stall family's smallest sets it apart)
    assert stands_apart(np.array([9.0]), np.array([1.0, 6.0, 9.0]), 1.0, 5.0).all()


@pytest.mark.parametrize("seed", range(3))
def test_the_machines_slow_steps_do_not_bridge_the_trainings_own_stalls(tmp_path, seed):
    """3 ms steps; 60 steps a busy machine stretched by 2-400 ms (the thread waited for a
    CPU through their extra time); three 0.5 s stalls of the training's own, idle on a lock.
    The machine's steps fill the gap between the ordinary steps and the stalls, but they are
    no part of the training's step time: the stalls stand apart from it, a warning dated at
    the first."""
    rng = np.random.default_rng(100 + seed)
    dur = 0.003 * np.exp(rng.normal(0, 0.1, N))
    cpu, queue = dur.copy(), np.zeros(N)
    busy = np.array(sorted(rng.choice(np.arange(20, N - 5), 63, replace=False)))
    own, machine = busy[[5, 15, 25]], np.delete(busy, [5, 15, 25])
    stretch = np.exp(rng.uniform(np.log(0.002), np.log(0.4), len(machine)))
    dur[machine] += stretch
    queue[machine] = 0.95 * stretch
    dur[own] += 0.5
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N), cpu=cpu,
                   cpu_queue=queue)
    (f,) = [f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier"
            and "slowed" not in f["title"]]
    assert f["severity"] == "warning", f
    assert f["evidence"]["own_steps"] == [int(s) for s in own], f["evidence"]
    assert f["first_step"] == int(own[0]) and f["evidence"]["tail_count"] == 0, f
