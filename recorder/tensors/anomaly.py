"""``anomaly_mode``: ``torch.autograd`` anomaly detection, always (``True``: 5-20x slower) or
``"after_nonfinite"`` (the debug preset's): off, costing nothing, until the recorder sees the
first nonfinite loss or gradient (on its writer thread, a step or two later: no sync is
added to find out); then on for ``anomaly_steps`` steps with ``check_nan=True``. The
backward that meets a NaN then fails in the op that made it, and its forward stack is
printed by autograd: both are kept as an ``anomaly`` event (the op, the user's frame). With
``anomaly_action="record"`` training goes on: that backward's error is caught, the step's
gradients are dropped (the optimizer step changes nothing, as a GradScaler's skip does), and
the window closes after its steps, to open again if NaNs come back; ``"raise"`` re-raises
the error in the training script.

Catching the error needs ``torch.Tensor.backward`` (and ``torch.autograd.backward``)
wrapped, only while the window is open, and only on the training thread.
"""

from __future__ import annotations

import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch


def _own_dirs() -> tuple[str, ...]:
    """Where this package's code lives (recorder, format: frames of ours, not the user's)."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    import tracealyze.format as fmt

    return (here + os.sep, os.path.dirname(os.path.abspath(fmt.__file__ or "")) + os.sep)


def user_frame(stack: str) -> str | None:
    """The last frame of a traceback text outside torch and this package (file:line)."""
    frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    own = _own_dirs()
    for f in reversed(frames):
        path = f.split('"')[1] if '"' in f else f
        if "/torch/" not in path and not path.startswith(own):
            line = f.split("line ")[1].split(",")[0] if "line " in f else "?"
            return f"{path}:{line}"
    return None


MAX_WINDOWS = 3
"""Windows a run opens at most. A run whose NaNs never stop (weights gone NaN, no guard in
the loop) would otherwise run in anomaly mode, 5-20x slower, for the rest of the run; what
made the NaN is caught in the first window, and recurring ones in the next two."""


class AnomalyWindow:
    """The after_nonfinite window of one Recorder. ``nonfinite_seen()`` from any thread;
    ``step_ended()`` and ``close()`` on the training thread."""

    def __init__(self, steps: int, action: str, event: Callable[..., None],
                 params: Callable[[], list[Any]], scaled: bool = False) -> None:
        self.steps, self.action, self.event, self.params = steps, action, event, params
        self.scaled = scaled  # a GradScaler steps the optimizer
        self.pending = False
        self.left = 0
        self.active = False
        self.caught = 0
        self.opened = 0  # windows so far (at most MAX_WINDOWS)
        self._thread: int | None = None
        self._orig: dict[str, Any] = {}

    def nonfinite_seen(self) -> None:
        if not self.active and self.opened < MAX_WINDOWS:
            self.pending = True

    def step_ended(self) -> None:
        if self.active:
            self.left -= 1
            if self.left <= 0:
                self._off("its steps are over")
        elif self.pending:
            self.pending = False
            self._on()

    def close(self) -> None:
        if self.active:
            self._off("the run is closing")

    def _on(self) -> None:
        self.opened += 1
        self._thread = threading.get_ident()
        torch.autograd.set_detect_anomaly(True, check_nan=True)
        self._orig = {"tensor": torch.Tensor.backward, "autograd": torch.autograd.backward}
        window = self

        def tensor_backward(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            return window._run(window._orig["tensor"], t, *a, **k)

        def autograd_backward(*a: Any, **k: Any) -> Any:
            return window._run(window._orig["autograd"], *a, **k)

        torch.Tensor.backward = tensor_backward  # type: ignore[method-assign]
        torch.autograd.backward = autograd_backward
        self.active, self.left = True, self.steps
        self.event("anomaly_mode", f"nonfinite values seen: autograd anomaly detection is on "
                   f"for the next {self.steps} steps (anomaly_mode='after_nonfinite')",
                   severity="info", steps=self.steps, action=self.action)

    def _off(self, why: str) -> None:
        torch.autograd.set_detect_anomaly(False)
        if self._orig:
            torch.Tensor.backward = self._orig["tensor"]  # type: ignore[method-assign]
            torch.autograd.backward = self._orig["autograd"]
            self._orig = {}
        self.active = False
        self.event("anomaly_mode", f"autograd anomaly detection is off again ({why}; "
                   f"{self.caught} anomalous backward pass(es) caught)", severity="info",
                   caught=self.caught)

    def _run(self, fn: Callable[..., Any], *a: Any, **k: Any) -> Any:
        if threading.get_ident() != self._thread:
            return fn(*a, **k)
        # autograd's warning with the forward traceback is read here, where it is raised
        # (a showwarning hook misses it under catch_warnings, as in pytest); every warning
        # is passed on afterwards, through the user's own filters
        seen: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                return fn(*a, **k)
        except RuntimeError as e:
            if "returned nan values" not in str(e):
                raise
            self._caught(e, next((str(w.message) for w in seen
                                  if "Error detected in" in str(w.message)), None))
            if self.action == "raise":
                raise
            self._drop_gradients()
            return None
        finally:
            for w in seen:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    def _caught(self, e: RuntimeError, forward: str | None) -> None:
        self.caught += 1
        op = str(e).split("'")[1] if "'" in str(e) else None
        # where the NaN was made: the forward call of the op (autograd's traceback), else
        # where backward() was called
        stack = forward or "".join(traceback.format_stack()[:-2]) + str(e)
        self.event("anomaly", f"autograd anomaly: {e}", severity="error", subject=op,
                   stack=stack, op=op, user_frame=user_frame(stack), action=self.action,
                   stack_of="forward" if forward else "backward call")

    def _drop_gradients(self) -> None:
        """The step's gradients are incomplete: none may be applied. A GradScaler must still
        see them (and skip the step as for an overflow): NaN, for every trainable parameter
        (the backward may have stopped before reaching any of them, and a scaler that finds
        no gradient at all raises "No inf checks were recorded"); else dropped."""
        for p in self.params():
            if self.scaled and p.requires_grad:
                if p.grad is None:
                    p.grad = torch.full_like(p, float("nan"))
                else:
                    p.grad.fill_(float("nan"))
            elif p.grad is not None and not self.scaled:
                p.grad = None

def start(rec: Any) -> AnomalyWindow | None:
    """The Recorder's anomaly mode at start: on for good (``True``), or a window that the
    writer's nonfinite rows open (``"after_nonfinite"``)."""
    mode = rec.config.anomaly_mode
    if mode is True:
        torch.autograd.set_detect_anomaly(True)
    if mode != "after_nonfinite":
        return None
    window = AnomalyWindow(rec.config.anomaly_steps, rec.config.anomaly_action, rec.event,
                           lambda: [p for _, p in rec._named_params],
                           scaled=rec.scaler is not None)
    rec._writer.steps.nonfinite_state["on_nonfinite"] = window.nonfinite_seen
    return window


def stop(rec: Any) -> None:
    if rec.config.anomaly_mode is True:
        torch.autograd.set_detect_anomaly(False)
    window = getattr(getattr(rec, "_life", None), "anomaly", None)
    if window is not None:
        window.close()
