"""The loss of a step, taken from the tensor ``backward()`` is called on.

Frameworks compute the loss inside their own training step and do not hand it to callbacks
(transformers), or hand it over already divided by the number of accumulated micro-batches
(Lightning, transformers and most hand-written accumulation loops divide each micro-batch's
loss so that the accumulated gradient is the mean's). The tensors ``backward()`` runs on are
therefore what the optimizer step descends on, and their sum over the micro-batches of one
optimizer step is the step's loss in every one of these cases.

``torch.Tensor.backward`` is wrapped (process-wide, while a listener is installed; the
original is called unchanged). Under AMP the tensor is ``GradScaler.scale(loss)``: the scaler's
``scale`` is wrapped too, so that the loss before scaling is the one taken. The value stays on
the device (a detached view): no host-device sync here.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..tensors.hooks import is_compiling

Listener = Callable[[torch.Tensor], None]

_lock = threading.Lock()
# key -> (the thread that trains, listener): only that thread's backward() is its loss (two
# trainings in one process, in two threads, must not add up each other's losses)
_listeners: dict[int, tuple[int | None, Listener]] = {}
_originals: dict[str, Any] = {}
# The last GradScaler.scale output and its input (weakly: never keeps a graph alive).
_scaled: dict[str, Any] = {"out": None, "loss": None}


def _backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if _listeners and not is_compiling():
        try:
            _take(self, args, kwargs)
        except Exception:  # telemetry never changes what backward does
            pass
    return _originals["backward"](self, *args, **kwargs)


def _take(t: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    gradient = args[0] if args else kwargs.get("gradient")
    if gradient is not None or t.numel() != 1 or not t.is_floating_point():
        return  # not a loss (a vector-Jacobian product)
    out = _scaled["out"]
    loss = t
    if out is not None and out() is t and _scaled["loss"] is not None:
        loss = _scaled["loss"]
    loss = loss.detach().reshape(())
    me = threading.get_ident()
    for thread, listener in list(_listeners.values()):
        if thread is None or thread == me:
            listener(loss)


def _scale(self: Any, outputs: Any) -> Any:
    result = _originals["scale"](self, outputs)
    if _listeners and isinstance(outputs, torch.Tensor) and isinstance(result, torch.Tensor):
        try:
            _scaled["out"] = weakref.ref(result)
            _scaled["loss"] = outputs.detach()
        except TypeError:
            pass
    return result


def install(key: int, listener: Listener, *, any_thread: bool = False) -> None:
    """Call ``listener(loss)`` (0-d, detached, on its device) at every ``backward()`` of a
    scalar in this thread (the training thread: the frameworks start their callbacks
    there; ``any_thread``: in every thread), until :func:`uninstall`."""
    with _lock:
        if not _originals:
            _originals["backward"] = torch.Tensor.backward
            torch.Tensor.backward = _backward  # type: ignore[method-assign]
            scaler = getattr(torch.amp, "GradScaler", None)
            if scaler is not None:
                _originals["scaler"] = scaler
                _originals["scale"] = scaler.scale
                scaler.scale = _scale  # type: ignore[method-assign]
        _listeners[key] = (None if any_thread else threading.get_ident(), listener)


def uninstall(key: int) -> None:
    with _lock:
        _listeners.pop(key, None)
        if _listeners or not _originals:
            return
        if torch.Tensor.backward is _backward:
            torch.Tensor.backward = _originals["backward"]  # type: ignore[method-assign]
        scaler = _originals.get("scaler")
        if scaler is not None and scaler.scale is _scale:
            scaler.scale = _originals["scale"]
        _originals.clear()
        _scaled.update(out=None, loss=None)


class StepLoss:
    """Sums the losses of one optimizer step's micro-batches, on the device."""

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None

    def add(self, loss: torch.Tensor) -> None:
        loss = loss.float()
        self._sum = loss if self._sum is None else self._sum + loss

    def take(self) -> torch.Tensor | None:
        value, self._sum = self._sum, None
        return value
