"""A run that slows down for good (issue 45, item 1): a loop that starts doing extra work
every step (validation by a misplaced condition, a hook left on) makes no step an outlier:
every step from then on is slower. Where the recorder has each step's token count, the time
per token shifts up and stays: step_time_outlier says so, dated at the shift. A curriculum
whose steps grow with their tokens is no slowdown; without token counts nothing is said (a
curriculum and a bug look alike); other processes taking the CPUs make it the machine's."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400


def _slowdowns(tmp_path, dur, tokens, cpu=None, queue=None, with_tokens=True):
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N),
                   cpu=dur if cpu is None else cpu,
                   cpu_queue=np.zeros(N) if queue is None else queue,
                   tokens_per_s=tokens / dur if with_tokens else None)
    return [f for f in build_summary(run)["findings"]
            if f["id"] == "step_time_outlier" and f["evidence"].get("slowdown")]


def _steps(rng: np.random.Generator, tokens: np.ndarray) -> np.ndarray:
    return (0.002 + 4e-5 * tokens) * np.exp(rng.normal(0, 0.12, N))


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("onset", [40, 200, 340])
@pytest.mark.parametrize("factor", [2.3, 4.0])
def test_extra_work_every_step_from_a_step_is_a_slowdown(tmp_path, seed, onset, factor):
    rng = np.random.default_rng(seed)
    tokens = np.full(N, 1024.0)
    dur = _steps(rng, tokens)
    dur[onset:] *= factor
    hits = _slowdowns(tmp_path, dur, tokens)
    assert len(hits) == 1 and hits[0]["severity"] == "warning", hits
    assert abs(hits[0]["first_step"] - onset) <= 1, hits[0]["first_step"]
    assert hits[0]["evidence"]["slowdown_factor"] == pytest.approx(factor, rel=0.15)


@pytest.mark.parametrize("seed", range(3))
def test_a_curriculum_whose_steps_grow_with_their_tokens_is_none(tmp_path, seed):
    """Sequence length x2 at 130 and x4 at 260: steps 2-4x slower, time per token flat."""
    rng = np.random.default_rng(10 + seed)
    tokens = np.where(np.arange(N) < 130, 512.0, np.where(np.arange(N) < 260, 1024.0, 2048.0))
    assert _slowdowns(tmp_path, _steps(rng, tokens), tokens) == []


@pytest.mark.parametrize("seed", range(3))
def test_without_token_counts_nothing_is_said(tmp_path, seed):
    rng = np.random.default_rng(20 + seed)
    tokens = np.full(N, 1024.0)
    dur = _steps(rng, tokens)
    dur[200:] *= 3.0
    assert _slowdowns(tmp_path, dur, tokens, with_tokens=False) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_slow_spell_that_ends_is_no_slowdown(tmp_path, seed):
    """Steps 150-249 three times slower, then back: not slower to the end."""
    rng = np.random.default_rng(30 + seed)
    tokens = np.full(N, 1024.0)
    dur = _steps(rng, tokens)
    dur[150:250] *= 3.0
    assert _slowdowns(tmp_path, dur, tokens) == []


@pytest.mark.parametrize("seed", range(3))
def test_other_processes_taking_the_cpus_make_it_the_machines(tmp_path, seed):
    """From step 200 another job takes the CPUs: the thread waits in the run queue for
    most of the extra time; the slowdown is reported at info."""
    rng = np.random.default_rng(40 + seed)
    tokens = np.full(N, 1024.0)
    work = _steps(rng, tokens)
    dur, queue = work.copy(), np.zeros(N)
    queue[200:] = work[200:] * 2.0  # (contention 2/3: wall time = work / (1 - 2/3))
    dur[200:] += queue[200:]
    hits = _slowdowns(tmp_path, dur, tokens, cpu=work, queue=queue)
    assert len(hits) == 1 and hits[0]["severity"] == "info", hits
