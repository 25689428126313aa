"""NaNs made in the backward pass are traced to the module whose backward made them (debug
preset), inside a transformer block and a ResNet block: the gradient of sqrt at 0, a custom
autograd.Function with a bad backward, the norm of a zero vector, and a loss whose value is
finite but whose gradient is not; a NaN made in the forward still blames the forward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

from tests.matrix.models import BasicBlock

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]
BAD_FROM = 15


class Switch:
    on = False


class SqrtGate(nn.Module):
    """|h| written as sqrt(h²) over a masked input: a finite forward; where h is exactly 0,
    sqrt's slope is inf and h²'s is 0: inf × 0 = NaN (a multiply does not mask it, unlike
    ReLU's or clamp's backward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not Switch.on:
            return x
        h = x * (torch.arange(x.shape[-1], device=x.device) % 2)
        return torch.sqrt(h * h)


class _BadGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


class CustomFn(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _BadGrad.apply(x) if Switch.on else x


class ZeroNorm(nn.Module):
    """x scaled by a direction normalised by its hand-written norm plus eps: a finite
    forward at a zero vector, but sqrt's slope at 0 is inf and (v·v)'s is 0: NaN.
    (torch.linalg.vector_norm defines its gradient at 0 as 0; code that writes the norm
    out, as many normalisations do, gets the NaN.)"""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if Switch.on:
            with torch.no_grad():
                self.v.zero_()
        return x * (1 + self.v / (torch.sqrt((self.v * self.v).sum()) + 1e-6))


class LogForward(nn.Module):
    """A forward-made NaN: log of a negative value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - 1e3) if Switch.on else x


class Block(nn.Module):
    """A pre-norm transformer block with a hook point after its attention."""

    def __init__(self, bad: nn.Module, d: int = 32) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.bad = bad
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.bad(self.attn(h, h, h, need_weights=False)[0])
        x = x + self.mlp(self.ln2(x))
        return self.head(x).mean(dim=1)


class ResNetish(nn.Module):
    def __init__(self, bad: nn.Module) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = BasicBlock(8, 8, 1)
        self.bad = bad
        self.fc = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bad(self.block(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _run(tmp: Path, model: nn.Module, batch, loss_fn=None) -> dict:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = loss_fn or (lambda out, y: F.mse_loss(out, y))
    Switch.on = False
    try:
        with Recorder(tmp, model=model, optimizer=opt, preset="debug", flush_interval_s=0.3,
                      profile_start=0, system_interval_s=0) as rec:
            for step in range(BAD_FROM + 5):
                Switch.on = step >= BAD_FROM
                x, y = batch(step)
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                rec.step(loss=loss)
    finally:
        Switch.on = False
    out = subprocess.run([*CLI, "summary", str(tmp), "--json"], capture_output=True,
                         text=True)
    return next(f for f in json.loads(out.stdout)["findings"] if f["id"] == "nonfinite")


def _tokens(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 6, 32, generator=g), torch.randn(4, 1, generator=g)


def _images(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 1, generator=g)


CASES = [("sqrt", SqrtGate), ("custom_function", CustomFn), ("zero_norm", ZeroNorm)]


@pytest.mark.parametrize("case,bad", CASES, ids=[c for c, _ in CASES])
@pytest.mark.parametrize("arch", ["transformer", "resnet"])
def test_backward_made_nan_names_its_module(tmp_path: Path, case: str, bad, arch: str
                                            ) -> None:
    d = 32 if arch == "transformer" else 8
    module = bad(d) if bad is ZeroNorm else bad()
    if arch == "transformer":
        model, batch = Block(module), _tokens
    else:
        model, batch = ResNetish(module), _images
    f = _run(tmp_path / "run", model, batch)
    assert f["evidence"].get("direction") == "backward", f
    assert f["subject"] == "bad" and f["first_step"] == BAD_FROM, f


def test_a_loss_with_a_nan_gradient_is_the_loss(tmp_path: Path) -> None:
    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not Switch.on:
            return F.mse_loss(out, y)
        target = out.detach().clone()
        target[1:] += 1.0  # one element matches exactly: |0| ** 0.5 has an inf slope there
        return (out - target).abs().sqrt().mean()

    f = _run(tmp_path / "run", Block(nn.Identity()), _tokens, loss_fn)
    assert f["evidence"]["direction"] == "backward" and f["subject"] == "loss", f
    assert f["first_step"] == BAD_FROM


@pytest.mark.parametrize("arch", ["transformer", "resnet"])
def test_a_forward_made_nan_still_blames_the_forward(tmp_path: Path, arch: str) -> None:
    model, batch = ((Block(LogForward()), _tokens) if arch == "transformer"
                    else (ResNetish(LogForward()), _images))
    f = _run(tmp_path / "run", model, batch)
    assert f["evidence"]["direction"] == "forward" and f["subject"] == "bad", f
    assert f["first_step"] == BAD_FROM


class SharedInput(nn.Module):
    """Plain code that takes the same input as a child: sqrt((x*0)²)'s NaN gradient lands on
    x, which the child also consumes; the child's backward is innocent."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if Switch.on:
            h = x * 0
            y = y + torch.sqrt(h * h)
        return y


def test_a_nan_on_an_input_that_plain_code_shares_names_the_parent(tmp_path: Path) -> None:
    # the hook on x sees the sum of the gradients of every consumer (lin and the parent's
    # plain code): the child whose input it is cannot be blamed on that alone
    f = _run(tmp_path / "run", Block(SharedInput()), _tokens)
    assert f["evidence"]["direction"] == "backward" and f["subject"] == "bad", f
    assert f["first_step"] == BAD_FROM
