"""Model and optimizer hooks: where gradients, updates and activations are read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .modhooks import is_compiling
from .stats import norms


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


def device_of(named_params: list[tuple[str, Any]]) -> torch.device | None:
    """The device of the model's first parameter (else CUDA when there is one)."""
    for _, p in named_params:
        return p.device
    return torch.device("cuda") if torch.cuda.is_available() else None


def remove_all(parts: list[Any]) -> None:
    """``remove()`` each hook handle or hook owner given (None: not made); never raises."""
    for part in parts:
        if part is not None:
            try:
                part.remove()
            except Exception:
                pass


def compiled(model: Any) -> bool:
    """Whether ``model`` runs through torch.compile (``torch.compile(m)`` returns a wrapper
    with ``_orig_mod``; ``m.compile()`` sets ``_compiled_call_impl`` on the module itself),
    possibly inside DDP."""
    seen = 0
    while model is not None and seen < 8:
        seen += 1
        if hasattr(model, "_orig_mod") or getattr(model, "_compiled_call_impl", None) is not None:
            return True
        model = getattr(model, "module", None)
    return False


def wrapped_in_ddp(model: Any) -> bool:
    """Whether ``model`` is (or, inside torch.compile, holds) a DistributedDataParallel."""
    for _ in range(8):
        if model is None:
            return False
        if type(model).__name__ == "DistributedDataParallel":
            return True
        model = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
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


def nonfinite_probes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A float32 vector, one value per tensor, NaN/Inf iff that tensor holds a NaN/Inf.

    The L2 norm of each, accumulated in float32 (NaN and ±Inf propagate), for all of a
    forward pass's module outputs at once: one fused launch on CUDA, and on the CPU one call
    instead of one reduction inside each module's hook, which costs several times more.
    (``ord=inf`` cannot overflow but is ~10x slower on the CPU, where it materialises
    ``abs()``; ``_foreach_max`` misses -Inf.) The only false alarm is a float32 overflow
    of the norm itself: values around 1e19, which float32 training never survives anyway.
    Left on the device.
    """
    with torch.no_grad():  # no autograd graph through the probe
        try:
            return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
        except RuntimeError:  # float64 outputs (no narrowing accumulation), mixed devices
            return norms(tensors)


# Modules whose output is finite whenever their input is (elementwise activations, dropout,
# reshapes: no arithmetic that can overflow or divide). The every-step NaN probe skips them: a
# NaN in their output was already in their input, which the module that produced it was
# probed for; and if that was arithmetic in a parent's forward, the parent's output (probed
# after its children) is the first nonfinite one, which blames the parent — correctly.
FINITE_PRESERVING: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU,
    nn.Mish, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.Softsign,
    nn.Tanhshrink, nn.Softshrink, nn.Hardshrink, nn.Threshold, nn.Softplus, nn.LogSigmoid,
    nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
    nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout, nn.Identity, nn.Flatten,
    nn.Unflatten,
)


class ActivationHooks:
    """Forward hooks on the model's modules: per-step NaN/Inf probes and cadence statistics.

    ``on_output(index, output or None, input or None)``, ``on_input(tensor)`` and
    ``on_end()`` (the model's forward returned) are the recorder's callbacks; hooks
    return immediately while torch.compile traces (telemetry must not cause graph breaks).
    Every step only the modules that need the probe are hooked (``probe=True``: all but
    :data:`FINITE_PRESERVING`; none otherwise) — each hook makes its module's call slower.
    :meth:`hook_all` adds the rest for a statistics step and takes them off again after it.
    """

    def __init__(self, model: nn.Module,
                 on_output: Callable[[int, torch.Tensor | None, torch.Tensor | None], None],
                 on_input: Callable[[torch.Tensor], None], *, probe: bool,
                 on_end: Callable[[], None]) -> None:
        modules = [mod for _, mod in model.named_modules()]
        self.names = [name or "<model>" for name, _ in model.named_modules()]
        self._last: torch.Tensor | None = None
        self.raw: tuple[Any, Any] = (None, None)
        self._cb = on_output
        probed = [probe and not isinstance(mod, FINITE_PRESERVING) for mod in modules]
        self._rest = [(i, mod) for i, (mod, p) in enumerate(zip(modules, probed, strict=True))
                      if not p]
        # (in the modules' own tables, not modhooks.py's: a forward hook there runs after the
        # user's own, which may change the output — the probe must read what the module
        # returned in the end. So torch.save(model) fails on these closures under debug.)
        self.handles = [mod.register_forward_hook(self._make(i))
                        for i, (mod, p) in enumerate(zip(modules, probed, strict=True)) if p]
        self._extra: list[Any] = []
        self.handles.append(model.register_forward_pre_hook(
            lambda _m, args: None if is_compiling() or not torch.is_grad_enabled()
            else _input(args, on_input)))
        # Registered after the root's own output hook, so it runs after it: the end of a
        # forward pass, where the recorder probes the outputs it collected.
        self.handles.append(model.register_forward_hook(
            lambda _m, _i, _o: None if is_compiling() else on_end()))

    def hook_all(self, on: bool) -> None:
        """Hook every module (for a step with activation statistics), or only the probed."""
        if on and not self._extra:
            self._extra = [mod.register_forward_hook(self._make(i)) for i, mod in self._rest]
        elif not on and self._extra:
            for h in self._extra:
                h.remove()
            self._extra = []

    def _make(self, i: int):
        cb = self._cb

        def hook(_mod: nn.Module, inp: Any, out: Any) -> None:
            # Forward passes without autograd (evaluation, generation) are not training
            # steps: recording them would pile up pieces and blame eval NaNs on training.
            if is_compiling() or not torch.is_grad_enabled():
                return
            prev = self._last
            t = first_tensor(out)
            # A container (Sequential, ...) often returns its last child's output: that very
            # tensor was just checked, so skip it.
            if t is None:
                return
            # The module's input too, so that a NaN made by plain code in a parent's forward
            # is blamed on the parent, not on the child it was passed to. Not when it is the
            # output probed just before (a chain: that probe already says it).
            ti = first_tensor(inp)
            self.raw = (t, ti)  # (the call's own output and input: backward probes)
            if t is not prev:
                self._last = t
                cb(i, t, None if ti is None or ti is prev else ti)
            elif ti is not None:
                # A container returning its last child's output: that tensor was just
                # checked; only its input is new (and says whether the container's own
                # code made the NaN its child received).
                cb(i, None, ti)
        return hook

    def remove(self) -> None:
        self.hook_all(False)
        for h in self.handles:
            h.remove()
        self.handles = []


def _input(args: Any, cb: Callable[[torch.Tensor], None]) -> None:
    t = first_tensor(args)
    if t is not None:
        cb(t)
