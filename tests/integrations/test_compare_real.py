"""tracealyze compare on runs recorded for real (not synthesised): the same training twice
has the same dynamics and no new finding; the same training with a slower data loader is a
regression that names the data wait; with a learning rate 20x too high, the NaN steps and
findings are named; with 2 MiB kept every step, memory growth and peak are.

(Step times of two identical runs are judged in tests/analyzer/test_compare.py on synthetic
noise: on this shared 2-core machine consecutive identical runs differ by up to ~15% in step
time as a whole, beyond anything a two-run comparison can tell from a real change; and runs
trained one after another in one process grow its RSS.)"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rec_helpers import FAST
from torch import nn
from tracealyze.analyzer.compare.runs import compare_runs
from tracealyze.recorder import Recorder


def _train(run: Path, *, slow_s: float = 0.004, steps: int = 300, lr: float = 0.05,
           leak_bytes: int = 0) -> None:
    """A small MLP fed by a loader that takes ``slow_s`` per batch (reading files, say):
    its step time is mostly that wait, steady from run to run on a shared machine, where
    millisecond compute steps vary by 10-40% between consecutive runs."""
    torch.manual_seed(0)
    # One intra-op thread: after each 12 ms loader sleep, the OpenMP pool of a 2-core machine
    # takes ~3 ms to wake for this tiny forward (0.1 ms otherwise), which made the slow
    # loader's compute look slower and its data-wait share *smaller* ("mixed", not
    # "regressed") whenever this test ran alone.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _loop(run, slow_s, steps, lr, leak_bytes)
    finally:
        torch.set_num_threads(threads)


def _loop(run: Path, slow_s: float, steps: int, lr: float, leak_bytes: int) -> None:
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    kept = []  # a leak: something of every step is kept (a loss history with its graph...)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g))
            for _ in range(16)]

    def loader():
        for i in range(steps):
            time.sleep(slow_s)
            yield data[i % len(data)]

    with Recorder(run, model=model, optimizer=opt, **FAST) as rec:
        for x, y in rec.wrap_loader(loader()):
            loss = ((model(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if leak_bytes:
                kept.append(torch.ones(leak_bytes // 4))
            rec.step(loss=loss)


def test_recorded_pairs(tmp_path: Path) -> None:
    _train(tmp_path / "a")
    _train(tmp_path / "b")
    _train(tmp_path / "slow", slow_s=0.03)  # (a wide gap: shares move little near 1)
    same = compare_runs(tmp_path / "a", tmp_path / "b")
    assert same["comparable"] and same["findings"]["new"] == []
    # the same seed: the losses and gradient norms are identical step for step
    for name in ("loss_final", "grad_norm_median", "loss_nonfinite_steps"):
        m = next(m for m in same["metrics"] if m["name"] == name)
        assert m["base"] == m["new"] and not m["significant"], m
    slow = compare_runs(tmp_path / "a", tmp_path / "slow")
    assert slow["verdict"] == "regressed", (slow["regressions"], slow["improvements"])
    assert {"data_wait_share", "step_time_median_s"} <= set(slow["regressions"])
    assert "loss_final" not in slow["regressions"]
    # a learning rate 20x too high: this model's loss goes NaN by step ~20, and that is what
    # is named (as a metric and as new findings)
    _train(tmp_path / "hot", lr=1.0)
    hot = compare_runs(tmp_path / "a", tmp_path / "hot")
    assert hot["verdict"] in ("regressed", "mixed")
    assert "loss_nonfinite_steps" in hot["regressions"]
    assert {"nonfinite", "loss_divergence"} <= {f["id"] for f in hot["findings"]["new"]}
    # 2 MiB kept every step: a memory regression (growth per step and peak RSS)
    _train(tmp_path / "leak", leak_bytes=2 << 20)
    leak = compare_runs(tmp_path / "a", tmp_path / "leak")
    assert {"memory_growth_rss_bytes_per_step", "memory_peak_rss_bytes"} <= \
        set(leak["regressions"])
    growth = next(m for m in leak["metrics"] if m["name"] == "memory_growth_rss_bytes_per_step")
    assert 1.5 * 2**20 < growth["new"] < 2.5 * 2**20  # the 2 MiB a step it leaked
