"""Model and optimizer hooks: where gradients, updates and activations are read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's own module inside DDP/DataParallel/FSDP wrappers and torch.compile, so
    recorded names match ``model.named_parameters()`` of the model they wrote."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod  # torch.compile's OptimizedModule
            continue
        inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module) and type(model).__name__ in (
                "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            model = inner
            continue
        break
    return model


def is_compiling() -> bool:
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:
        return False


def first_tensor(x: Any) -> torch.Tensor | None:
    """The first floating-point tensor in a module's output (tuples, dicts, dataclasses)."""
    if isinstance(x, torch.Tensor):
        return x if (x.is_floating_point() and not x.is_sparse) else None
    if isinstance(x, (list, tuple)):
        for v in x:
            t = first_tensor(v)
            if t is not None:
                return t
    if isinstance(x, dict):
        for v in x.values():
            t = first_tensor(v)
            if t is not None:
                return t
    return None


def nonfinite_probe(t: torch.Tensor) -> torch.Tensor:
    """A float32 0-d tensor that is NaN/Inf iff ``t`` holds a NaN/Inf, left on the device.

    One reduction pass (a sum accumulated in float32: NaN and Inf propagate, +Inf + -Inf is
    NaN) instead of isfinite + not + count, which is three passes over every activation of
    every step. The only false alarm is a float32 overflow of the sum itself (|sum| > 3e38).
    """
    return t.detach().sum(dtype=torch.float32)


class ActivationHooks:
    """Forward hooks on every module: per-step NaN/Inf counts and cadence statistics.

    ``on_output(index, tensor)`` and ``on_input(tensor)`` are the recorder's callbacks; hooks
    return immediately while torch.compile traces (telemetry must not cause graph breaks).
    """

    def __init__(self, model: nn.Module, on_output: Callable[[int, torch.Tensor], None],
                 on_input: Callable[[torch.Tensor], None]) -> None:
        self.names = [name or "<model>" for name, _ in model.named_modules()]
        self._last: torch.Tensor | None = None
        self.handles = []
        for i, (_, mod) in enumerate(model.named_modules()):
            self.handles.append(mod.register_forward_hook(self._make(i, on_output)))
        self.handles.append(model.register_forward_pre_hook(
            lambda _m, args: None if is_compiling() or not torch.is_grad_enabled()
            else _input(args, on_input)))

    def _make(self, i: int, cb: Callable[[int, torch.Tensor], None]):
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
            # Forward passes without autograd (evaluation, generation) are not training
            # steps: recording them would pile up pieces and blame eval NaNs on training.
            if is_compiling() or not torch.is_grad_enabled():
                return
            t = first_tensor(out)
            # A container (Sequential, ...) often returns its last child's output: that very
            # tensor was just checked, so skip it.
            if t is not None and t is not self._last:
                self._last = t
                cb(i, t)
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _input(args: Any, cb: Callable[[torch.Tensor], None]) -> None:
    t = first_tensor(args)
    if t is not None:
        cb(t)
