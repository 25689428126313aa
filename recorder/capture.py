"""One recorded step: pieces gathered on the training thread (unpacked by :mod:`.rows`).

During a step the recorder collects small device tensors (loss, metrics, a vector of
per-parameter norms, matrices of full statistics, ...) in a :class:`StepAccum`. When the step
is committed they are concatenated into ONE float32 vector and, on CUDA, copied to pinned
host memory with ONE non-blocking copy whose completion is marked by a CUDA event. The
writer thread waits on that event — the training thread never waits for the GPU — then
turns the vectors of all the steps it finds queued back into rows (:mod:`.rows`).
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Piece:
    """A slice of the step vector: what it is, how many values, and the names of its rows."""

    label: str  # loss | lr | loss_scale | metric | grad_norms | grad | param | update | act_nf
    #             | activation | watch
    n: int
    names: tuple[str, ...] = ()
    numels: tuple[int, ...] = ()
    # Order of each row: forward-completion order (activations), or the parameter position
    # of each value when grad_norms come in a plan's order (stats.NormPlan).
    seqs: tuple[int, ...] = ()
    metric: str | None = None
    # act_nf: True where the output was modified in place after its module returned (its
    # probe saw the later values, so it alone cannot prove the module made a NaN/Inf).
    late: tuple[bool, ...] = ()


@dataclass
class StepAccum:
    """Everything gathered for one recorded step on the training thread."""

    step: int
    tensors: list[torch.Tensor] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    floats: dict[str, list[float]] = field(default_factory=dict)  # loss, lr, loss_scale,
    #                                                                grad_clip
    metrics: dict[str, float] = field(default_factory=dict)
    data_wait_s: float = 0.0
    waited: bool = False
    grads_captured: bool = False
    norms_read: bool = False  # per-parameter norms taken from clip_grad_norm_ (pre-clip)
    stats_read: bool = False  # ... and, on a full-statistics step, the gradient statistics
    snapshotted: bool = False  # the weights were copied for the update ratio (once a step)
    guarded: bool = False  # zero_nonfinite_grads ran before this step's update (once a step)
    # perf_counter() when the batch arrived and when the last watched gradient landed
    # (distributed runs: the rank's own compute before it waits for the all-reduce)
    data_ready: float | None = None
    grad_ready: float | None = None
    opened: float = field(default_factory=time.perf_counter)  # previous step's end
    await_last: bool = False  # optimizer stepped before this cycle's last rec.step()
    scaler: bool = False
    ended: float | None = None  # wall time of the rec.step() that closed it
    duration_s: float | None = None
    cpu_s: float | None = None  # process CPU seconds in the step (cpuclock.py)
    cpu_queue_s: float | None = None  # training thread's run-queue wait (Linux)
    act_seq: int = 0
    samples: int | None = None  # batch sizes of the micro-batches that arrived (shapes)
    tokens: int | None = None  # their token positions; user_tokens: rec.step(tokens=)
    new_shapes: int | None = None  # batches whose signature was new (training/shapes.py)
    user_tokens: int | None = None
    flops: float | None = None  # model FLOPs (throughput.FlopMeter)
    sample_ids: list[int] | None = None  # the sampler's indices of its batches (samples.py)
    lr_used: Any = None  # the learning rate its optimizer step used (read in its pre-hook)
    # Module outputs awaiting their NaN/Inf probe (name, numel, seq, the output itself, its
    # in-place version then), all probed at once when the forward pass ends; then blocks of
    # (names, numels, seqs, late flags, device vector) per forward pass, joined at commit.
    to_probe: list[tuple[str, int, int, torch.Tensor, int]] = field(default_factory=list)
    probes: list[tuple[tuple, tuple, tuple, tuple, torch.Tensor]] = field(
        default_factory=list)
    # Per-module activation statistics (name, numel, seq, [1, 8] tensor, saturated share
    # or None: saturation.py), likewise.
    act_stats: list[tuple[str, int, int, torch.Tensor, Any]] = field(default_factory=list)
    # Gradients of module inputs/outputs kept in backward order (roles label, gradient), then
    # reduced in blocks of (labels, device vector of norms): backward.py
    grad_held: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    grad_held_bytes: int = 0
    grad_probes: list[tuple[tuple[str, ...], torch.Tensor]] = field(default_factory=list)

    def fold(self, extra: StepAccum) -> None:
        """Add a micro-batch's rec.step() (gradient accumulation) into this step."""
        self.tensors.extend(extra.tensors)
        self.pieces.extend(extra.pieces)
        self.to_probe.extend(extra.to_probe)
        self.probes.extend(extra.probes)
        self.act_stats.extend(extra.act_stats)
        self.grad_probes.extend(extra.grad_probes)
        self.grad_held.extend(extra.grad_held)
        self.grad_held_bytes += extra.grad_held_bytes
        self.metrics.update(extra.metrics)
        self.data_wait_s += extra.data_wait_s
        if extra.sample_ids is not None:
            self.sample_ids = (self.sample_ids or []) + extra.sample_ids
        for name in ("samples", "tokens", "user_tokens"):
            if getattr(extra, name) is not None:
                setattr(self, name, (getattr(self, name) or 0) + getattr(extra, name))
        if self.data_ready is None:
            self.data_ready = extra.data_ready
        if extra.lr_used is not None:
            self.lr_used = extra.lr_used
        if extra.grad_ready is not None:
            self.grad_ready = extra.grad_ready
        self.waited = self.waited or extra.waited

    def has(self, label: str) -> bool:
        return label in self.floats or any(p.label == label for p in self.pieces)

    def add(self, piece: Piece, tensor: torch.Tensor) -> None:
        self.pieces.append(piece)
        self.tensors.append(tensor)

    def add_scalar(self, label: str, value: Any, *, metric: str | None = None) -> bool:
        """A loss/metric/lr value: Python numbers stay on the host, device tensors join the
        vector. A CPU tensor is read right away: on the host ``item()`` waits for nothing,
        and it is one op where joining the vector would be four (each op costs ~20 us on a
        training thread whose caches the step has just flushed). False, and nothing added,
        for a value that is not a real number (a string, a complex, a list, a meta tensor,
        an int beyond float range): the caller drops that value only, never the step."""
        if value is None:
            return True
        try:
            if isinstance(value, torch.Tensor):
                n = value.numel()
                if value.is_complex() or value.device.type == "meta":
                    return False
                if n == 0:
                    return True  # an empty tensor carries no value: recorded as null
                if value.device.type == "cpu":
                    v = (value.item() if n == 1
                         else value.detach().float().mean().item())  # CPU: not a sync point
                    return self.add_scalar(label, float(v), metric=metric)
                t = value.detach()
                if n != 1:
                    t = t.float().mean()  # a per-sample loss vector is recorded as its mean
                self.add(Piece(label, 1, metric=metric), t.reshape(1).float())
                return True
            if isinstance(value, (str, bytes, complex)):
                return False
            v = float(value)
        except (TypeError, ValueError, OverflowError, RuntimeError, NotImplementedError):
            return False
        if label == "metric":
            self.metrics[metric or "?"] = v
        else:
            self.floats.setdefault(label, []).append(v)
        return True


