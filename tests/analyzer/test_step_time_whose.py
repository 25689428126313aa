"""Whose a slow step is (issue 45, item 6): from the recorder's per-step host figures
(``steps.cpu_s``, ``steps.cpu_queue_s``), a stall is the training's own when its thread did not
wait for a CPU through it — whatever the machine's load — and the machine's when it did.

The runs are simulated from the scheduler's arithmetic: a step needs ``c`` seconds of CPU;
under contention ρ (the share of time a runnable thread waits for a CPU) it takes c/(1−ρ) of
wall time, c·ρ/(1−ρ) of it in the run queue. A stall of the training's own is either CPU work
(queued at the run's contention like any work) or blocked time (never queued).
"""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.stats import hostwait

from tests.runfactory import make_run

N = 300


def _simulate(rng: np.random.Generator, rho: np.ndarray, own_cpu: dict[int, float],
              own_blocked: dict[int, float], spin: float = 0.0
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(duration, process CPU, run-queue wait) per step. ``spin``: the share of the
    queue wait a multi-threaded pool adds as CPU time (the main thread spinning on its
    pre-empted workers)."""
    work = 0.012 * np.exp(rng.normal(0, 0.08, N))
    for s, w in own_cpu.items():
        work[s] += w
    dur = work / (1 - rho)
    queue = work * rho / (1 - rho)
    cpu = work + spin * queue
    for s, b in own_blocked.items():
        dur[s] += b
    return dur, cpu, queue


def _finding(tmp_path, dur, cpu, queue):
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N), cpu=cpu,
                   cpu_queue=queue)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "step_time_outlier"]
    return hits[0] if hits else None


def _irregular(rng: np.random.Generator, k: int) -> list[int]:
    return sorted(int(s) for s in rng.choice(np.arange(20, N - 5), k, replace=False))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["blocked", "cpu"])
@pytest.mark.parametrize("load", [0.0, 0.5])
def test_own_irregular_stalls_are_a_warning_however_busy_the_machine(tmp_path, seed, kind,
                                                                      load):
    """Four 0.4 s stalls at irregular steps (a log on a hung filesystem; a synchronous
    checkpoint's serialisation) on a quiet machine and on one another job keeps half busy
    for the whole run: the training's own, dated at the first."""
    rng = np.random.default_rng(seed)
    at = _irregular(rng, 4)
    stalls = {s: 0.4 for s in at}
    dur, cpu, queue = _simulate(rng, np.full(N, load), stalls if kind == "cpu" else {},
                                stalls if kind == "blocked" else {})
    f = _finding(tmp_path, dur, cpu, queue)
    assert f is not None and f["severity"] == "warning", f
    assert f["first_step"] == at[0]
    assert f["evidence"]["own_steps"] == at
    what = "busy on the CPU" if kind == "cpu" else "sat idle"
    assert what in f["message"], f["message"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spin", [0.0, 0.7])
def test_a_burst_of_other_work_is_the_machines(tmp_path, seed, spin):
    """Competitors take the CPUs for 30 steps mid-run (ρ 0.6-0.8): those steps are slow, the
    training did nothing wrong — with a single thread, and with an intra-op pool whose main
    thread spins on its pre-empted workers (CPU time grows with the wait)."""
    rng = np.random.default_rng(50 + seed)
    rho = np.zeros(N)
    start = int(rng.integers(60, 200))
    rho[start:start + 30] = rng.uniform(0.6, 0.8, 30)
    dur, cpu, queue = _simulate(rng, rho, {}, {}, spin=spin)
    f = _finding(tmp_path, dur, cpu, queue)
    assert f is not None, "the slow steps are still reported (at info)"
    assert f["severity"] == "info", f
    assert f["evidence"]["own_steps"] == [] and "while the machine was busy" in f["title"]


@pytest.mark.parametrize("seed", range(4))
def test_own_stalls_after_a_busy_spell_are_dated_at_their_first(tmp_path, seed):
    """Other work slows steps 40-70; the training's own blocking stalls come later: the
    finding is about them, from the first of them, and counts the machine's apart."""
    rng = np.random.default_rng(90 + seed)
    rho = np.zeros(N)
    rho[40:70] = 0.7
    at = sorted(int(s) for s in rng.choice(np.arange(100, N - 5), 4, replace=False))
    dur, cpu, queue = _simulate(rng, rho, {}, {s: 0.4 for s in at})
    f = _finding(tmp_path, dur, cpu, queue)
    assert f["severity"] == "warning" and f["first_step"] == at[0], f
    assert f["evidence"]["own_steps"] == at
    assert f["evidence"]["machine_count"] >= 20
    assert f["title"].startswith("4 slow steps"), f["title"]


def test_split_needs_the_figures_of_every_slow_step():
    """A run recorded without run-queue figures (before they were recorded, off Linux) gives
    no split: the detector falls back on the system samples."""
    dur = np.r_[np.full(50, 0.01), 0.5]
    out = np.r_[np.zeros(50, bool), True]
    queue = np.r_[np.zeros(50), np.nan]
    assert hostwait.split(dur, queue, dur, out, 0.01) is None
    queue[-1] = 0.0
    got = hostwait.split(dur, queue, dur, out, 0.01)
    assert got is not None and not got["machine"].any()


@pytest.mark.parametrize("seed", range(3))
def test_a_small_blip_of_its_own_does_not_date_the_stalls(tmp_path, seed):
    """The loop starts a process at step 15 (a 25 ms fork, its own, 3x the step) and stalls
    0.4 s at four later steps: the finding is about the stalls, dated at the first of them."""
    rng = np.random.default_rng(130 + seed)
    at = sorted(int(s) for s in rng.choice(np.arange(60, N - 5), 4, replace=False))
    dur, cpu, queue = _simulate(rng, np.zeros(N), {15: 0.025}, {s: 0.4 for s in at})
    f = _finding(tmp_path, dur, cpu, queue)
    assert 15 in f["evidence"]["own_steps"], "the blip is the training's own too"
    assert f["first_step"] == at[0] and f["title"].startswith("4 slow steps"), f


def test_a_wait_booked_to_a_step_it_cannot_fit_moves_to_the_next():
    """A step cannot wait for a CPU longer than it lasts: a surplus (a pre-emption between
    the recorder's reads) belongs to the next step, whose wall time holds it."""
    dur = np.array([0.01, 0.003, 0.327, 0.01])
    queue = np.array([0.0, 0.324, 0.026, 0.0])
    got = hostwait.rebook(dur, queue)
    np.testing.assert_allclose(got, [0.0, 0.003, 0.347, 0.0])
    np.testing.assert_allclose(hostwait.rebook(dur, np.zeros(4)), np.zeros(4))
