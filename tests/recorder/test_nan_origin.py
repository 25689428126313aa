"""NaN tracing (debug preset) names the module whose forward made the NaN, also when it was
plain code in a parent's forward; says clearly when it cannot trace (torch.compile); and
writes one activation row per module at a NaN step that also has full statistics."""

from __future__ import annotations

from pathlib import Path

import torch
from rec_helpers import FAST, events, rows
from torch import nn
from tracealyze.recorder import Recorder

NAN_STEP = 5


class MLPBlock(nn.Module):
    """c_fc -> gelu (plain code) -> c_proj, like nanoGPT's MLP; ``poison`` makes a NaN in
    the plain code between the two projections."""

    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Linear(8, 16)
        self.c_proj = nn.Linear(16, 8)
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.c_fc(x))
        if self.poison:
            h = h * torch.log(torch.zeros_like(h[:1]) - 1)  # log(-1) = NaN
        return self.c_proj(h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([MLPBlock(), MLPBlock()])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def _train(run_dir: Path, model: nn.Module, call: nn.Module | None = None, **knobs) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    call = call if call is not None else model
    g = torch.Generator().manual_seed(1)
    with Recorder(run_dir, model=call, optimizer=opt, preset="debug",
                  **{**FAST, **knobs}) as rec:
        for i in range(8):
            model.blocks[1].poison = i == NAN_STEP
            loss = call(torch.randn(3, 4, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)


def test_nan_made_by_plain_code_in_a_forward_blames_that_module(tmp_path: Path) -> None:
    _train(tmp_path / "run", Net())
    ev = [e for e in events(tmp_path / "run", "nonfinite") if e["step"] == NAN_STEP]
    act = [e for e in ev if "first appeared" in e["message"]]
    assert act and act[0]["subject"] == "blocks.1"  # not blocks.1.c_proj, its victim


def test_one_activation_row_per_module_at_a_nan_step_with_statistics(tmp_path: Path) -> None:
    _train(tmp_path / "run", Net(), activation_stats_every=NAN_STEP)
    acts = [(r["step"], r["name"]) for r in rows(tmp_path / "run", "tensor_stats")
            if r["kind"] == "activation" and r["step"] == NAN_STEP]
    assert acts and len(acts) == len(set(acts))


def test_compiled_model_says_it_cannot_trace(tmp_path: Path) -> None:
    model = Net()
    compiled = torch.compile(model, backend="eager")
    _train(tmp_path / "run", model, call=compiled)
    (e,) = events(tmp_path / "run", "activation_tracing_unavailable")
    assert "torch.compile" in e["message"] and e["severity"] == "info"


def test_heap_bytes_recorded_with_rss(tmp_path: Path) -> None:
    import ctypes

    _train(tmp_path / "run", Net())
    mem = rows(tmp_path / "run", "memory")
    assert mem and all(r["rss_bytes"] > 0 for r in mem)
    try:
        has_glibc = hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        has_glibc = False
    if has_glibc:
        assert all(r["heap_bytes"] and r["heap_bytes"] > 0 for r in mem)
