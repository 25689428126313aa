"""One recorded step: pieces gathered on the training thread, unpacked on the writer thread.

During a step the recorder collects small device tensors (loss, metrics, a vector of
per-parameter norms, matrices of full statistics, ...) in a :class:`StepAccum`. When the step
is committed they are concatenated into ONE float32 vector and, on CUDA, copied to pinned
host memory with ONE non-blocking copy whose completion is marked by a CUDA event. The
writer thread waits on that event — the training thread never waits for the GPU — then
turns the vector back into rows (:class:`StepItem`).
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .schema import STAT_COLUMNS

if TYPE_CHECKING:
    from .writer import Writer


@dataclass
class Piece:
    """A slice of the step vector: what it is, how many values, and the names of its rows."""

    label: str  # loss | lr | loss_scale | metric | grad_norms | grad | param | update | act_nf
    #             | activation | watch
    n: int
    names: tuple[str, ...] = ()
    numels: tuple[int, ...] = ()
    seqs: tuple[int, ...] = ()
    metric: str | None = None


@dataclass
class StepAccum:
    """Everything gathered for one recorded step on the training thread."""

    step: int
    tensors: list[torch.Tensor] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)
    floats: dict[str, list[float]] = field(default_factory=dict)  # loss, lr, loss_scale
    metrics: dict[str, float] = field(default_factory=dict)
    data_wait_s: float = 0.0
    waited: bool = False
    grads_captured: bool = False
    await_last: bool = False  # optimizer stepped before this cycle's last rec.step()
    scaler: bool = False
    ended: float | None = None  # wall time of the rec.step() that closed it
    duration_s: float | None = None
    act_seq: int = 0
    # Per-module NaN/Inf probes (name, numel, seq, 0-d device tensor), stacked at commit.
    probes: list[tuple[str, int, int, torch.Tensor]] = field(default_factory=list)

    def has(self, label: str) -> bool:
        return label in self.floats or any(p.label == label for p in self.pieces)

    def add(self, piece: Piece, tensor: torch.Tensor) -> None:
        self.pieces.append(piece)
        self.tensors.append(tensor)

    def add_scalar(self, label: str, value: Any, *, metric: str | None = None) -> None:
        """A loss/metric/lr value: Python numbers stay on the host, tensors join the vector."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            t = value.detach()
            if t.numel() == 0:
                return  # an empty tensor carries no value: recorded as null
            if t.numel() != 1:
                t = t.float().mean()  # a per-sample loss vector is recorded as its mean
            self.add(Piece(label, 1, metric=metric), t.reshape(1).float())
            return
        v = float(value)
        if label == "metric":
            self.metrics[metric or "?"] = v
        else:
            self.floats.setdefault(label, []).append(v)


def pack(acc: StepAccum) -> tuple[torch.Tensor | None, Any]:
    """Concatenate the step's device tensors and start their copy to the host.

    Returns (host_vector, cuda_event_or_None). The only device work is one cat and, on CUDA,
    one non-blocking device-to-host copy into pinned memory: no sync.
    """
    if not acc.tensors:
        return None, None
    # Gather on the accelerator when there is one: a CPU scalar (say, a loss computed on the
    # host) is staged up with a tiny non-blocking copy, and the device pieces never go
    # through an unsynchronised copy into pageable host memory.
    device = next((t.device for t in acc.tensors if t.device.type != "cpu"),
                  acc.tensors[0].device)
    parts = [t.reshape(-1).to(device=device, dtype=torch.float32, non_blocking=True)
             for t in acc.tensors]
    flat = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
    if device.type == "cuda":
        host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
        host.copy_(flat, non_blocking=True)  # the step's one D2H copy, read later
        event = torch.cuda.Event()
        event.record()
        return host, event
    if device.type != "cpu":
        # Other accelerators (MPS, XPU, ...) have no pinned-copy + event path here: this
        # blocking copy is a host-device sync point, once per recorded step.
        return flat.to("cpu"), None
    return flat, None


