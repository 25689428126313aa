"""Memory that grows with new input shapes is a per-shape cache, not a leak (issue 45, item
2: structure by design explains). oneDNN keeps primitives per shape, cuDNN plans under
``cudnn.benchmark``, a compiled model recompiles, a user keeps a mask per length: each grows
once per distinct shape and holds while shapes recur. A leak grows with steps, in the
windows without a new shape too. Generated runs: shapes drawn from a fixed set in random
order, from a long tail that keeps bringing new ones late, with and without a leak."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 500


def _leaks(tmp_path, heap, new_shapes=None):
    dur = np.full(N, 0.01)
    run = make_run(tmp_path, steps=N, duration=dur, data_wait=np.zeros(N), heap=heap,
                   new_shapes=new_shapes)
    return [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]


def _shapes(rng: np.random.Generator, kind: str) -> np.ndarray:
    """Per step: 1 where the step's input shape is first seen."""
    if kind == "set":  # one of 48 image sizes per batch, uniformly
        draws = rng.integers(0, 48, N)
    else:  # sequence lengths with a long tail: new lengths keep coming, more rarely
        draws = np.minimum((16 * (1 + rng.pareto(1.3, N))).astype(int), 4096)
    seen: set[int] = set()
    out = np.zeros(N)
    for i, v in enumerate(draws):
        if v not in seen:
            seen.add(int(v))
            out[i] = 1
    return out


def _cache(rng: np.random.Generator, new: np.ndarray) -> np.ndarray:
    """The heap: 130 MB, allocator noise, and 150-400 KiB kept at each new shape."""
    kept = np.cumsum(new * rng.uniform(150e3, 400e3, N))
    return 1.3e8 + rng.normal(0, 2e3, N) + kept


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", ["set", "tail"])
def test_growth_at_new_shapes_only_is_a_per_shape_cache(tmp_path, seed, kind):
    rng = np.random.default_rng(seed)
    new = _shapes(rng, kind)
    heap = _cache(rng, new)
    hits = _leaks(tmp_path, heap, new)
    assert all(f["severity"] == "info" for f in hits), hits
    if hits:
        assert "new input shapes" in hits[0]["title"], hits[0]
        assert hits[0]["evidence"]["with_new_shapes_share"] >= 0.5


@pytest.mark.parametrize("seed", range(3))
def test_the_same_cache_without_shape_counts_is_judged_as_before(tmp_path, seed):
    """A run recorded before the recorder counted shapes (or without a model): nothing is
    excused by a column that is not there — the growth, if it reads as a leak, is one."""
    rng = np.random.default_rng(seed)
    new = _shapes(rng, "tail")
    heap = _cache(rng, new)
    before = _leaks(tmp_path / "a", heap)
    assert all("new input shapes" not in f["title"] for f in before)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", ["set", "tail"])
@pytest.mark.parametrize("onset", [0, 250])
def test_a_leak_beside_a_shape_cache_is_still_a_leak(tmp_path, seed, kind, onset):
    rng = np.random.default_rng(10 + seed)
    new = _shapes(rng, kind)
    heap = _cache(rng, new) + np.maximum(np.arange(N) - onset, 0) * 24e3
    hits = _leaks(tmp_path, heap, new)
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits
    assert abs(hits[0]["first_step"] - onset) <= 0.05 * N + 10, hits[0]


@pytest.mark.parametrize("seed", range(2))
def test_a_new_shape_every_step_excuses_nothing(tmp_path, seed):
    """Every step a new shape and memory up every step: a cache that never hits grows like
    a leak and is one (no window without a new shape to tell them apart)."""
    rng = np.random.default_rng(30 + seed)
    heap = 1.3e8 + rng.normal(0, 2e3, N) + np.arange(N) * 24e3
    hits = _leaks(tmp_path, heap, np.ones(N))
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits


