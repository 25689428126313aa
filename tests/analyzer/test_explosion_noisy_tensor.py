"""A burst set off by a stretch of hard batches, seen in a noisy tensor (#45): a small CNN's
first bias has a gradient norm that moves x40 from step to step; a batch throws the loss x7.5
and every gradient x5-7 for a few steps, then it settles and the loss ends lower. Whether
the tensor "grew by the factor before the batch" is judged on levels (medians of a few
smoothed points), not from the lowest dip to the highest peak: read that way, its noise
alone made a growth from 50 steps before the batch, an explosion the total norm never had.
Its level drifts up x6 while the model learns before the batch, under that noise. A tensor
that really grew by the factor before the batch still dates its own onset."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N, BATCH = 440, 200
S = np.arange(N)
NAMES = ["features.0.weight", "features.0.bias", "head.0.weight", "head.0.bias"]


def _run(tmp_path, seed: int, grows_before: bool = False):
    rng = np.random.default_rng(seed)
    loss = (0.45 + 1.2 * np.exp(-S / 120)) * np.exp(rng.normal(0, 0.08, N))
    knock = np.where(S >= BATCH, 6.5 * np.exp(-(S - BATCH) / 8.0), 0.0)
    loss = loss * (1 + knock)
    if grows_before:  # a real explosion: the loss gets worse as the tensor grows
        loss = loss * np.exp(np.clip((S - 120) / 80, 0, 1) * np.log(3))
    burst = np.where((S >= BATCH) & (S < BATCH + 8), 7.0 * np.exp(-(S - BATCH) / 6.0), 1.0)
    burst = np.maximum(burst, 1.0)
    total = 2.0 * np.exp(rng.normal(0, 0.3, N)) * burst
    ramp = np.where(grows_before, np.clip((S - 120) / 80, 0, 1) * np.log(30), 0.0)
    noise = {n: rng.normal(0, 0.9 if n.endswith("bias") else 0.2, N) for n in NAMES}

    # the bias's gradient drifts up x6 while the model learns (from step 60 to the batch)
    drift = 0.05 * np.exp(np.clip((S - 60) / (BATCH - 60), 0, 1) * np.log(6))

    def norms(step, name, kind):
        base = drift[step] if name == "features.0.bias" else 0.8
        x = base * np.exp(noise[name][step]) * burst[step]
        if name == "features.0.bias":
            x = x * np.exp(ramp[step])
        return x

    return make_run(tmp_path, steps=N, loss=loss, lr=0.01, grad_norm=total, tensors=NAMES,
                    tensor_kinds=("grad", "param"), tensor_norm=norms)


def _explosions(run):
    return [f for f in build_summary(run)["findings"] if f["id"] == "gradient_explosion"]


@pytest.mark.parametrize("seed", range(30))  # (before: explosions at 174 and 161, seeds 17, 18)
def test_a_noisy_tensors_burst_at_the_batch_is_no_explosion(tmp_path, seed):
    assert _explosions(_run(tmp_path, seed)) == []


@pytest.mark.parametrize("seed", range(3))  # (dated in the drift: noise, as before)
def test_a_tensor_that_grew_before_the_batch_keeps_its_onset(tmp_path, seed):
    (f,) = _explosions(_run(tmp_path, seed, grows_before=True))
    assert f["subject"] == "features.0.bias" and 60 <= f["first_step"] < BATCH