@dataclass
class StepItem:
    """A committed step on its way to the writer thread (callable there)."""

    step: int
    time: float
    duration_s: float | None
    data_wait_s: float | None
    floats: dict[str, list[float]]
    metrics: dict[str, float]
    pieces: list[Piece]
    host: torch.Tensor | None
    event: Any
    scaler: bool
    memory: bool
    probe: Any  # MemoryProbe
    rss: int | None  # read on the training thread at commit (belongs to this step)
    nonfinite_state: dict[str, Any]  # writer-side memory of what was already reported
    store_grad_norms: bool = True

    def __call__(self, w: Writer) -> None:
        if self.event is not None:
            # Waits for the GPU on the writer thread; the training thread has moved on.
            self.event.synchronize()
        w.step_hint = self.step
        vec = self.host.numpy() if self.host is not None else np.empty(0, np.float32)
        # Several values of one label come from folded micro-batches: the step's loss is
        # their mean, lr and loss scale the last one.
        floats: dict[str, list[float]] = {k: list(v) for k, v in self.floats.items()}
        metrics = dict(self.metrics)
        grad_norms: np.ndarray | None = None
        grad_names: tuple[str, ...] = ()
        full_grads = False
        off = 0
        for p in self.pieces:
            seg = vec[off: off + p.n]
            off += p.n
            if p.label in ("loss", "lr", "loss_scale"):
                floats.setdefault(p.label, []).append(float(seg[0]))
            elif p.label == "metric":
                metrics[p.metric or "?"] = float(seg[0])
            elif p.label == "grad_norms":
                grad_norms, grad_names = seg.astype(np.float64), p.names
            elif p.label == "act_nf":
                self._activation_nonfinite(w, p, seg)
            else:
                self._stat_rows(w, p, seg)
                full_grads = full_grads or p.label == "grad"
        losses = floats.get("loss")
        loss = math.fsum(losses) / len(losses) if losses else None
        grad_norm = nonfinite_grads = None
        if grad_norms is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                grad_norm = float(np.sqrt(np.dot(grad_norms, grad_norms)))
            bad = ~np.isfinite(grad_norms)
            nonfinite_grads = int(bad.sum())
            # Full gradient statistics (when computed this step) already carry the norm.
            if self.store_grad_norms and not full_grads:
                n = len(grad_names)
                w.append("tensor_stats", {"step": np.full(n, self.step, dtype=np.int64),
                                          "name": _names(grad_names), "kind": _kinds("grad", n),
                                          "norm": grad_norms})
            if nonfinite_grads:
                first = grad_names[int(np.argmax(bad))]
                self._report_nonfinite(w, "gradient", first, f"gradient of {first} holds "
                                       f"NaN/Inf ({nonfinite_grads} gradient tensor(s))")
        if loss is not None and not math.isfinite(loss):
            self._report_nonfinite(w, "loss", "loss", f"loss is {loss}")
        w.append("steps", {
            "step": [self.step], "time": [self.time], "duration_s": [self.duration_s],
            "data_wait_s": [self.data_wait_s], "loss": [loss],
            "lr": [floats["lr"][-1] if floats.get("lr") else None],
            "grad_norm": [grad_norm], "nonfinite_grads": [nonfinite_grads],
            "loss_scale": [floats["loss_scale"][-1] if floats.get("loss_scale") else None],
            "amp_skipped": [bool(nonfinite_grads) if self.scaler and nonfinite_grads is not None
                            else None],
        })
        if metrics:
            w.append("metrics", {"step": [self.step] * len(metrics),
                                 "name": list(metrics), "value": list(metrics.values())})
        if self.memory and self.probe is not None:
            snap = self.probe.snapshot(self.rss)
            w.append("memory", {"step": [self.step], "time": [time.time()],
                                **{k: [v] for k, v in snap.items()}})

    # -- helpers (writer thread) -------------------------------------------------------
    def _stat_rows(self, w: Writer, p: Piece, seg: np.ndarray) -> None:
        n = len(p.names)
        m = seg.reshape(n, -1)
        cols: dict[str, Any] = {"step": np.full(n, self.step, dtype=np.int64),
                                "name": _names(p.names), "kind": _kinds(p.label, n),
                                "numel": np.asarray(p.numels, dtype=np.int64)}
        if p.label == "update":
            upd, weight = m[:, 0].astype(np.float64), m[:, 1].astype(np.float64)
            cols["norm"] = upd
            with np.errstate(divide="ignore", invalid="ignore"):
                cols["ratio"] = np.where(weight > 0, upd / weight, np.nan)
        else:
            for i, name in enumerate(STAT_COLUMNS):
                cols[name] = m[:, i]
            empty = cols["numel"] == 0
            if empty.any():  # an empty tensor has no mean, min, ...: null, not NaN
                for name in ("absmax", "mean", "std", "min", "max", "zero_frac"):
                    col = cols[name].astype(object)
                    col[empty] = None
                    cols[name] = list(col)
        if p.seqs:
            cols["seq"] = np.asarray(p.seqs, dtype=np.int32)
        w.append("tensor_stats", cols)

    def _activation_nonfinite(self, w: Writer, p: Piece, seg: np.ndarray) -> None:
        """Per-step NaN/Inf probes of module outputs (a sum each, nonfinite iff the output
        held NaN/Inf): rows only when something went bad, with nonfinite = 1 for the
        modules whose output did (a flag, not a count: counts come with the full
        activation statistics at their cadence)."""
        bad = ~np.isfinite(seg)
        if not bad.any():
            return
        seg = bad.astype(np.float64)
        n = len(p.names)
        w.append("tensor_stats", {"step": np.full(n, self.step, dtype=np.int64),
                                  "name": _names(p.names), "kind": _kinds("activation", n),
                                  "numel": np.asarray(p.numels, dtype=np.int64),
                                  "nonfinite": seg, "seq": np.asarray(p.seqs, dtype=np.int32)})
        first = int(np.argmax(seg > 0))  # pieces are in forward-completion order
        name = p.names[first]
        where = "the input batch" if name == "<input>" else f"the output of module {name!r}"
        self._report_nonfinite(w, "activation", name, f"NaN/Inf first appeared in {where}")

    def _report_nonfinite(self, w: Writer, what: str, subject: str, message: str) -> None:
        """One event per kind of nonfinite value, at its first occurrence."""
        st = self.nonfinite_state
        if what in st:
            st[what + "_count"] = st.get(what + "_count", 1) + 1
            return
        st[what] = self.step
        w.event("nonfinite", f"step {self.step}: {message}", severity="error",
                subject=subject, step=self.step, source=what)


@functools.lru_cache(maxsize=64)
def _names(names: tuple[str, ...]) -> np.ndarray:
    """Names as an object array, built once per distinct tuple (the same every step)."""
    return np.array(names, dtype=object)


@functools.lru_cache(maxsize=256)
def _kinds(kind: str, n: int) -> np.ndarray:
    return np.full(n, kind, dtype=object)


def event_row(step: int | None, kind: str, message: str, *, severity: str,
              subject: str | None, stack: str | None, details: dict[str, Any]) -> dict:
    return {"step": [step], "time": [time.time()], "kind": [kind], "severity": [severity],
            "subject": [subject], "message": [message], "stack": [stack],
            "details": [json.dumps(details, default=str)]}
