"""torch.compile: the recorder causes no graph break in the compiled region (dynamo's own
counters), records the model under its original names, and the debug preset says why it
cannot trace activations of a compiled model instead of silently checking nothing."""

from __future__ import annotations

from pathlib import Path

import torch
from rec_helpers import FAST, events, steps_by_number
from reference import grad_norms
from tracealyze.recorder import Recorder

from tests.matrix.models import NanoGPT, nanogpt_adamw, nanogpt_loss, token_batches


def _train(run: Path, preset: str, steps: int = 4) -> tuple[torch.nn.Module, dict]:
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    dynamo.reset()
    counters.clear()
    model = NanoGPT(0)
    compiled = torch.compile(model, backend="eager")  # dynamo's graph capture is the test
    opt = nanogpt_adamw(model, 1e-3)
    draw = token_batches(0, 4)
    with Recorder(run, model=compiled, optimizer=opt, preset=preset, **FAST) as rec:
        for i in range(steps):
            loss = nanogpt_loss(compiled, draw(i))
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    return model, {k: dict(v) for k, v in counters.items()}


def test_compiled_model_has_no_graph_break_and_its_own_names(tmp_path: Path) -> None:
    model, counters = _train(tmp_path / "run", "standard")
    assert not counters.get("graph_break"), counters.get("graph_break")
    assert counters["stats"]["unique_graphs"] >= 1  # it really was compiled
    steps = steps_by_number(tmp_path / "run")
    assert sorted(steps) == [0, 1, 2, 3] and all(s["loss"] > 0 for s in steps.values())
    names = {n for n, _ in model.named_parameters()}
    assert set(grad_norms(tmp_path / "run")[0]) == names  # not "_orig_mod.…"


def test_debug_preset_on_a_compiled_model_says_why_activations_are_not_traced(
        tmp_path: Path) -> None:
    _, counters = _train(tmp_path / "run", "debug")
    assert not counters.get("graph_break"), counters.get("graph_break")
    why = events(tmp_path / "run", "activation_tracing_unavailable")
    assert len(why) == 1 and "compile" in why[0]["message"]
