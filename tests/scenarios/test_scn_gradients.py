"""Too-high learning rate, NaN injected in a module, and vanishing gradients."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.scenarios import checks
from tests.scenarios import scenarios as S

TRAINING_HEALTH = {"gradient_explosion", "vanishing_gradient", "nonfinite", "loss_spike",
                   "loss_divergence", "update_ratio", "dead_activation"}


@pytest.mark.parametrize("seed", [0, 1])
def test_high_lr_explosion_is_flagged_before_the_first_nan(seed: int, tmp_path: Path) -> None:
    run = S.run_high_lr(tmp_path / "run", seed=seed)
    summary = checks.summarize(run)
    expl = checks.one(summary, "gradient_explosion")
    nonfinite = checks.one(summary, "nonfinite")
    # the NaN/Inf comes after the LR jump, and the explosion is reported well before it
    assert nonfinite["first_step"] > S.LR_JUMP_STEP
    assert S.LR_JUMP_STEP - 5 <= expl["first_step"] <= S.LR_JUMP_STEP + 15, \
        checks.describe(summary)
    assert expl["first_step"] + 5 <= nonfinite["first_step"]
    assert expl["severity"] in ("error", "critical")
    # no activation tracing in the standard preset: the gradient of a parameter overflowed
    # first while the loss was still finite, so the module holding it is named, its backward
    # having made the Inf, with the parameters (named as in model.named_parameters())
    assert re.fullmatch(r"[02]", nonfinite["subject"]), nonfinite
    assert nonfinite["evidence"]["direction"] == "backward"
    assert all(re.fullmatch(r"[02]\.(weight|bias)", p)
               for p in nonfinite["evidence"]["parameters"]), nonfinite
    # the loss itself ends NaN: divergence is reported too, after the jump
    div = checks.one(summary, "loss_divergence")
    assert S.LR_JUMP_STEP <= div["first_step"] <= nonfinite["first_step"] + 10
    # nothing about gradients or the loss is dated in the healthy first 100 steps
    early = [f for f in checks.above(summary) if f["id"] in TRAINING_HEALTH
             and f["first_step"] is not None and f["first_step"] < S.LR_JUMP_STEP - 5]
    assert not early, checks.describe(summary)


def test_nan_in_module_names_that_module_and_step(tmp_path: Path) -> None:
    run = S.run_nan_in_module(tmp_path / "run")
    code, summary = checks.cli_summary(run, "--fail-on", "error")
    assert code == 1
    nf = checks.one(summary, "nonfinite")
    assert nf["subject"] == S.NAN_MODULE
    assert nf["first_step"] == S.NAN_STEP
    assert nf["severity"] == "critical"  # the loss went NaN as well


def test_deep_sigmoid_net_has_vanishing_gradients_in_early_layers(tmp_path: Path) -> None:
    steps = 200
    run = S.run_vanishing(tmp_path / "run", steps=steps)
    summary = checks.summarize(run)
    van = checks.one(summary, "vanishing_gradient")
    # Linear layers sit at Sequential indices 0, 2, ..., 38: the worst must be among the
    # first five of the twenty
    m = re.fullmatch(r"(\d+)\.(weight|bias)", van["subject"])
    assert m and int(m.group(1)) <= 8, van["subject"]
    # every flagged layer is in the lower half of the network, none near the head
    flagged = [int(n.split(".")[0]) for n in van["evidence"]["layers"]]
    assert flagged and max(flagged) < 20
    # present from initialisation: reported no later than the analysis window's start
    assert van["first_step"] <= steps // 2
    checks.assert_only(summary, run, {"vanishing_gradient", "loss_plateau"})
