"""Writer-thread side of recorded steps: committed steps turned into table rows.

The writer hands over every committed step it finds queued at once. Consecutive steps with
the same layout (the same pieces in the same order — the every-step case) become rows
together: their host vectors are stacked into one ``[steps, values]`` matrix and each column
is a slice of it, so the writer's cost per step is a few NumPy operations however many
tensors the model has, and one append per table per batch. Steps at a statistics cadence
(full gradient/parameter/activation statistics) add their per-tensor matrices on top.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..capture import StepItem
from ..tensors.backward import origin
from ..training.throughput import throughput_columns
from .buffers import Codes
from .devwait import wait_for
from .hist_rows import hist_columns
from .schema import STAT_COLUMNS

if TYPE_CHECKING:

    from ..capture import Piece


class Writer(Protocol):
    """What rows are handed to (:class:`.writer.Writer`; a protocol here, since the writer
    owns a ``StepRows`` and imports this module)."""

    step_hint: int | None

    def append(self, table: str, columns: dict[str, Any]) -> None: ...

    def event(self, kind: str, message: str, **kw: Any) -> None: ...

    def record_error(self, where: str, exc: BaseException) -> None: ...


# What a batch produces, appended only once everything is computed (so a batch that fails
# half-way can be redone step by step without duplicating rows).
_Out = list[tuple[str, dict[str, Any]]]


class StepRows:
    """How committed steps become rows: the writer's, with the writer-side state it keeps
    between batches (the memory probe that reads the allocator counters here, and which
    kinds of nonfinite value were reported already)."""

    def __init__(self, probe: Any = None) -> None:
        self.probe = probe  # MemoryProbe
        self.nonfinite_state: dict[str, Any] = {}

    def write(self, w: Writer, items: Sequence[StepItem]) -> None:
        """Append the rows of ``items`` (consecutive committed steps) to ``w``'s tables."""
        write_steps(w, items, self)


def write_steps(w: Writer, items: Sequence[StepItem], ctx: StepRows) -> None:
    """Append the rows of ``items`` (consecutive committed steps) to the writer's tables."""
    for it in items:
        if it.event is not None:
            wait_for(it.event)
    keys = [tuple((p.label, p.n, p.names, p.metric) for p in it.pieces) for it in items]
    start = 0
    for k in range(1, len(items) + 1):
        if k == len(items) or keys[k] != keys[start]:
            run = items[start:k]
            try:
                _append(w, _rows(run, ctx))
            except Exception as exc:
                if len(run) == 1:
                    raise
                # Something in this batch cannot be converted: redo it step by step, so only
                # the offending step is lost.
                w.record_error("writer", exc)
                for it in run:
                    try:
                        _append(w, _rows([it], ctx))
                    except Exception as exc1:
                        w.record_error("writer", exc1)
            start = k
    if items:
        w.step_hint = items[-1].step


def _append(w: Writer, out: _Out) -> None:
    for table, cols in out:
        if table == "event":
            w.event(**cols)
        elif table == "error":
            w.record_error("writer", cols["exc"])
        else:
            w.append(table, cols)