def _stream(rng: np.random.Generator, share: float) -> tuple[np.ndarray, np.ndarray]:
    """A stream of clip lengths: at each step a new length with probability ``share`` (new
    lengths keep coming at a constant rate), else one already seen; per step, whether the
    length was new and the live batch's bytes read with the heap (8 clips of 4-16 k floats:
    0.1-0.5 MiB, far more than a step's share of any growth)."""
    seen = [int(rng.integers(4000, 16000))]
    new, live = np.zeros(N), np.zeros(N)
    for i in range(N):
        if i == 0 or rng.random() < share:
            seen.append(int(rng.integers(4000, 16000)))
            new[i], length = 1, seen[-1]
        else:
            length = seen[int(rng.integers(0, len(seen)))]
        live[i] = 8 * 4 * length
    return new, live


@pytest.mark.parametrize("seed", range(4))
def test_the_live_batch_beside_a_steady_stream_of_new_shapes_is_no_leak(tmp_path, seed):
    """New lengths at 18% of the steps all run long (each +260 KiB kept) and the heap is read
    with the step's batch still alive (±0.2 MiB from step to step): imputing the intervals
    with a new shape turned that noise into a random walk the trend test read as ~10 KiB a
    step (the held-out TCN on bird calls). Between two new shapes the memory holds."""
    rng = np.random.default_rng(40 + seed)
    new, live = _stream(rng, 0.18)
    heap = 1.3e8 + np.cumsum(new * rng.uniform(200e3, 320e3, N)) + live
    hits = _leaks(tmp_path, heap, new)
    assert all(f["severity"] == "info" for f in hits), hits


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("onset", [100, 250])
@pytest.mark.parametrize("rate", [40e3, 80e3])
def test_a_leak_beside_the_live_batch_and_new_shapes_is_a_leak(tmp_path, seed, onset, rate):
    """The same stream with 40 or 80 KiB kept every step from step 100 or 250: it shows
    between new shapes, through the live batch's noise, and is dated where those intervals
    begin to rise. The dating is asserted at 80 KiB: at 40 KiB (a run between new shapes
    holds ~3 samples, each read ±0.14 MiB) the best fit falls within 35 steps of the onset
    in 27 of 30 seeds, not always."""
    rng = np.random.default_rng(50 + seed)
    new, live = _stream(rng, 0.18)
    heap = (1.3e8 + np.cumsum(new * rng.uniform(200e3, 320e3, N)) + live
            + np.maximum(np.arange(N) - onset, 0) * rate)
    hits = _leaks(tmp_path, heap, new)
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits
    if rate >= 80e3:
        assert abs(hits[0]["first_step"] - onset) <= 0.05 * N + 10, hits[0]



@pytest.mark.parametrize("seed", range(12))
def test_a_leak_from_the_start_under_early_new_shapes_is_dated_from_the_start(tmp_path, seed):
    """A held-out set transformer's shape: new shapes at 60% of the first steps, ever rarer
    after; a leak of 70 KiB a step from step 0; a 5 MB cache entry at step 36 (70 steps of
    the leak); a temporary buffer in quiet steps 51-53 (+2.5 MB, then freed -1.8 MB); the
    allocator's +0.83 MB steps now and then. Before: dated at the buffer (53-55) in 5 of 12
    seeds, the runs free of new shapes fitted through the buffer's fall."""
    rng = np.random.default_rng(seed)
    n, t = 520, np.arange(520)
    new = (rng.random(n) < 0.6 * np.exp(-t / 150) + 0.05).astype(float)
    new[0] = new[36] = 1
    heap = (1.3e8 + rng.normal(0, 2e3, n) + np.cumsum(new * rng.uniform(50e3, 200e3, n))
            + t * 70e3)
    heap[36:] += 5e6
    for at, dv in ((50, 1.3e6), (51, 1.2e6), (52, -0.8e6), (53, -1.0e6)):
        heap[at:] += dv
    for at in rng.choice(np.arange(150, n), 6, replace=False):
        heap[at:] += 0.83e6
    run = make_run(tmp_path, steps=n, duration=np.full(n, 0.01), data_wait=np.zeros(n),
                   heap=heap, new_shapes=new)
    hits = [f for f in build_summary(run)["findings"] if f["id"] == "memory_leak"]
    assert len(hits) == 1 and hits[0]["severity"] in ("warning", "error"), hits
    assert hits[0]["first_step"] <= 0.05 * n, hits[0]
