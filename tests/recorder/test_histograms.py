"""Histograms over the fixed log-spaced bins: the batched device kernels against a float64
reference (format/histbins.bin_of), and the histograms table a recorded run gets."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rec_helpers import rows
from tracealyze.format import histbins as B
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors.histogram import SPLIT, Histograms


def _reference(t: torch.Tensor) -> np.ndarray:
    out = np.zeros(B.NBINS, dtype=np.int64)
    for x in t.detach().float().reshape(-1).tolist():
        b = B.bin_of(x)
        if b is not None:
            out[b] += 1
    return out


def _near_edge(x: float) -> bool:
    """Within float32 rounding of a bin edge, where float32 and float64 may disagree."""
    if x == 0 or not math.isfinite(x):
        return False
    pos = (math.log10(abs(x)) - B.LO_EXP) * B.PER_DECADE
    return abs(pos - round(pos)) < 1e-4


_values = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.builds(lambda m, e: m * 10.0 ** e, st.floats(-9.5, 9.5, width=32),
              st.integers(-15, 8)),
    st.sampled_from([0.0, -0.0, 1e-13, -1e-13, 1e6, -1e6, 3e-12]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_values, max_size=300), min_size=1, max_size=6),
       st.integers(1, 400), st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_counts_match_the_reference_bins(lists: list[list[float]], chunk: int,
                                         dtype: torch.dtype) -> None:
    ts = [torch.tensor(v, dtype=torch.float32).to(dtype) for v in lists]
    got = Histograms(chunk_elems=chunk).counts(ts).numpy()
    for t, row in zip(ts, got, strict=True):
        if any(_near_edge(x) for x in t.float().tolist()):
            assert row.sum() == int((~torch.isnan(t.float())).sum())  # (counted, somewhere)
            continue
        np.testing.assert_array_equal(row, _reference(t))


def test_the_deterministic_counting_path_counts_the_same() -> None:
    from tracealyze.recorder.tensors.histogram import count

    u = torch.tensor([float(v) for v in range(-(B.K + 2), B.K + 3)] * 3
                     + [float("nan"), 0.0, 5.0])
    np.testing.assert_array_equal(count(u, strict=True).numpy(), count(u).numpy())
    assert int(count(u, strict=True).sum()) == len(u) - 1  # (NaN in no bin)


def test_the_users_tensors_are_not_changed_and_large_counts_are_exact() -> None:
    t = torch.randn(5000)
    before = t.clone()
    Histograms(chunk_elems=1000).counts([t])
    assert torch.equal(t, before)  # (the kernels work on a copy)
    # counts leave the device as two float32 halves: exact beyond float32's 2**24
    c = torch.tensor([[3 * SPLIT * 40 + 12345]], dtype=torch.int64)
    hi, lo = torch.div(c, SPLIT, rounding_mode="floor").float(), (c % SPLIT).float()
    assert int(hi.item()) * SPLIT + int(lo.item()) == int(c.item())


def test_bin_edges_are_ordered_and_bin_of_agrees_with_them() -> None:
    edges = [B.bin_edges(b) for b in range(B.NBINS)]
    assert all(lo <= hi for lo, hi in edges)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(edges))  # increasing, disjoint
    for b in range(B.NBINS):
        lo, hi = edges[b]
        if b != B.ZERO_BIN and math.isfinite(lo) and math.isfinite(hi):
            mid = (lo + hi) / 2
            assert B.bin_of(mid) == b, (b, mid)
    assert B.bin_of(float("inf")) == B.NBINS - 1 and B.bin_of(-float("inf")) == 0
    with pytest.raises(ValueError):
        B.bin_edges(B.NBINS)


def _train(run_dir: Path, steps: int, **knobs: object) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    seen: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    with Recorder(run_dir, model=model, optimizer=opt, system_interval_s=0, **knobs) as rec:
        for i in range(steps):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            seen[i] = {"param": {n: p.detach().clone() for n, p in model.named_parameters()},
                       "grad": {n: p.grad.clone() for n, p in model.named_parameters()}}
            opt.step()
            rec.step(loss=loss)
    return model, seen


def test_a_recorded_run_has_each_tensors_histogram_at_the_cadence(tmp_path: Path) -> None:
    _, seen = _train(tmp_path / "r", 12, histogram_every=5, histogram_budget=0)
    got = rows(tmp_path / "r", "histograms")
    assert {r["step"] for r in got} == {0, 5, 10}
    assert {(r["kind"], r["name"]) for r in got} == {
        (k, n) for k in ("grad", "param") for n in ("0.weight", "0.bias", "2.weight",
                                                    "2.bias")}
    for r in got:
        t = seen[r["step"]][r["kind"]][r["name"]]
        assert r["numel"] == t.numel() and r["nonfinite"] == 0
        # (the same float32 kernels: bins match exactly unless a value sits on an edge)
        if not any(_near_edge(x) for x in t.reshape(-1).tolist()):
            assert list(r["counts"]) == list(_reference(t)), (r["kind"], r["name"])


def test_nan_is_counted_as_nonfinite_and_inf_in_the_end_bins(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[float("nan"), float("inf"), -1.0]]))
    with Recorder(tmp_path / "r", model=model, histogram_every=1, histogram_budget=0,
                  system_interval_s=0) as rec:
        rec.step(loss=1.0)
    (w,) = [r for r in rows(tmp_path / "r", "histograms") if r["name"] == "weight"]
    assert w["nonfinite"] == 1 and w["counts"][B.NBINS - 1] == 1
    assert w["counts"][B.bin_of(-1.0)] == 1


@pytest.mark.parametrize("preset,expect", [("minimal", 0), ("standard", 100), ("debug", 25)])
def test_presets_set_the_cadence(tmp_path: Path, preset: str, expect: int) -> None:
    rec = Recorder(tmp_path / preset, preset=preset, enabled=False)
    assert rec.config.histogram_every == expect
    with pytest.raises(ValueError, match="histogram_every"):
        Recorder(tmp_path / "bad", histogram_every=-1)


def test_costly_histograms_are_spread_within_their_budget(tmp_path: Path) -> None:
    """A histogram that costs far more than its share of the step (here a 0.1% budget,
    every step) is taken every 2nd, 4th, ... cadence after 1 + 3 measured ones, said in an
    info event; 0 keeps the cadence whatever it costs."""
    from rec_helpers import events

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    with Recorder(tmp_path / "r", model=model, optimizer=opt, histogram_every=1,
                  histogram_budget=0.001, system_interval_s=0) as rec:
        for _ in range(30):
            loss = model(torch.randn(2, 512)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    steps = {r["step"] for r in rows(tmp_path / "r", "histograms")}
    assert steps == {0, 1, 2, 3}  # then every 64th: the next would be step 64
    (ev,) = events(tmp_path / "r", "histogram_cadence")
    assert ev["severity"] == "info" and "the histograms took" in ev["message"]


def test_the_budget_decides_on_few_reads_for_a_rare_cadence() -> None:
    from tracealyze.recorder.tensors.budget import NormBudget

    b = NormBudget(0.005, 100, window=3, skip=1, what="the histograms")
    for _ in range(9):
        b.step_period(0.025)
    changes = [b.read_cost(0.022) for _ in range(4)]
    assert changes == [None, None, None, 2]  # 22 ms / (0.5% of 100 x 25 ms) = 1.76
    assert b.cadence_event()[1]["every"] == 200