def _rows(run: Sequence[StepItem], ctx: StepRows) -> _Out:
    """Rows of steps that share one layout."""
    first = run[0]
    n = len(run)
    steps = np.fromiter((it.step for it in run), np.int64, n)
    width = sum(p.n for p in first.pieces)
    if width:
        mat = (np.stack([_vector(it.host) for it in run]) if n > 1
               else _vector(first.host).reshape(1, -1))
    else:
        mat = np.empty((n, 0), np.float32)
    out: _Out = []
    loss_cols: list[np.ndarray] = []
    lr = scale = None
    tmetrics: dict[str, np.ndarray] = {}
    norms: np.ndarray | None = None
    norm_names: tuple[str, ...] = ()
    norm_pos: tuple[int, ...] = ()  # parameter position of each norm (empty: in order)
    full_grads = False
    off = 0
    for j, p in enumerate(first.pieces):
        block = mat[:, off: off + p.n]
        off += p.n
        label = p.label
        if label == "loss":
            loss_cols.append(block[:, 0])
        elif label == "lr":
            lr = block[:, 0]  # several values (folded micro-batches): the last one
        elif label == "loss_scale":
            scale = block[:, 0]
        elif label == "metric":
            tmetrics[p.metric or "?"] = block[:, 0]
        elif label == "grad_norms":
            norms, norm_names, norm_pos = block.astype(np.float64), p.names, p.seqs
        elif label == "act_bnf":  # backward NaN probes (backward.py)
            bad = ~np.isfinite(block)
            for r in np.flatnonzero(bad.any(axis=1)):
                found = origin(run[r].pieces[j].names, bad[r])
                if found is not None:
                    _report_nonfinite(out, ctx.nonfinite_state, run[r], "backward", *found)
        elif label == "act_nf":
            bad = ~np.isfinite(block)
            for r in np.flatnonzero(bad.any(axis=1)):
                piece = run[r].pieces[j]
                late = np.asarray(piece.late, dtype=bool) if piece.late else False
                # Only outputs changed in place later look nonfinite (say masked_fill_(-inf)
                # on a projection, every step): nothing proves a module made a NaN/Inf.
                if (bad[r] & ~late).any():
                    _activation_nonfinite(out, ctx.nonfinite_state, run[r], piece, bad[r])
        elif label.startswith("hist_"):
            out += [("histograms", hist_columns(it.step, it.pieces[j], block[r]))
                    for r, it in enumerate(run)]
        elif label != "act_sat":  # (the saturated shares join their activation rows)
            nxt = first.pieces[j + 1] if j + 1 < len(first.pieces) else None
            sat = mat[:, off: off + nxt.n] if nxt is not None and nxt.label == "act_sat" \
                else None
            for r, it in enumerate(run):
                cols = _stat_columns(it.step, it.pieces[j], block[r])
                if sat is not None and label == "activation":  # (NaN: not bounded: null)
                    cols["sat_frac"] = [None if v != v else float(v) for v in sat[r]]
                out.append(("tensor_stats", cols))
            full_grads = full_grads or label == "grad"

    # Loss: the mean of the step's values (folded micro-batches), tensors and Python numbers.
    total = np.zeros(n)
    count = np.full(n, len(loss_cols))
    for col in loss_cols:
        total += col
    for r, it in enumerate(run):
        if it.floats:
            py = it.floats.get("loss")
            if py:
                total[r] += math.fsum(py)
                count[r] += len(py)
    has_loss = count > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = total / count
    for r in np.flatnonzero(has_loss & ~np.isfinite(loss)):
        _report_nonfinite(out, ctx.nonfinite_state, run[r], "loss", "loss",
                          f"loss is {float(loss[r])}")

    grad_norm = nonfinite = amp_skipped = None
    if norms is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            grad_norm = np.sqrt(np.einsum("ij,ij->i", norms, norms))
        bad = ~np.isfinite(norms)
        nonfinite = bad.sum(axis=1).astype(np.int32)
        # Full gradient statistics (when computed this step) already carry the norm.
        if first.store_grad_norms and not full_grads and norm_names:
            k = len(norm_names)
            out.append(("tensor_stats", {
                "step": np.repeat(steps, k), "name": Codes(norm_names, _tiled(k, n)),
                "kind": Codes(("grad",), np.zeros(n * k, np.int32)), "norm": norms.ravel()}))
        for r in np.flatnonzero(nonfinite):
            name = norm_names[_first_bad(bad[r], norm_pos)]
            _report_nonfinite(out, ctx.nonfinite_state, run[r], "gradient", name,
                              f"gradient of {name} holds NaN/Inf "
                              f"({int(nonfinite[r])} gradient tensor(s))")
        if any(it.scaler for it in run):
            amp_skipped = [bool(v) if it.scaler else None
                           for v, it in zip(nonfinite, run, strict=True)]

    out.append(("steps", {
        "step": steps, "time": np.fromiter((it.time for it in run), np.float64, n),
        "duration_s": [it.duration_s for it in run],
        "data_wait_s": [it.data_wait_s for it in run],
        "loss": _nullable(loss, has_loss), "lr": _last(run, "lr", lr),
        "grad_norm": grad_norm, "nonfinite_grads": nonfinite,
        "loss_scale": _last(run, "loss_scale", scale), "amp_skipped": amp_skipped,
        "grad_clip_max": _last(run, "grad_clip", None),
        "compute_s": ([it.compute_s for it in run]
                      if any(it.compute_s is not None for it in run) else None),
        **throughput_columns(run),
        "sample_ids": ([it.sample_ids for it in run]
                       if any(it.sample_ids is not None for it in run) else None),
    }))
    _metric_rows(out, run, steps, tmetrics)
    if ctx.probe is not None:
        _memory_rows(out, [it for it in run if it.memory], ctx.probe)
    return out


