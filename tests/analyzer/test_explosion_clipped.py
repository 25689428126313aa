"""An explosion is read on the gradient as applied (issue 45, held-out ah_ppo and ah_irnn):
raw norms that grow while clip_grad_norm_ holds every update at max_norm move the weights no
further (PPO: raw 12 -> 40 under a clip of 0.5, one critic tensor x30); a clip taken away
mid-run lets the raw norms it held back through at once (an IRNN resumed without --clip:
applied 1 -> 14 at the resume, the loss x25 a step later: the update threw the loss, not
that step's batch)."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 400
NAMES = ["actor.0.weight", "actor.0.bias", "critic.0.weight", "critic.0.bias"]
S = np.arange(N)


@pytest.mark.parametrize("seed", range(3))
def test_raw_growth_under_a_clip_that_bites_every_step_is_no_explosion(tmp_path, seed):
    rng = np.random.default_rng(seed)
    raw = (12 + 28 * (1 - np.exp(-S / 60))) * np.exp(rng.normal(0, 0.1, N))
    raw[:70] = 12 * np.exp(rng.normal(0, 0.1, 70))

    def norm(steps, name, kind):
        if kind != "grad":
            return None
        grow = np.geomspace(1, 30, 40) if name == "critic.0.weight" else np.ones(40)
        x = raw[steps] / 4 * np.exp(rng.normal(0, 0.1, len(steps)))
        x[70:110] *= grow
        x[110:] *= grow[-1]
        return x

    loss = (20 + 11 * (1 - np.exp(-S / 80))) * np.exp(rng.normal(0, 0.03, N))
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=raw, grad_clip_max=0.5,
                   tensors=NAMES, tensor_norm=norm)
    assert not [f for f in build_summary(run)["findings"] if f["id"] == "gradient_explosion"]


@pytest.mark.parametrize("seed", range(3))
def test_a_clip_taken_away_is_an_explosion_at_that_step(tmp_path, seed):
    rng = np.random.default_rng(seed)
    raw = 15 * np.exp(rng.normal(0, 0.4, N))  # always above the clip of 1
    raw[251:254] = [301.0, 152.0, 160.0]
    raw[254:] = 0.3 * np.exp(rng.normal(0, 0.3, N - 254))  # dead after it
    clip = np.where(S < 250, 1.0, np.nan)
    loss = np.where(S < 251, 0.6, 2.3) * np.exp(rng.normal(0, 0.05, N))
    loss[251] = 15.4
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=raw, grad_clip_max=clip)
    fs = build_summary(run)["findings"]
    (f,) = [x for x in fs if x["id"] == "gradient_explosion"]
    assert f["first_step"] == 250 and not f.get("caused_by")
    assert "was on until step 249 and off from step 250" in f["message"]
    above = [x for x in fs if x["severity"] != "info"]
    assert above[0]["id"] == "gradient_explosion"


@pytest.mark.parametrize("seed", range(3))
def test_a_learning_rate_jump_under_a_clip_is_still_an_explosion(tmp_path, seed):
    # the update is the rate times the clipped gradient: x100 at step 150 is x100 whatever
    # the clip does (BERT in the matrix: its classifier's gradient x30 under a clip of 1)
    rng = np.random.default_rng(seed)
    raw = np.where(S < 150, 1.5, 5.0) * np.exp(rng.normal(0, 0.3, N))

    def norm(steps, name, kind):
        if kind != "grad":
            return None
        x = raw[steps] / 3 * np.exp(rng.normal(0, 0.1, len(steps)))
        if name == "critic.0.bias":
            x[150:] *= 30
        return x

    loss = np.where(S < 150, 0.4 + 2 * np.exp(-S / 30), 2.5) * np.exp(rng.normal(0, 0.1, N))
    run = make_run(tmp_path, steps=N, loss=loss, grad_norm=raw, grad_clip_max=1.0,
                   lr=np.where(S < 150, 1e-3, 1e-1), tensors=NAMES, tensor_norm=norm)
    fs = [f for f in build_summary(run)["findings"] if f["severity"] != "info"]
    (f,) = [x for x in fs if x["id"] == "gradient_explosion"]
    assert f["first_step"] == 150 and not f.get("caused_by")
    assert fs[0]["first_step"] == 150 and "learning rate" in fs[0]["message"]
