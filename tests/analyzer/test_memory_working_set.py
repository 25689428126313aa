"""Memory that grew with the work is no leak (issue 45, item 2): a curriculum that doubles
the sequence length, or a batch longer than any before, raises what a step needs and the
allocator keeps that high-water mark — a staircase whose risers come where the work per step
reached a new high. memory_leak reports it at info. A leak grows whatever the work: at a
steady work per step, and inside a curriculum run too, it is still a warning or an error."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.detectors.memory_leak import discount
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400
STAGES = (100, 200, 300)


def _leaks(tmp_path, dur, heap, tokens=None):
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N), heap=heap,
                   tokens_per_s=None if tokens is None else tokens / dur)
    return [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]


def _curriculum(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, step time, heap): the length doubles at each stage; each stage's first
    steps allocate its larger buffers (1.2-1.5 MiB), which the allocator keeps."""
    s = np.arange(N)
    tokens = 256.0 * 2.0 ** np.searchsorted(STAGES, s, side="right")
    dur = (0.004 + 2e-5 * tokens) * np.exp(rng.normal(0, 0.08, N))
    heap = 1.3e8 + rng.normal(0, 2e3, N)
    for at in STAGES:
        heap[at + int(rng.integers(0, 4)):] += rng.uniform(1.2e6, 1.5e6)
    return tokens, dur, heap


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_tokens", [True, False])
def test_a_curriculums_staircase_is_the_working_set(tmp_path, seed, with_tokens):
    rng = np.random.default_rng(seed)
    tokens, dur, heap = _curriculum(rng)
    hits = _leaks(tmp_path, dur, heap, tokens if with_tokens else None)
    assert all(f["severity"] == "info" for f in hits), hits
    if hits:
        assert "working set" in hits[0]["title"], hits[0]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("onset", [0, 150])
def test_a_leak_at_a_steady_work_is_still_a_leak(tmp_path, seed, onset):
    rng = np.random.default_rng(20 + seed)
    dur = 0.01 * np.exp(rng.normal(0, 0.08, N))
    heap = 1.3e8 + rng.normal(0, 2e3, N) + np.maximum(np.arange(N) - onset, 0) * 24e3
    hits = _leaks(tmp_path, dur, heap, np.full(N, 512.0))
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits
    assert hits[0]["evidence"]["with_work_share"] < 0.5


@pytest.mark.parametrize("seed", range(4))
def test_a_leak_inside_a_curriculum_is_still_a_leak(tmp_path, seed):
    rng = np.random.default_rng(40 + seed)
    tokens, dur, heap = _curriculum(rng)
    heap += np.arange(N) * 24e3  # a kept tensor every step besides the stages' buffers
    hits = _leaks(tmp_path, dur, heap, tokens)
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits


@pytest.mark.parametrize("seed", range(4))
def test_the_longest_batch_so_far_raising_the_heap_is_the_working_set(tmp_path, seed):
    """Long-tail padded lengths: the heap rises only when a batch longer than every earlier
    one arrives (its buffers kept), by its size."""
    rng = np.random.default_rng(60 + seed)
    tokens = np.minimum(32 * (1 + rng.pareto(1.1, N)), 4096)
    dur = (0.003 + 1e-5 * tokens) * np.exp(rng.normal(0, 0.08, N))
    high = np.maximum.accumulate(tokens)
    heap = 1.3e8 + 2e3 * high + rng.normal(0, 2e3, N)
    hits = _leaks(tmp_path, dur, heap, tokens)
    assert all(f["severity"] == "info" for f in hits), hits


@pytest.mark.parametrize("seed", range(6))
def test_a_fill_through_the_profiler_window_keeps_its_steps(seed):
    """The held-out LRU run: the heap fills at ~0.5 MiB a step (each step's share varying by
    10%) through the recorder's profiler window at 49-51, which kept 35 KiB, within the
    fill's step-to-step spread; once full, an eviction frees 20 KiB. The profiler kept no
    level that stands out of the fill's own changes, so no later fall is "the recorder
    freeing it": the fill's steps are all read (the old discount dropped steps 49-241, the
    whole fill, and the run was read as a leak from step 390)."""
    rng = np.random.default_rng(80 + seed)
    s = np.arange(N)
    heap = 1.4e8 + np.cumsum(np.where(s < 210, 0.5e6, 0.0) * rng.uniform(0.9, 1.1, N))
    heap[50:] += 35e3
    heap[242:] -= 2e4
    kept_steps, _ = discount(s, heap, [(49, 51)])
    assert np.setdiff1d(s, kept_steps).tolist() == list(range(49, 62))  # (the window, settling)