def _first_bad(bad: np.ndarray, pos: tuple[int, ...]) -> int:
    """Index of the first flagged value in parameter order (``pos``: each value's parameter
    position when the values come in another order; empty when they are in order)."""
    if not pos:
        return int(np.argmax(bad))
    idx = np.flatnonzero(bad)
    return int(idx[np.argmin(np.asarray(pos)[idx])])


def _memory_rows(out: _Out, mem: list[StepItem], probe: Any) -> None:
    """Memory snapshots (RSS, heap and CUDA counters were read at commit). A failed
    snapshot loses that row only, and is recorded as a recorder error."""
    rows = []
    for it in mem:
        try:
            rows.append((it, probe.snapshot(it.rss, it.heap, it.cuda, it.recorder_heap)))
        except Exception as exc:
            out.append(("error", {"exc": exc}))
    if rows:
        keys = rows[0][1]
        out.append(("memory", {"step": [it.step for it, _ in rows],
                               "time": [it.time for it, _ in rows],
                               **{key: [snap.get(key) for _, snap in rows] for key in keys}}))


def _vector(host: Any) -> np.ndarray:
    """A step's values as one float32 vector: the pinned copy (accelerators), or the CPU
    pieces themselves (see capture.pack)."""
    if isinstance(host, list):
        parts = [_numpy(t) for t in host]
        return (np.concatenate(parts, dtype=np.float32) if len(parts) > 1
                else parts[0].astype(np.float32, copy=False))
    return host.numpy()


def _numpy(t: Any) -> np.ndarray:
    """One piece's values; NaN of its size where it cannot be read (each piece on its own:
    one bad piece never costs the step's other values)."""
    try:
        return t.detach().numpy().reshape(-1)
    except Exception:
        return np.full(t.numel(), np.nan, np.float32)


def _nullable(values: np.ndarray, present: np.ndarray) -> Any:
    """An array column, or a list with None (null) where there is no value."""
    if present.all():
        return values
    return [float(v) if ok else None for v, ok in zip(values, present, strict=True)]


def _last(run: Sequence[StepItem], label: str, col: np.ndarray | None) -> Any:
    """lr / loss scale: a tensor value if the step had one, else its last Python value."""
    if col is not None:
        return col.astype(np.float64)
    if not any(label in it.floats for it in run):
        return None
    return [it.floats[label][-1] if it.floats.get(label) else None for it in run]


def _metric_rows(out: _Out, run: Sequence[StepItem], steps: np.ndarray,
                 tmetrics: dict[str, np.ndarray]) -> None:
    """User metrics: tensor values (stacked, one column per name) and Python numbers; a
    tensor value wins over a Python one of the same name in the same step."""
    if tmetrics:
        names = tuple(tmetrics)
        m = len(names)
        out.append(("metrics", {
            "step": np.repeat(steps, m), "name": Codes(names, _tiled(m, len(run))),
            "value": np.stack(list(tmetrics.values()), axis=1).astype(np.float64).ravel()}))
    py = [(it.step, k, v) for it in run for k, v in it.metrics.items() if k not in tmetrics]
    if py:
        s, k, v = zip(*py, strict=True)
        out.append(("metrics", {"step": list(s), "name": list(k), "value": list(v)}))