def lr_now(optimizer: Any) -> Any:
    """The optimizer's (first param group's) learning rate as it is now, or None: a number,
    or a copy of a tensor LR (a scheduler may change that one in place after the step; the
    copy is a device op, no sync)."""
    try:
        lr = optimizer.param_groups[0].get("lr")
    except (AttributeError, IndexError, TypeError, KeyError):
        return None
    return lr.detach().clone() if isinstance(lr, torch.Tensor) else lr


def pack(acc: StepAccum) -> tuple[torch.Tensor | list[torch.Tensor] | None, Any]:
    """Concatenate the step's device tensors and start their copy to the host.

    Returns (host, cuda_event_or_None). On an accelerator the only device work is one cat
    and, on CUDA, one non-blocking device-to-host copy into pinned memory: no sync. On the
    CPU there is nothing to copy or wait for: the pieces are the recorder's own results
    (norms, statistics; CPU scalars were read as numbers), never modified afterwards, so the
    list itself goes to the writer thread, which reads them — no op on the training thread.
    """
    if not acc.tensors:
        return None, None
    device = next((t.device for t in acc.tensors if t.device.type not in ("cpu", "meta")),
                  None)
    if device is None:
        return list(acc.tensors), None
    # Gather on the accelerator when there is one: a CPU scalar (say, a loss computed on the
    # host) is staged up with a tiny non-blocking copy, and the device pieces never go
    # through an unsynchronised copy into pageable host memory.
    parts = [_staged(t, device) for t in acc.tensors]
    flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
    if device.type == "cuda":
        host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(flat, non_blocking=True)  # the step's one D2H copy, read later
        # Blocking-sync: the writer sleeps in the driver until the GPU passes it, instead
        # of spinning a core (write/devwait.py says what was measured).
        event = torch.cuda.Event(blocking=True)
        event.record()
        return host, event
    # Other accelerators (MPS, XPU, ...) have no pinned-copy + event path here: this
    # blocking copy is a host-device sync point, once per recorded step.
    return flat.to("cpu"), None


