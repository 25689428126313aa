"""What the tests compare a recorded run with: values computed inside the training step
itself, independently of the recorder."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class GradReference:
    """Per-parameter gradient norms as autograd leaves them after each backward
    (post-accumulate-grad hooks): after a step's last micro-batch, before any clipping,
    unscaling or optimizer update. ``snapshot()`` freezes the current values as one step."""

    def __init__(self, model: nn.Module) -> None:
        self.names = {p: n for n, p in model.named_parameters() if p.requires_grad}
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in self.names]

    def _hook(self, p: torch.Tensor) -> None:
        self.current[self.names[p]] = float(p.grad.detach().double().norm())

    def snapshot(self) -> None:
        self.steps.append(dict(self.current))

    def total(self, i: int) -> float:
        return math.sqrt(sum(v * v for v in self.steps[i].values()))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def grad_norms(run: Any) -> dict[int, dict[str, float]]:
    """The recorded per-parameter gradient norms: {step: {name: norm}}."""
    from tracealyze.analyzer.run.catalog import open_run

    out: dict[int, dict[str, float]] = {}
    with open_run(run) as r:
        for step, name, norm in r.con.execute(
                "SELECT step, name, norm FROM tensor_stats WHERE kind = 'grad' "
                "AND norm IS NOT NULL").fetchall():
            out.setdefault(int(step), {})[name] = float(norm)
    return out


def assert_close(a: float, b: float, rel: float = 1e-4, what: str = "") -> None:
    assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-7), f"{what}: {a} != {b}"