def _stat_columns(step: int, p: Piece, seg: np.ndarray) -> dict[str, Any]:
    """tensor_stats rows of one full-statistics piece (a ``[tensors, 8]`` matrix, or
    ``[tensors, 2]`` update/weight norms)."""
    n = len(p.names)
    m = seg.reshape(n, -1)
    cols: dict[str, Any] = {"step": np.full(n, step, dtype=np.int64),
                            "name": Codes(p.names, _arange(n)),
                            "kind": Codes((p.label,), np.zeros(n, np.int32)),
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
    return cols


def _activation_nonfinite(out: _Out, st: dict[str, Any], it: StepItem, p: Piece,
                          bad: np.ndarray) -> None:
    """Per-step NaN/Inf probes of module outputs (an L2 norm each: nonfinite iff the output
    held NaN/Inf), for a step where something went bad: rows with nonfinite = 1 for the
    modules whose output did (a flag, not a count: counts come with the full activation statistics
    at their cadence)."""
    seqs = np.asarray(p.seqs, dtype=np.int32)
    outputs = seqs >= 0  # module inputs have their module's seq negated
    # A step with full activation statistics has a row per module already (with counts):
    # no second, flag-only row for the same module.
    if not any(q.label == "activation" for q in it.pieces):
        idx = np.flatnonzero(outputs)
        names = tuple(p.names[i] for i in idx)
        k = len(idx)
        out.append(("tensor_stats", {
            "step": np.full(k, it.step, dtype=np.int64), "name": Codes(names, _arange(k)),
            "kind": Codes(("activation",), np.zeros(k, np.int32)),
            "numel": np.asarray(p.numels, dtype=np.int64)[idx],
            "nonfinite": bad[idx].astype(np.float64), "seq": seqs[idx]}))
    name = nan_origin(p, bad, outputs)
    where = "the input batch" if name == "<input>" else f"the forward of module {name!r}"
    _report_nonfinite(out, st, it, "activation", name, f"NaN/Inf first appeared in {where}")


def nan_origin(p: Piece, bad: np.ndarray, outputs: np.ndarray) -> str:
    """The module whose forward made the first NaN/Inf: the first nonfinite output in
    forward-completion order, then up to the parent while the module's own input was
    already nonfinite (plain code in the parent's forward made it before the call). The
    first output may be one changed in place later (BatchNorm's output under
    ReLU(inplace=True) keeps the NaN BatchNorm made): one that is unchanged and nonfinite
    comes after it, so the NaN was there by then."""
    if not (bad & outputs).any():  # only inputs: a container's child got it
        first = int(np.argmax(bad))
    else:
        first = int(np.flatnonzero(bad & outputs)[0])
    name = p.names[first]
    late = p.late if p.late else (False,) * len(p.names)
    bad_input = {p.names[i] for i in np.flatnonzero(bad & ~outputs) if not late[i]}
    modules = set(p.names)  # every module that ran (probed output, input or both)
    while name in bad_input:
        if name == "<model>":
            return "<input>"
        parent = name.rpartition(".")[0]
        while parent and parent not in modules:
            parent = parent.rpartition(".")[0]
        name = parent or "<model>"
    return name


def _report_nonfinite(out: _Out, st: dict[str, Any], it: StepItem, what: str, subject: str,
                      message: str) -> None:
    """One event per kind of nonfinite value, at its first occurrence (and, at every one,
    the anomaly window's signal: anomaly.py)."""
    if st.get("on_nonfinite") is not None:
        st["on_nonfinite"]()
    if what in st:
        st[what + "_count"] = st.get(what + "_count", 1) + 1
        return
    st[what] = it.step
    out.append(("event", dict(kind="nonfinite", message=f"step {it.step}: {message}",
                              severity="error", subject=subject, step=it.step, source=what)))


@functools.lru_cache(maxsize=64)
def _arange(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int32)


@functools.lru_cache(maxsize=64)
def _tiled(k: int, n: int) -> np.ndarray:
    """Codes 0..k-1 repeated for n steps (row-major: step by step)."""
    return np.tile(_arange(k), n)
