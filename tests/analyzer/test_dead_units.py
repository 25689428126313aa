"""Dead units found wherever in the run they died (issue 45, item 3: dead units → downstream
zero gradients → plateau): from activation statistics that are dead from a point to the
end, dated by the step the gradients feeding them went exactly to zero; without activation
statistics, from gradients that had values and then were exactly zero to the end. The
findings they cause (a loss that jumps to the class prior, updates that stop) are linked to
them and dated from where they began, not from the start of a judged window.
"""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer.diagnosis.summary import build_summary

from tests.runfactory import make_run

N = 320
NAMES = ["stem.fc.weight", "stem.fc.bias", "block.fc.weight", "block.fc.bias",
         "head.weight", "head.bias"]


def _grads(dies: int | None, upstream: tuple[str, ...] = ("stem", "block"),
           revive: int | None = None):
    """Per-step gradient norms: noisy positive values, exactly 0 from ``dies`` for the
    ``upstream`` modules' tensors and head.weight (its input is dead), up to ``revive``."""
    def norm(steps: np.ndarray, name: str, kind: str):
        if kind != "grad":
            return None
        rng = np.random.default_rng(abs(hash(name)) % 2**32)
        v = 0.3 * np.exp(rng.normal(0, 0.3, len(steps)))
        hit = name.startswith(upstream) or name == "head.weight"
        if dies is not None and hit:
            off = (steps >= dies) & (steps < (revive if revive is not None else N + 1))
            v[off] = 0.0
        return v
    return norm


def _summary(tmp_path, name, **kw):
    run = make_run(tmp_path, name=name, steps=N, tensors=NAMES, **kw)
    return build_summary(run)["findings"]


@pytest.mark.parametrize("dies", [40, 160, 280])
def test_gradients_that_die_mid_run_are_dead_units_dated_at_their_step(tmp_path, dies):
    """Without activation statistics: the hidden layers' gradients exactly zero from
    ``dies`` to the end (early, at the middle, in the last eighth): dead units, dated
    there, named by the module at whose output the gradient stops (the last whose tensors
    are all dead: head.weight gets none, head.bias still learns)."""
    fs = _summary(tmp_path, f"d{dies}", tensor_norm=_grads(dies))
    (f,) = [f for f in fs if f["id"] == "dead_activation"]
    assert f["first_step"] == dies and f["subject"] == "block", f
    assert f["evidence"]["count"] == 5 and "head.bias" not in f["evidence"]["tensors"]
    assert f["severity"] == "warning"


@pytest.mark.parametrize("case", ["never", "revived", "last_steps", "from_start"])
def test_zero_gradients_that_are_no_death_are_not_dead_units(tmp_path, case):
    """Nothing when the gradients never went to zero, came back (a dead ReLU cannot),
    vanished only in the run's last few steps, or were zero from the first step (no
    gradient by construction: never had one to lose)."""
    norm = {"never": _grads(None), "revived": _grads(100, revive=200),
            "last_steps": _grads(N - 4), "from_start": _grads(0)}[case]
    fs = _summary(tmp_path, case, tensor_norm=norm)
    assert not [f for f in fs if f["id"] == "dead_activation"], fs


def _acts(dies: int):
    def stats(steps: np.ndarray, name: str):
        z = np.where(steps >= dies, 1.0, 0.3) if name.endswith("act") else np.zeros(len(steps))
        return {"zero_frac": z}
    return stats