def _staged(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` as float32 values on ``device``; NaN in its place where it cannot be moved (a
    piece that slipped past :func:`watchable`): one bad piece never costs the step."""
    try:
        if t.device.type != "meta":
            return t.reshape(-1).to(device=device, dtype=torch.float32, non_blocking=True)
    except Exception:
        pass
    return torch.full((t.numel(),), float("nan"), device=device)


def watchable(name: str, tensor: Any) -> torch.Tensor:
    """``tensor`` as ``rec.watch`` can take it (a dense tensor with values; complex as its
    magnitude); ValueError saying why not, so that only this watch is left out."""
    if not isinstance(tensor, torch.Tensor):
        tensor = torch.as_tensor(tensor)
    why = None
    if tensor.is_meta:
        why = "is a meta tensor (it has no values)"
    elif tensor.is_nested:
        why = "is a nested tensor (pass its components, or .to_padded_tensor(0))"
    elif tensor.is_quantized:
        why = "is quantized (pass .dequantize())"
    elif tensor.layout != torch.strided:
        why = f"has layout {tensor.layout} (pass .to_dense())"
    if why is not None:
        raise ValueError(f"rec.watch({name!r}): the tensor {why}; left out")
    return tensor.abs() if tensor.is_complex() else tensor


def _text(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def _details_json(details: dict[str, Any]) -> str:
    try:
        return json.dumps(details, default=str)
    except (TypeError, ValueError):  # non-string keys, circular references, ...
        return json.dumps({str(k): repr(v) for k, v in details.items()})


def event_row(step: int | None, kind: Any, message: Any, *, severity: str,
              subject: Any, stack: Any, details: dict[str, Any]) -> dict:
    """One events row; every text field coerced to a string here, so one odd value (a
    ``subject=42``) can never make the flush's Arrow conversion fail."""
    return {"step": [step], "time": [time.time()], "kind": [_text(kind)],
            "severity": [severity], "subject": [_text(subject)], "message": [_text(message)],
            "stack": [_text(stack)], "details": [_details_json(details)]}


def exception_row(exc: BaseException, step: int | None, probe: Any) -> dict:
    """The ``exception`` event of an exception that ended training (with its traceback; for
    an out-of-memory error, a memory snapshot)."""
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    details: dict[str, Any] = {"type": type(exc).__name__}
    subject = None
    text = str(exc)
    if "returned nan values" in text.lower() or "nan" in type(exc).__name__.lower():
        details["anomaly"] = True
        subject = text.split("'")[1] if "'" in text else None
    if "out of memory" in text.lower():
        details["oom"] = True
        try:
            details["memory"] = probe.snapshot()
        except Exception:
            pass
    return event_row(step, "exception", f"{type(exc).__name__}: {exc}", severity="critical",
                     subject=subject, stack=stack, details=details)


@dataclass
class StepItem:
    """A committed step on its way to the writer thread (rows made by :mod:`.rows`)."""

    step: int
    time: float
    duration_s: float | None
    data_wait_s: float | None
    floats: dict[str, list[float]]
    metrics: dict[str, float]
    pieces: list[Piece]
    host: torch.Tensor | list[torch.Tensor] | None  # see pack()
    event: Any
    scaler: bool
    memory: bool
    rss: int | None  # read on the training thread at commit (belongs to this step)
    store_grad_norms: bool = True
    compute_s: float | None = None  # distributed: batch arrival -> last gradient ready
    heap: int | None = None  # malloc'd bytes in use, read with rss
    recorder_heap: int | None = None  # ... of which the writer's buffered rows
    cuda: dict[str, Any] | None = None  # the CUDA allocator's counters, read with rss
    sample_ids: list[int] | None = None  # samples.py (at most MAX_IDS)
    samples_per_s: float | None = None  # throughput.py (shapes of the step's batches)
    tokens_per_s: float | None = None
    flops: float | None = None
    mfu: float | None = None
    cpu_s: float | None = None  # cpuclock.py: the process's CPU seconds in the step, and
    cpu_queue_s: float | None = None  # the training thread's wait for a free CPU
    new_shapes: int | None = None  # training/shapes.py: input signatures first seen
