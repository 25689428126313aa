"""AMP: reading the gradients and the loss scale at ``GradScaler.unscale_``.

A step the scaler skips never calls ``optimizer.step()``, so the optimizer pre-hook would
miss exactly the gradients that overflowed. ``unscale_`` runs on every ``scaler.step``
(skipped or not) right after the gradients are unscaled: they are read there.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..capture import Piece, StepAccum


class ScalerHook:
    """Wraps one scaler's ``unscale_`` (an instance attribute, removed again at close) so it
    calls ``on_unscaled()`` after unscaling."""

    def __init__(self, scaler: Any, on_unscaled: Callable[[], None]) -> None:
        self.scaler = scaler
        original = scaler.unscale_
        # weakly: the scaler outlives a recorder that was dropped without close()
        callback = weakref.WeakMethod(on_unscaled)  # type: ignore[arg-type]

        def unscale_(optimizer: torch.optim.Optimizer) -> Any:
            out = original(optimizer)
            fn = callback()
            if fn is not None:
                fn()
            return out

        scaler.unscale_ = unscale_

    def remove(self) -> None:
        try:
            del self.scaler.unscale_  # drop the instance attribute: the method is back
        except AttributeError:
            pass

    def capture_scale(self, acc: StepAccum) -> None:
        """The loss scale this step was trained with, read at unscale_ (before
        scaler.update() changes it for the next step); a device tensor, no sync."""
        scale = getattr(self.scaler, "_scale", None)
        if isinstance(scale, torch.Tensor) and not acc.has("loss_scale"):
            if scale.device.type == "cpu":
                acc.add_scalar("loss_scale", scale)  # read now: CPU, no sync
            else:  # a copy: scaler.update() changes _scale in place before the commit
                acc.add(Piece("loss_scale", 1), scale.detach().reshape(1).float().clone())
