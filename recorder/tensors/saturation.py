"""Saturation of bounded activations (tanh, sigmoid, hardtanh, softsign, hardsigmoid, the
top of ReLU6, softmax), measured with the activation statistics (at their cadence): the
share of a module's output within 1% of its range from a bound. There a tanh passes under
4% of the gradient it passes at 0, a sigmoid under 4% of its best (1 − 0.98² ≈ 0.04;
0.0099 / 0.25 ≈ 0.04); hardtanh, ReLU6 and hardsigmoid pass none. For softmax: the share of
its distributions whose top probability is ≥ 0.99. One scalar per module, on the device, no
sync: joined into the step's activation rows (``tensor_stats.sat_frac``) at commit."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TOL = 0.01
"""Within this share of the range from a bound counts as saturated."""


def bound_kind(m: nn.Module) -> tuple[str, float | None, float | None, int | None] | None:
    """(kind, low, high, softmax dim) of a bounded activation module, None for others."""
    if isinstance(m, nn.ReLU6):
        return ("relu6", None, 6.0, None)  # (its zero is ReLU's: dead_activation's business)
    if isinstance(m, nn.Hardtanh):
        return ("hardtanh", float(m.min_val), float(m.max_val), None)
    if isinstance(m, (nn.Tanh, nn.Softsign)):
        return (type(m).__name__.lower(), -1.0, 1.0, None)
    if isinstance(m, (nn.Sigmoid, nn.Hardsigmoid)):
        return (type(m).__name__.lower(), 0.0, 1.0, None)
    if isinstance(m, nn.Softmax2d):
        return ("softmax", None, None, -3)
    if isinstance(m, nn.Softmax):
        return ("softmax", None, None, m.dim if m.dim is not None else -1)
    return None


def bounded_modules(model: nn.Module) -> dict[int, tuple[str, float | None, float | None,
                                                         int | None]]:
    """Index (in ``named_modules`` order) -> :func:`bound_kind` of each bounded module."""
    out = {}
    for i, (_, m) in enumerate(model.named_modules()):
        kind = bound_kind(m)
        if kind is not None:
            out[i] = kind
    return out


def saturated_share(t: torch.Tensor, spec: tuple[str, float | None, float | None, int | None]
                    ) -> torch.Tensor:
    """The share of ``t`` that is saturated by ``spec`` (a 0-d float32 tensor on t's
    device; no host sync)."""
    kind, lo, hi, dim = spec
    x = t.detach()
    if kind == "softmax":
        if x.dim() == 0:
            return torch.ones((), device=x.device)
        return (x.amax(dim=dim) >= 1 - TOL).float().mean()
    span = (hi - lo) if lo is not None and hi is not None else abs(hi or 1.0)
    tol = TOL * span
    sat = torch.zeros_like(x, dtype=torch.bool)
    if lo is not None:
        sat |= x <= lo + tol
    if hi is not None:
        sat |= x >= hi - tol
    return sat.float().mean()


def join(values: list[Any], device: Any) -> torch.Tensor | None:
    """One vector of the step's activation rows' shares (NaN for unbounded modules), or
    None when no bounded module ran at this statistics step."""
    if all(v is None for v in values):
        return None
    nan = torch.full((), float("nan"), device=device)
    return torch.stack([v.to(device) if v is not None else nan for v in values])
