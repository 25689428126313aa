"""CUDA: a recorded step never waits for the GPU on the training thread, and the CUDA
memory columns are filled. Skipped cleanly on machines without CUDA."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from rec_helpers import rows, steps_by_number, tiny_model
from tracealyze.recorder import Recorder
from tracealyze.recorder.tensors.stats import FullStats, norms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_standard_preset_makes_no_host_device_sync(tmp_path: Path) -> None:
    dev = torch.device("cuda")
    model = tiny_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=dev).manual_seed(0)
    data = [(torch.randn(64, 4, device=dev, generator=g), torch.randn(64, 2, device=dev,
                                                                    generator=g))
            for _ in range(8)]
    n_warm, n = 3, 40
    run_dir = tmp_path / "run"
    with Recorder(run_dir, model=model, optimizer=opt, preset="standard",
                  tensor_stats_every=5, param_stats_every=5, histogram_every=5,
                  histogram_budget=0,
                  profile_start=0, flush_interval_s=0.1) as rec:
        try:
            for i in range(n):
                x, y = data[i % len(data)]
                if i == n_warm:
                    # After warm-up (lazy CUDA/cuBLAS init, first-seen stats layouts), any
                    # synchronising call on this thread raises.
                    torch.cuda.set_sync_debug_mode("error")
                loss = ((model(x) - y) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss, loss_copy=loss.detach() * 2)
                rec.watch("x", x)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert rec.errors == 0
    steps = steps_by_number(run_dir)
    hist = rows(run_dir, "histograms")
    assert {r["step"] for r in hist} == set(range(0, n, 5))
    assert all(sum(r["counts"]) + r["nonfinite"] == r["numel"] for r in hist)
    assert sorted(steps) == list(range(n))
    assert all(s["loss"] is not None and s["grad_norm"] > 0 for s in steps.values())
    mem = rows(run_dir, "memory")
    assert len(mem) == n
    for r in mem:
        assert r["cuda_allocated_bytes"] > 0 and r["cuda_reserved_bytes"] >= r[
            "cuda_allocated_bytes"]
        # the peak since the previous row: exact where known, else null (never a guess)
        assert r["cuda_peak_bytes"] is None or r["cuda_peak_bytes"] >= r[
            "cuda_allocated_bytes"]
        assert r["cuda_total_bytes"] > r["cuda_reserved_bytes"]
        assert r["cuda_alloc_retries"] is not None and r["cuda_ooms"] == 0
    assert min(mem, key=lambda r: r["step"])["cuda_peak_bytes"] is not None  # since start
    assert not [e for e in rows(run_dir, "events") if e["kind"] == "recorder_error"]


def test_cuda_statistics_match_cpu() -> None:
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(1000, generator=g), torch.randn(7, 3, generator=g).half(),
          torch.zeros(0), torch.tensor([1.0, float("nan"), float("inf")])]
    cpu = FullStats(chunk_elems=100)(ts).numpy()
    gpu = FullStats(chunk_elems=100)([t.cuda() for t in ts]).cpu().numpy()
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-5, equal_nan=True)
    np.testing.assert_allclose(norms([t.cuda() for t in ts]).cpu().numpy(),
                               norms(ts).numpy(), rtol=1e-5, equal_nan=True)


def test_cuda_histograms_match_cpu() -> None:
    from tracealyze.recorder.tensors.histogram import Histograms

    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(3000, generator=g) * 10 ** torch.empty(3000).uniform_(-14, 8,
                                                                             generator=g),
          torch.tensor([0.0, float("nan"), float("inf"), -float("inf"), 1e-13]),
          torch.randn(64, 64, generator=g).bfloat16(), torch.empty(0)]
    h = Histograms(chunk_elems=1000)  # (tensors cut across chunks)
    np.testing.assert_array_equal(h.counts([t.cuda() for t in ts]).cpu().numpy(),
                                  h.counts(ts).numpy())


def test_memory_rows_hold_the_users_memory_at_the_step_end(tmp_path: Path) -> None:
    """Each row's allocated bytes equal torch.cuda.memory_allocated() right after rec.step():
    the recorder's own pieces of the step (loss copy, norms) are not counted in it."""
    dev = torch.device("cuda")
    model = tiny_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept, truth = [], {}
    with Recorder(tmp_path / "run", model=model, optimizer=opt, preset="standard",
                  profile_start=10**6) as rec:
        for i in range(12):
            x = torch.randn(64, 4, device=dev)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(torch.empty((1 << 18) * (i % 3 + 1), device=dev))  # the user's growth
            rec.step(loss=loss)
            truth[i] = torch.cuda.memory_allocated()
    got = {r["step"]: r["cuda_allocated_bytes"] for r in rows(tmp_path / "run", "memory")}
    assert got == truth
