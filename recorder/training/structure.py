"""What the model's structure says about its gradients, read once, in the first training
forward pass: which modules ran, and which parameter's gradient is zero by construction.

A bias added right before a normalisation that subtracts the per-channel mean over the batch
(BatchNorm in training mode) or over each sample (InstanceNorm) cannot change the output:
its gradient is exactly zero in exact arithmetic, float rounding noise in practice
(``nn.Conv2d(..., bias=True)`` followed by ``nn.BatchNorm2d`` is the common case). Which
module consumes which output is seen by identity: the producer's forward hook remembers the
tensor it returned, the normalisation's pre-hook looks its input up. Plain code in between
(an activation, a view) makes another tensor, so nothing is claimed then.

Hooks live for that one forward pass only, outside the modules (``tensors/modhooks.py``:
the user's model pickles as it was). The pass begins at the model's own forward, or,
when the training loop never calls the model itself (a LightningModule whose
``training_step`` calls ``self.net(x)``), at the first hooked module that runs in training
mode; it ends at the model's forward hook, or else at the end of the first step
(:meth:`StructureProbe.end_pass`, called by the recorder). Hooks left on every module for
the whole run cost ~0.5 ms a step in PyTorch's hooked call path, and the event was never
written. The result is one ``model_structure`` event (info)
with ``zero_by_construction`` ([{param, consumer, consumer_type, why}]) and ``not_called``
(modules holding parameters whose forward did not run in that pass).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..tensors import modhooks
from ..tensors.hooks import is_compiling
from ..tensors.saturation import bound_kind

_MEAN_REMOVING = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
"""Normalisations that remove every channel's mean (so a per-channel bias before them)."""


class StructureProbe:
    """Hooks for one training forward pass of ``model`` (see the module docstring)."""

    def __init__(self, model: nn.Module, emit: Callable[[str, dict[str, Any]], None]) -> None:
        self.emit = emit
        self.model = model
        self.handles: list[Any] = []
        # id -> (producer, weak reference): the outputs are not kept alive (the pass may last
        # a whole first step), and a dead reference never matches a new tensor with its id
        self.outputs: dict[int, tuple[str, weakref.ref[torch.Tensor]]] = {}
        self.called: set[str] = set()
        self.pairs: list[dict[str, str]] = []
        self.active = False
        self.with_params = [n for n, m in model.named_modules()
                            if any(True for _ in m.parameters(recurse=False))]
        # (first: the root's own parameter pre-hook must see the pass as begun)
        self.handles.append(modhooks.forward_pre(model, self._begin, prepend=True))
        owners = set(self.with_params)
        for name, m in model.named_modules():
            bias = getattr(m, "bias", None)
            if isinstance(bias, nn.Parameter) and bias.requires_grad:
                self.handles.append(modhooks.forward(m, self._produced(name)))
            if isinstance(m, _MEAN_REMOVING):
                self.handles.append(modhooks.forward_pre(m, self._consumed(name)))
            if name in owners:
                self.handles.append(modhooks.forward_pre(m, self._called(name)))
        self.handles.append(modhooks.forward(model, self._end))

    def _training(self) -> bool:
        return self.model.training and torch.is_grad_enabled()

    def _begin(self, _m: nn.Module, _args: Any) -> None:
        # (a sanity-check pass in eval mode or under no_grad says nothing about training; a
        # pass torch.compile traces is not watched: telemetry never enters a graph)
        self.active = self._training() and not is_compiling()

    def _on(self) -> bool:
        """Whether a pass is on. A hooked module that runs in training mode while none is
        begins one: the loop trains without calling the model itself (the pass then ends at
        the step's end). Once a pass ends the hooks are gone, so none begins twice."""
        if not self.active and self._training() and not is_compiling():
            self.active = True
        return self.active

    def _called(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any) -> None:
            if self._on():
                self.called.add(name)
        return hook

    def _produced(self, name: str) -> Callable[..., None]:
        def hook(_m: nn.Module, _args: Any, out: Any) -> None:
            if self._on() and isinstance(out, torch.Tensor):
                self.outputs[id(out)] = (name, weakref.ref(out))
        return hook

    def _consumed(self, name: str) -> Callable[..., None]:
        def hook(m: nn.Module, args: Any) -> None:
            try:
                self._pair(name, m, args)
            except Exception:  # (never break the forward pass)
                pass
        return hook

    def _pair(self, name: str, m: nn.Module, args: Any) -> None:
        if not (self._on() and m.training and args and isinstance(args[0], torch.Tensor)):
            return
        hit = self.outputs.get(id(args[0]))
        if hit is None or hit[1]() is not args[0]:
            return
        producer = hit[0]
        pm = self.model.get_submodule(producer) if producer else self.model
        bias = getattr(pm, "bias", None)
        if not isinstance(bias, torch.Tensor) or bias.ndim != 1:
            return
        channels = args[0].shape[1] if args[0].ndim >= 2 else None
        if channels != bias.shape[0]:
            return  # a bias over another dimension than the one normalised per channel
        what = type(m).__name__
        self.pairs.append({
            "param": f"{producer}.bias" if producer else "bias", "consumer": name,
            "consumer_type": what,
            "why": f"{what} removes each channel's mean, so the bias before it cannot "
                   "change the output: its gradient is zero up to float rounding"})

    def _end(self, _m: nn.Module, _args: Any, out: Any) -> None:
        try:
            self._finish(out)
        except Exception:  # the probe must never break the forward pass it watches
            self.remove()

    def _finish(self, out: Any) -> None:
        if not self.active:
            return
        self.active = False
        details = {"zero_by_construction": self.pairs,
                   "not_called": [n for n in self.with_params if n not in self.called][:4096],
                   "output_features": _features(out),
                   # bounded activations (saturation.py) by kind, for saturated_activation
                   "bounded": {n or "<model>": k[0] for n, m in self.model.named_modules()
                               if (k := bound_kind(m)) is not None}}
        self.remove()
        zero = ", ".join(p["param"] for p in self.pairs[:5])
        self.emit(f"{len(self.pairs)} parameter(s) with a gradient zero by construction"
                  + (f" ({zero})" if zero else "") + f"; {len(details['not_called'])} "
                  "module(s) holding parameters not called in the first training forward",
                  details)

    def end_pass(self) -> None:
        """The first step ended: a pass the model's own hook did not close (the loop never
        called the model) ends here, without the model's output. No pass at all by then
        (the loop trains a module this probe does not hook): nothing to say, and the hooks
        go, never to cost a step again."""
        if not self.handles:
            return
        try:
            if self.active:
                self._finish(None)
        except Exception:
            pass
        self.remove()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.outputs = {}


def _features(out: Any) -> int | None:
    """The last dimension of the model's largest floating-point output of ≥ 2 dimensions
    (the logits: classes, or vocabulary size), for the analyzer's chance level. A shape
    read, no device work."""
    if isinstance(out, torch.Tensor):
        items = [out]
    elif isinstance(out, dict):  # (transformers' ModelOutput is an OrderedDict)
        items = list(out.values())
    elif isinstance(out, (list, tuple)):
        items = list(out)
    else:
        items = [out]
    ts = [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()
          and t.ndim >= 2 and t.shape[-1] >= 2]
    return int(max(ts, key=lambda t: t.numel()).shape[-1]) if ts else None
