"""Throughput and model FLOPs utilisation: samples/s and tokens/s from each step's batch
shapes (or ``rec.step(tokens=N)``), model FLOPs per step counted once with
``torch.utils.flop_counter.FlopCounterMode`` on the second step (see ``COUNT_STEPS``), and
MFU = FLOPs / step time / the device's peak.

Costs: a shape read per batch (no device sync, nothing copied); one or two early steps
counted under FlopCounterMode (a dispatch mode: those run slower; no other step is touched).
The mode is entered at the model's first forward of the counted step that records a graph
and left at the step's end, never around the user's other code: under ``no_grad`` torch's
FlopCounterMode fails on an expanded parameter fed to a module (``Expected gradient function
to be set``), which would stop an evaluation the loop runs between two steps. A forward of
the model without grad while counting (an evaluation) ends the count unfinished. Without a
model there is nothing to hook, and nothing is counted.
FlopCounterMode counts the matrix products and convolutions (the model FLOPs of the MFU
definition), forward and backward, and nothing of element-wise ops. Not counted under
``torch.compile`` (a dispatch mode around a compiled graph recompiles it): FLOPs and MFU
are then left out. The peak is the ``peak_flops`` knob, else the table below for the
device and the precision the counted step's forward ran in (autocast or parameters in
fp16/bf16: ``half``; fp32 matmuls allowed TF32: ``tf32``; else ``fp32``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..tensors import modhooks

PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # dense (no sparsity) FLOP/s per device, from the vendors' data sheets; the first name
    # contained in torch.cuda.get_device_name() wins (PCIe before the SXM default)
    ("H100 PCIe", {"half": 756e12, "tf32": 378e12, "fp32": 51.2e12}),
    ("H100", {"half": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("H200", {"half": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("A100", {"half": 312e12, "tf32": 156e12, "fp32": 19.5e12}),
    ("MI300X", {"half": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12}),
)
COUNT_STEPS = (1, 2)
"""The steps (0-based, of this recorder) that may be counted: the second, and the third if
its batch shape differs. A counted step runs several times slower under the dispatch mode,
so counting stays inside the first 3 steps, which the step-time checks treat as warm-up;
the first step holds start-up (lazy initialisation, allocator growth). A batch shape first
seen later is scaled from the nearest count by its tokens (else samples)."""


def peak_for(device_name: str | None, precision: str) -> float | None:
    """The table's peak for a device name and ``half`` / ``tf32`` / ``fp32``; None if the
    device is not in the table (give ``peak_flops``)."""
    for pattern, peaks in PEAK_FLOPS:
        if device_name and pattern.lower() in device_name.lower():
            return peaks.get(precision)
    return None


def tokens_of(batch: Any, depth: int = 3) -> int | None:
    """Token positions in a batch of token ids (padding included: pass ``rec.step(tokens=N)``
    for the real count): the ``input_ids`` of a dict (transformers' collators), else the
    first 2-D integer array-like (batch × sequence). A shape read only."""
    import torch

    if isinstance(batch, dict) and "input_ids" in batch:
        return tokens_of(batch["input_ids"], 0)
    dtype, shape = getattr(batch, "dtype", None), getattr(batch, "shape", None)
    if shape is not None:
        ok = len(shape) == 2 and dtype in (torch.int64, torch.int32, torch.int16, torch.uint8)
        return int(shape[0]) * int(shape[1]) if ok else None
    if depth <= 0:
        return None
    items = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else ()
    for item in list(items)[:8]:
        n = tokens_of(item, depth - 1)
        if n is not None:
            return n
    return None


class FlopMeter:
    """The step lifecycle's FLOP counter: ``ended(acc)`` at each step's end (training
    thread) returns that step's FLOPs (counted, scaled from a count, or None) and starts
    counting the next step when its shape has no count yet."""

    def __init__(self, model: Any, peak_flops: float | None,
                 event: Callable[[str, dict[str, Any]], None]) -> None:
        self.model = model
        self.peak_knob = peak_flops
        self.peak: float | None = peak_flops
        self.event = event
        self.counts: dict[tuple[Any, Any], float] = {}
        self._mode: Any = None
        self._hook: Any = None
        self._precision: str | None = None
        self._ended = 0
        self._thread: int | None = None
        self.off = False

    def ended(self, samples: int | None, tokens: int | None) -> float | None:
        shape = (samples, tokens)
        flops = self._stop(shape) if self._mode is not None else None
        self._unhook()  # (the count's hook, or one armed for a step with no training forward)
        if flops is None:
            flops = self._estimate(shape)
        if not self.off and self._ended + 1 in COUNT_STEPS and shape not in self.counts:
            self._arm()  # (counts the next step: the shapes seen so far recur)
        self._ended += 1
        return flops

    def mfu(self, flops: float | None, duration_s: float | None) -> float | None:
        if not flops or not duration_s or not self.peak:
            return None
        return flops / duration_s / self.peak

    def close(self) -> None:
        """A count still open at close ends here, on the thread that opened it only (a
        dispatch mode belongs to its thread's stack; another thread must not pop it)."""
        import threading

        if self._mode is not None and self._thread == threading.get_ident():
            try:
                self._mode.__exit__(None, None, None)
            finally:
                self._mode = None
        self._unhook()

    def _arm(self) -> None:
        """Count the next step from the model's first forward that records a graph (the
        training forward), on this thread."""
        import threading

        if self.model is None:
            self.off = True  # (no model to hook: a mode around the user's code is unsafe)
            return
        self._precision = None
        self._thread = threading.get_ident()
        # (outside the model's own hook table: it pickles as it was, modhooks.py)
        self._hook = modhooks.forward_pre(self.model, self._at_forward)

    def _at_forward(self, module: Any, args: Any) -> None:
        import threading

        import torch
        from torch.utils.flop_counter import FlopCounterMode

        from ..tensors.hooks import is_compiling

        # (inside a compiled region no dispatch mode can be entered, and telemetry must not
        # break the user's graph: a compiled model is not counted)
        if is_compiling() or threading.get_ident() != self._thread:
            return
        if not torch.is_grad_enabled():
            # an evaluation forward: never under the mode (FlopCounterMode + no_grad fails on
            # expanded parameters); a count already running ends unfinished
            if self._mode is not None:
                mode, self._mode = self._mode, None
                mode.__exit__(None, None, None)
                self._unhook()
            return
        if self._mode is None:
            self._note_precision(module, args)
            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()

    def _stop(self, shape: tuple[Any, Any]) -> float | None:
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        flops = float(mode.get_total_flops())
        if flops <= 0:  # no matrix product ran in it (an odd loop): not a count
            self.off = True
            return None
        self.counts[shape] = flops
        if self.peak_knob is None and self.peak is None:
            self.peak, source = self._table_peak(), "table"
        else:
            source = "peak_flops"
        samples, tokens = shape
        self.event(f"model FLOPs per step: {flops:.4g} (torch.utils.flop_counter, batch of "
                   f"{samples} samples / {tokens} tokens)" + (
                       f"; MFU against {self.peak:.4g} FLOP/s ({source})" if self.peak else
                       "; no peak FLOP/s known for this device: give peak_flops= for MFU"),
                   {"flops": flops, "samples": samples, "tokens": tokens,
                    "peak_flops": self.peak, "precision": self._precision})
        return flops

    def _estimate(self, shape: tuple[Any, Any]) -> float | None:
        """A shape not counted: the count of the nearest shape, scaled by tokens (else
        samples); matrix-product FLOPs grow linearly with both (attention's quadratic
        part aside)."""
        if shape in self.counts:
            return self.counts[shape]
        if not self.counts:
            return None
        i = 1 if shape[1] else 0
        known = [(s, f) for s, f in self.counts.items() if s[i]]
        if not shape[i] or not known:
            return next(iter(self.counts.values())) if None in shape else None
        s, f = min(known, key=lambda kv: abs(kv[0][i] - shape[i]))
        return f * shape[i] / s[i]

    def _note_precision(self, module: Any, args: Any) -> None:
        import torch

        if self._precision is not None:
            return
        dev = next((p.device.type for p in module.parameters()), "cpu")
        half = (torch.float16, torch.bfloat16)
        autocast_half = torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) in half
        if autocast_half or next((p.dtype for p in module.parameters()), None) in half:
            self._precision = "half"
        elif dev == "cuda" and torch.get_float32_matmul_precision() != "highest":
            self._precision = "tf32"
        else:
            self._precision = "fp32"

    def _unhook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _table_peak(self) -> float | None:
        import torch

        if self.model is None or not torch.cuda.is_available():
            return None
        dev = next((p.device for p in self.model.parameters()), None)
        if dev is None or dev.type != "cuda":
            return None
        return peak_for(torch.cuda.get_device_name(dev), self._precision or "fp32")


def step_rates(acc: Any, tokens: int | None, meter: FlopMeter | None) -> dict[str, Any]:
    """Throughput and MFU of a step (a StepAccum) from its duration (None where unknown)."""
    d = acc.duration_s if acc.duration_s and acc.duration_s > 0 else None
    return {"samples_per_s": acc.samples / d if d and acc.samples else None,
            "tokens_per_s": tokens / d if d and tokens else None,
            "flops": acc.flops,
            "mfu": meter.mfu(acc.flops, d) if meter is not None else None,
            "new_shapes": acc.new_shapes}


def throughput_columns(run: Any) -> dict[str, Any]:
    """The optional ``steps`` columns of a batch of StepItems, throughput and host CPU
    (None: a column none of them has, e.g. ``cpu_queue_s`` off Linux)."""
    def col(name: str) -> list[Any] | None:
        vals = [getattr(it, name) for it in run]
        return vals if any(v is not None for v in vals) else None
    return {c: col(c) for c in ("samples_per_s", "tokens_per_s", "flops", "mfu", "cpu_s",
                                "cpu_queue_s", "new_shapes")}
