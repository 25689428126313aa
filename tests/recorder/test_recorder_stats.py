"""tracealyze.recorder.tensors.stats against a NumPy float64 reference (property-based).

Semantics (FORMAT.md): IEEE over all elements like plain NumPy — norm, abs-max, mean, std
(ddof=0), min, max, zero fraction, nonfinite count; an empty tensor has norm 0, nonfinite 0
and NaN for the rest. The recorder accumulates in float32, so tolerances are float32-sized.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tracealyze.recorder.tensors.stats import (
    ABSMAX,
    MAX,
    MEAN,
    MIN,
    N_STATS,
    NONFINITE,
    NORM,
    SMALL_NUMEL,
    STD,
    ZERO_FRAC,
    FullStats,
    NormPlan,
    norms,
    uniform,
)

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ALL_DTYPES = (*FLOAT_DTYPES, torch.int32, torch.int64, torch.uint8, torch.bool)

# Finite magnitudes stay well inside float16's normal range, so the tensor holds what was
# generated up to rounding (the reference is computed from the tensor's actual values).
_mag = st.floats(1e-3, 1e4, allow_nan=False, allow_infinity=False)
_finite = st.one_of(st.just(0.0), _mag, _mag.map(lambda v: -v))
_special = st.sampled_from([math.nan, math.inf, -math.inf])

# Both FullStats paths run on CPU tensors: the per-tensor host path (what CPU tensors get)
# and the grouped path (what accelerators get), forced.
PATHS = pytest.mark.parametrize("host", [True, False], ids=["host", "grouped"])


@st.composite
def tensors(draw: st.DrawFn, *, allow_special: bool = True) -> torch.Tensor:
    dtype = draw(st.sampled_from(ALL_DTYPES))
    n = draw(st.integers(0, 40))
    if dtype == torch.bool:
        vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        return torch.tensor(vals, dtype=torch.bool)
    if not dtype.is_floating_point:
        lo = 0 if dtype == torch.uint8 else -1000
        hi = 255 if dtype == torch.uint8 else 1000
        vals = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
        return torch.tensor(vals, dtype=dtype)
    elem = st.one_of(_finite, _special) if allow_special else _finite
    # Some all-special and some mostly-finite tensors: weight the special values down.
    vals = draw(st.lists(st.one_of(_finite, _finite, _finite, elem), min_size=n, max_size=n))
    shape = draw(st.sampled_from(["flat", "2d"]))
    t = torch.tensor(vals, dtype=torch.float64).to(dtype)
    if shape == "2d" and n % 2 == 0 and n:
        t = t.reshape(2, n // 2)
    return t


def reference(t: torch.Tensor) -> np.ndarray:
    """The statistics of the values the tensor actually holds, in float64 NumPy."""
    a = t.detach().to(torch.float64).reshape(-1).numpy()
    out = np.full(N_STATS, np.nan)
    out[NONFINITE] = np.count_nonzero(~np.isfinite(a))
    if a.size == 0:
        out[NORM] = 0.0
        return out
    with np.errstate(invalid="ignore", over="ignore"):
        out[NORM] = np.linalg.norm(a)
        out[ABSMAX] = np.abs(a).max()
        out[MEAN] = a.mean()
        out[STD] = a.std()
        out[MIN] = a.min()
        out[MAX] = a.max()
    out[ZERO_FRAC] = np.count_nonzero(a == 0) / a.size
    return out


def assert_stats_close(got: np.ndarray, t: torch.Tensor, label: str) -> None:
    ref = reference(t)
    a = t.detach().to(torch.float64).reshape(-1).numpy()
    finite = a[np.isfinite(a)]
    scale = float(np.abs(finite).max()) if finite.size else 1.0
    n = max(a.size, 1)
    # float32 accumulation: relative error of a sum of n terms is about n * 2^-24.
    tol = {
        NORM: (1e-5, 0.0), ABSMAX: (1e-6, 0.0), MIN: (1e-6, 0.0), MAX: (1e-6, 0.0),
        MEAN: (1e-5, 1e-6 * scale * math.sqrt(n)), STD: (1e-4, 1e-5 * scale),
        ZERO_FRAC: (1e-6, 0.0), NONFINITE: (0.0, 0.0),
    }
    names = ("norm", "absmax", "mean", "std", "min", "max", "zero_frac", "nonfinite")
    for col, (rtol, atol) in tol.items():
        r, g = ref[col], float(got[col])
        where = f"{label}: {names[col]} of {t.dtype} {tuple(t.shape)} {a.tolist()}"
        if np.isnan(r):
            assert np.isnan(g), f"{where}: expected NaN, got {g}"
        elif np.isinf(r):
            assert g == r, f"{where}: expected {r}, got {g}"
        else:
            assert math.isclose(g, r, rel_tol=rtol, abs_tol=atol), f"{where}: {g} != {r}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ts=st.lists(tensors(), min_size=1, max_size=6), chunk=st.integers(1, 64))
# Regressions found by this test: dtype promotion in a mixed chunk; Inf in a split tensor.
@example(ts=[torch.zeros(0, dtype=torch.bfloat16), torch.tensor([257], dtype=torch.int32)],
         chunk=1)
@example(ts=[torch.tensor([0.0] * 6 + [math.inf, 0.0])], chunk=2)
@example(ts=[torch.tensor([1.0, -math.inf, 2.0]), torch.tensor([math.nan, 1.0])], chunk=2)
# Same-size small tensors (stacked on the host path): NaN, Inf, a near-constant one that
# needs the exact second pass for std, and an integer one.
@example(ts=[torch.tensor([1.0, math.nan, 2.0]), torch.tensor([math.inf, 1.0, 1.0]),
             torch.tensor([1e4, 1e4 + 1, 1e4]), torch.tensor([0.0, 0.0, 3.0]),
             torch.tensor([1, 0, 7], dtype=torch.int32)], chunk=64)
@PATHS
def test_full_stats_match_numpy(ts: list[torch.Tensor], chunk: int, host: bool) -> None:
    # Small chunk sizes cut tensors into several pieces that are combined afterwards.
    got = FullStats(chunk_elems=chunk, host=host)(ts).numpy()
    assert got.shape == (len(ts), N_STATS)
    assert got.dtype == np.float32
    for i, t in enumerate(ts):
        assert_stats_close(got[i], t, f"tensor {i}, chunk {chunk}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(t=tensors(), chunk=st.integers(1, 1 << 20))
@example(t=torch.tensor([math.inf, 1.0]), chunk=1 << 20)
@PATHS
def test_single_tensor_path_matches_numpy(t: torch.Tensor, chunk: int, host: bool) -> None:
    # FullStats.one (activations, watch) is a separate, leaner code path on accelerators.
    got = FullStats(chunk_elems=chunk, host=host).one(t).numpy()
    assert got.shape == (1, N_STATS) and got.dtype == np.float32
    assert_stats_close(got[0], t, f"one(), chunk {chunk}")


@settings(max_examples=100, deadline=None)
@given(ts=st.lists(tensors(), min_size=1, max_size=6))
@example(ts=[torch.zeros(0, dtype=torch.float64), torch.tensor([3.0, 4.0])])
@example(ts=[torch.tensor([1, 2], dtype=torch.int32), torch.tensor([True])])
def test_norms_match_numpy(ts: list[torch.Tensor]) -> None:
    got = norms(ts).numpy()
    assert got.shape == (len(ts),)
    for g, t in zip(got, ts, strict=True):
        ref = reference(t)[NORM]
        if np.isnan(ref):
            assert np.isnan(g), t
        else:
            assert math.isclose(float(g), ref, rel_tol=1e-5), (t, g, ref)


_plan_dtypes = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
# Sizes around SMALL_NUMEL, and repeats of a few sizes, so that the stacked (small, equal
# sizes), the foreach (large, or a size seen once) and the mixed plans all occur.
_plan_sizes = st.sampled_from([1, 3, 128, SMALL_NUMEL, SMALL_NUMEL + 1, 3 * SMALL_NUMEL])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=st.lists(st.tuples(_plan_sizes, _plan_dtypes), min_size=1, max_size=12),
       seed=st.integers(0, 2**16), special=st.sampled_from([None, math.nan, math.inf]))
def test_norm_plan_matches_numpy_in_plan_order(layout: list[tuple[int, torch.dtype]],
                                               seed: int, special: float | None) -> None:
    # The every-step path: one plan per layout, reused on fresh values of the same layout.
    g = torch.Generator().manual_seed(seed)
    make = lambda: [(torch.randn(n, generator=g) * (i + 1)).to(dt)  # noqa: E731
                    for i, (n, dt) in enumerate(layout)]
    first = make()
    assert uniform(first)
    plan = NormPlan(first)
    for ts in (first, make()):
        if special is not None:
            ts[seed % len(ts)].view(-1)[0] = special
        got = plan(ts).numpy()
        assert got.shape == (len(ts),) and got.dtype == np.float32
        order = plan.order if plan.order is not None else range(len(ts))
        assert sorted(order) == list(range(len(ts)))  # each input exactly once
        for g_, t in zip(got, [ts[i] for i in order], strict=True):
            ref = reference(t)[NORM]
            if np.isnan(ref):
                assert np.isnan(g_), (t, g_)
            elif np.isinf(ref):
                assert g_ == ref
            else:
                assert math.isclose(float(g_), ref, rel_tol=1e-5), (t.dtype, t.numel(), g_, ref)


def test_norm_plan_refuses_another_layout() -> None:
    plan = NormPlan([torch.ones(3), torch.ones(3)])
    with pytest.raises(RuntimeError):
        plan([torch.ones(3)])  # the recorder re-plans on RuntimeError


@settings(max_examples=30, deadline=None)
@given(ts=st.lists(tensors(allow_special=False), min_size=1, max_size=5))
@PATHS
def test_layout_cache_is_per_shape_and_values_are_fresh(ts: list[torch.Tensor],
                                                        host: bool) -> None:
    # The same shapes again with different values: cached index tensors must not carry any
    # value from the first call.
    fs = FullStats(chunk_elems=7, host=host)
    fs(ts)
    flipped = [(-t.to(torch.float64)).to(torch.float32) if t.numel() else t for t in ts]
    got = fs(flipped).numpy()
    for i, t in enumerate(flipped):
        assert_stats_close(got[i], t, "second call")


@PATHS
def test_large_mean_small_spread_keeps_std(host: bool) -> None:
    # |mean| >> std: the one-pass E[x²]-E[x]² formula would give 0 or garbage in float32.
    g = torch.Generator().manual_seed(0)
    t = 1e4 + torch.randn(5000, generator=g, dtype=torch.float64) * 1e-2
    for chunk in (1 << 20, 333):
        got = FullStats(chunk_elems=chunk, host=host)([t.float()]).numpy()[0]
        ref = reference(t.float())
        assert math.isclose(got[STD], ref[STD], rel_tol=1e-2), (chunk, got[STD], ref[STD])
        assert math.isclose(got[MEAN], ref[MEAN], rel_tol=1e-6)


@PATHS
def test_tensor_spanning_many_chunks_with_neighbours(host: bool) -> None:
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(3, generator=g), torch.randn(1000, generator=g) * 5,
          torch.zeros(0), torch.randn(17, generator=g).half()]
    ts[1][500] = math.nan
    for chunk in (1, 10, 999, 1000, 1001, 4096):
        got = FullStats(chunk_elems=chunk, host=host)(ts).numpy()
        for i, t in enumerate(ts):
            assert_stats_close(got[i], t, f"chunk {chunk}")


@PATHS
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty_and_scalar_tensors(dtype: torch.dtype, host: bool) -> None:
    ts = [torch.zeros(0, dtype=dtype), torch.tensor(3.0, dtype=dtype),
          torch.zeros(0, 4, dtype=dtype)]
    got = FullStats(chunk_elems=2, host=host)(ts).numpy()
    for i, t in enumerate(ts):
        assert_stats_close(got[i], t, "edge")
    assert got[0, NORM] == 0 and got[0, NONFINITE] == 0
    assert np.isnan(got[0, [ABSMAX, MEAN, STD, MIN, MAX, ZERO_FRAC]]).all()
    assert norms(ts).tolist() == [0.0, 3.0, 0.0]


def test_empty_input_lists() -> None:
    assert FullStats()([]).shape == (0, N_STATS)
    assert norms([]).shape == (0,)


def test_chunk_elems_validated() -> None:
    with pytest.raises(ValueError):
        FullStats(chunk_elems=0)


@pytest.mark.parametrize("n,chunk", [(4000, 1 << 20), (4000, 333)])
def test_host_path_two_pass_std_near_constant_weights(n: int, chunk: int) -> None:
    # A LayerNorm weight after a few updates: mean 1, spread 1e-4. E[x²] - mean² would
    # cancel to noise in float32; the host path must take its exact second pass.
    g = torch.Generator().manual_seed(3)
    t = (1.0 + torch.randn(n, generator=g) * 1e-4).float()
    got = FullStats(chunk_elems=chunk, host=True)([t]).numpy()[0]
    ref = reference(t)
    assert math.isclose(got[STD], ref[STD], rel_tol=1e-3), (got[STD], ref[STD])
    # Exactly constant: std 0, not sqrt of a rounding error.
    assert FullStats(chunk_elems=chunk, host=True)([torch.ones(n)]).numpy()[0][STD] == 0.0


def test_cpu_tensors_take_the_host_path_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import tracealyze.recorder.tensors.stats as stats_mod

    calls = []
    real = stats_mod.host_stats
    monkeypatch.setattr(stats_mod, "host_stats", lambda ts, c: calls.append(len(ts)) or real(ts, c))
    FullStats()([torch.ones(3), torch.zeros(2)])
    FullStats().one(torch.ones(4))
    FullStats(host=False)([torch.ones(3)])
    assert calls == [2, 1]