@pytest.mark.parametrize("seed", range(4))
def test_a_leaks_passing_fall_is_not_the_recorder_freeing_its_profiler(seed):
    """The held-out hook-per-step leak: the profiler window at 49-51 left 160 KiB, the leak
    (73 KiB a step from step 100) later grew a list into a new block, +465 KiB then -225 KiB,
    380 steps on. That fall is half the profiler's level but the heap is back above it at
    the next step: not the recorder freeing its trace. Read as one, the discount dropped
    steps 49-431 and the leak's growth read as "the working set" of slower steps."""
    rng = np.random.default_rng(95 + seed)
    s = np.arange(N)
    heap = 1.27e8 + rng.normal(0, 500, N) + 73e3 * np.clip(s - 99, 0, None)
    heap[50:] += 160e3
    heap[431:] += 465e3
    heap[432:] -= 225e3
    kept_steps, _ = discount(s, heap, [(49, 51)])
    assert np.setdiff1d(s, kept_steps).tolist() == list(range(49, 62))
    # a fall that stays down is the recorder's: the steps that held its level are skipped
    freed = 1.27e8 + rng.normal(0, 500, N)
    freed[50:] += 160e3
    freed[90:] -= 160e3
    kept_steps, _ = discount(s, freed, [(49, 51)])
    assert np.setdiff1d(s, kept_steps).tolist() == list(range(49, 90))


@pytest.mark.parametrize("seed", range(4))
def test_a_fall_in_the_last_steps_is_not_shown_to_be_the_recorders_free(seed):
    """The held-out protein classifier: the profiler window at 49-51 left 110 KiB, a leak of
    ~120 KiB a step from step 200, and a fall of 250 KiB five steps before the end that the
    run's last steps cannot show to stay down (SETTLE of them). Taken for the recorder's
    free, it dropped steps 49-414, the leak with them, and the run read as no leak."""
    rng = np.random.default_rng(110 + seed)
    s = np.arange(N)
    heap = 1.3e8 + rng.normal(0, 2e3, N) + 120e3 * np.clip(s - 199, 0, None)
    heap[50:] += 110e3
    heap[N - 5:] -= 250e3 + 120e3 * np.arange(5)  # (the last steps fall and stay there)
    kept_steps, _ = discount(s, heap, [(49, 51)])
    assert np.setdiff1d(s, kept_steps).tolist() == list(range(49, 62))


@pytest.mark.parametrize("seed", range(3))
def test_rss_growing_while_the_heap_in_use_is_flat_is_info(tmp_path, seed):
    """RSS creeps 0.4 MiB a step while malloc's heap in use, recorded beside it, is flat:
    pages the allocator keeps, or memory outside malloc, reported at info as such. With no
    heap figures (not glibc), the same RSS is still a leak."""
    rng = np.random.default_rng(90 + seed)
    rss = 4e8 + np.arange(N) * 0.4e6 + rng.normal(0, 2e5, N)
    heap = 1.4e8 + rng.normal(0, 2e4, N)
    kw = dict(steps=N, duration=0.02 * np.exp(rng.normal(0, 0.05, N)), data_wait=np.zeros(N),
              rss=rss)
    run = make_run(tmp_path, name="with_heap", heap=heap, **kw)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]
    assert len(hits) == 1 and hits[0]["severity"] == "info", hits
    assert hits[0]["subject"] == "rss_bytes" and hits[0]["evidence"]["outside_heap"]
    run = make_run(tmp_path, name="no_heap", **kw)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits


def _multiscale(rng: np.random.Generator, leak: float) -> tuple[np.ndarray, ...]:
    """A multi-scale U-Net's shape (held-out): a new, larger image size every 55 steps, kept
    until the next (its step time a new high, its buffers 2.4-16 MB kept); ``leak`` bytes
    kept every step from step 0."""
    s = np.arange(480)
    new = np.zeros(480)
    size = np.zeros(480, dtype=int)
    for k, at in enumerate(range(0, 480, 55)):
        new[at] = 1
        size[at] = k
        later = (s > at) & (s < at + 55)
        size[later] = k
    dur = (0.005 * (1 + size)) * np.exp(rng.normal(0, 0.05, 480))
    heap = 1.3e8 + rng.normal(0, 2e4, 480) + leak * s
    for k, at in enumerate(range(55, 480, 55)):
        heap[at:] += (2.4 + 1.7 * k) * 1e6
    return new, dur, heap


@pytest.mark.parametrize("seed", range(8))
def test_a_leak_between_new_sizes_is_no_working_set(tmp_path, seed):
    """Most of the growth comes with the new sizes (the working set), but between them,
    where no step needs more memory than one before it, the heap keeps rising: a leak."""
    new, dur, heap = _multiscale(np.random.default_rng(seed), 48e3)
    run = make_run(tmp_path, steps=480, duration=dur, data_wait=np.zeros(480), heap=heap,
                   new_shapes=new)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits


@pytest.mark.parametrize("seed", range(4))
def test_new_sizes_alone_are_explained(tmp_path, seed):
    new, dur, heap = _multiscale(np.random.default_rng(seed), 0.0)
    run = make_run(tmp_path, steps=480, duration=dur, data_wait=np.zeros(480), heap=heap,
                   new_shapes=new)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]
    assert all(f["severity"] == "info" for f in hits), hits