@pytest.mark.parametrize("dies", [160, 230])
def test_activations_dead_from_mid_run_are_dated_by_the_gradients(tmp_path, dies):
    """Activation statistics every 25 steps, dead from ``dies`` (not a multiple of 25) to
    the end, less than half the run dead on average: found, dated at ``dies`` where the
    gradients feeding the ReLUs went exactly to zero; a loss that jumps to its prior there
    is its consequence."""
    loss = np.where(np.arange(N) >= dies, 1.6, 2.0 * np.exp(-np.arange(N) / 60) + 0.5)
    fs = _summary(tmp_path, f"a{dies}", tensor_norm=_grads(dies), tensor_every=1,
                  activations=["stem.fc", "stem.act", "block.fc", "block.act", "head"],
                  activation_stats=_acts(dies), activation_every=25, loss=loss)
    (f,) = [f for f in fs if f["id"] == "dead_activation"]
    assert f["first_step"] == dies and f["subject"] == "stem.act", f
    above = [g for g in fs if g["severity"] != "info"]
    assert above[0]["id"] == "dead_activation", [(g["id"], g["first_step"]) for g in above]
    for g in fs:
        if g["id"] in ("loss_divergence", "loss_plateau", "update_ratio",
                       "vanishing_gradient"):
            assert g.get("caused_by") == "dead_activation", g


def test_activations_alive_throughout_leave_zero_gradients_unnamed(tmp_path):
    """With activation statistics that show every module alive, gradients at zero are no
    dead units of theirs (a mask or gate): dead_activation says nothing."""
    fs = _summary(tmp_path, "alive", tensor_norm=_grads(160),
                  activations=["stem.act", "block.act"],
                  activation_stats=lambda s, n: {"zero_frac": np.full(len(s), 0.3)})
    assert not [f for f in fs if f["id"] == "dead_activation"]


@pytest.mark.parametrize(("names", "dead", "where"), [
    # a ResNet whose first stage died: the next stage's bias-less conv and its BatchNorm's
    # weight read the dead output (no gradient for them), the BatchNorm's bias learns
    (["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv.weight", "layer1.0.bn.weight",
      "layer1.0.bn.bias", "layer2.0.conv.weight", "layer2.0.bn.weight", "layer2.0.bn.bias",
      "fc.weight", "fc.bias"],
     7, "layer1"),
    # a GPT's first block died (the token embedding is tied to the head: it learns)
    (["wte.weight", "wpe.weight", "h.0.attn.weight", "h.0.attn.bias", "h.0.mlp.weight",
      "h.0.mlp.bias", "h.1.ln.weight", "h.1.ln.bias", "head.bias"],
     None, "h.0"),
    # an MLP whose hidden ReLUs died: the head's weight reads them, its bias learns
    (["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight", "head.bias"],
     5, "fc2"),
])
def test_the_gradient_stops_where_the_units_died(names, dead, where):
    from tracealyze.analyzer.diagnosis.detectors._zero_grads import Dead, where_it_stops

    gone = names[:dead] if dead is not None else names[1:6]
    assert where_it_stops([Dead(n, 100, 50) for n in gone], names) == where


def _f(fid: str, step: int, severity: str = "error", **evidence):
    from tracealyze.analyzer.diagnosis.findings import Finding

    return Finding(id=fid, severity=severity, title=fid, message="", first_step=step,
                   evidence=evidence)


@pytest.mark.parametrize("dead_at", [150, 151, 160])
def test_units_dead_at_a_batch_explain_it_units_dead_after_it_are_its(dead_at):
    """Units dead from the step the loss jumped made that step's loss (a dead forward):
    the death is the root. Units that die after a batch threw the run were killed by its
    update: the batch is the root. Never both ways."""
    from tracealyze.analyzer.diagnosis.causality import link

    spike = _f("loss_spike", 150, "warning", batch={"step": 150, "until": 170, "level": 0.5})
    out = link([spike, _f("gradient_explosion", 150),
                _f("dead_activation", dead_at, "warning")])
    root = out[0]
    if dead_at == 150:
        assert root.id == "dead_activation" and set(root.explains) == {
            "loss_spike", "gradient_explosion"}, [(f.id, f.caused_by) for f in out]
    else:
        assert root.id == "loss_spike" and "dead_activation" in root.explains, \
            [(f.id, f.caused_by) for f in out]
