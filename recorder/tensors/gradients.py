"""Reading the gradients and weights of one step: per-parameter norms (one batched
reduction), full statistics at their cadence, update ratios. No host-device sync: what is
computed here stays on the device until the step's one copy (capture.pack)."""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import compress
from typing import Any

import torch
from torch import nn

from ..capture import Piece, StepAccum
from ..config import RecorderConfig
from . import stats
from .budget import NormBudget
from .histogram import Histograms
from .stats import FullStats, NormPlan, norms
from .update_guard import zero_if_nonfinite


def is_dtensor(t: Any) -> bool:
    """A ``torch.distributed.tensor.DTensor`` (FSDP2's sharded parameters and gradients),
    by its class name: no import of torch.distributed for runs that never use it."""
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def local_shards(tensors: list[Any]) -> list[Any]:
    """This rank's shard of each DTensor (others as they are). Statistics of a DTensor
    itself would run collectives, which the recorder must never start (on the writer thread
    or at a step only some ranks read); its shard is local data. The analyzer combines the
    ranks' shards (FORMAT.md, sharded runs)."""
    return [t.to_local() if is_dtensor(t) else t for t in tensors]


def due(every: int, step: int) -> bool:
    """Whether a feature with cadence ``every`` (0 = off) runs at ``step``."""
    return every > 0 and step % every == 0


class GradLayout:
    """What is known about one set of parameters with gradients, worked out once (per-tensor
    checks are a Python loop: never per step). Sparse gradients are left out. ``piece``
    labels norms in parameter order (the checked path); ``plan_piece`` labels the plan's
    output order, and its ``seqs`` give each value's parameter position, so the writer can
    still name the first parameter (in parameter order) whose gradient went nonfinite."""

    def __init__(self, named: list[tuple[str, nn.Parameter]], grads: list[Any],
                 present: list[bool]) -> None:
        self.present = present
        keep = [ok and not g.is_sparse for g, ok in zip(grads, present, strict=True)]
        self.select = None if all(keep) else keep
        # The same tuple object every step: rows.Codes maps it to codes once.
        self.names = tuple(compress((n for n, _ in named), keep))
        grads = list(compress(grads, keep))
        self.piece = Piece("grad_norms", len(grads), self.names)
        # One device and dtype: torch's _get_total_norm then takes a single foreach group,
        # whose arithmetic clipping.py can reproduce exactly (see GradReader.clip_sink).
        self.one_group = len({(g.device, g.dtype) for g in grads}) == 1
        self.plan = NormPlan(grads) if stats.uniform(grads) else None
        order = self.plan.order if self.plan is not None else None
        self.plan_piece = self.piece if order is None else Piece(
            "grad_norms", len(grads), tuple(self.names[i] for i in order), seqs=order)


class GradReader:
    """The gradient side of a step for one model's ``named_parameters()``."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], config: RecorderConfig,
                 full: FullStats, on_stride: Callable[[int, NormBudget], None] | None = None
                 ) -> None:
        """``on_stride(stride, budget)`` is called when the norm budget changes the stride
        (the recorder writes an event)."""
        self.named = named_params
        self.params = [p for _, p in named_params]
        # FSDP2 (fully_shard): parameters and gradients are DTensors, read shard by shard.
        self.sharded = any(is_dtensor(p) for p in self.params)
        self.grad_stats = True  # full gradient statistics on this rank (see Recorder)
        self.config = config
        self.full = full
        self.hist = Histograms(config.stats_chunk_elems)
        self.layout: GradLayout | None = None
        self.snapshot: list[torch.Tensor] | None = None
        self.budget = NormBudget(config.grad_norm_budget, config.grad_norm_every)
        self.hist_budget = NormBudget(config.histogram_budget, config.histogram_every,
                                      window=3, skip=1, what="the histograms")
        self.on_stride = on_stride
        self.on_hist_stride: Callable[[int, NormBudget], None] | None = None
        self._last_capture: float | None = None
        # called with the present-flags whenever the set of parameters holding a gradient
        # changes (coverage.Coverage)
        self.on_present: Callable[[list[bool]], None] | None = None

    def signature(self) -> tuple[int, int] | None:
        """Identity and in-place version of the first gradient: changes with every backward
        pass (a new tensor after zero_grad(set_to_none=True), a version bump when
        accumulating into an existing one). One attribute read, no device work."""
        for p in self.params:
            g = p.grad
            if g is not None:
                return id(g), g._version
        return None

    def _grads(self) -> tuple[list[torch.Tensor], GradLayout]:
        # One pass over the parameters collecting .grad references (a host-side attribute
        # read each, no device work). Which parameters have one (frozen ones have none) is
        # compared as a list of flags; everything else about that set is worked out once.
        grads = [p.grad for p in self.params]
        if self.sharded:
            grads = local_shards(grads)
        present = [g is not None for g in grads]
        layout = self.layout
        if layout is None or layout.present != present:
            self.layout = layout = GradLayout(self.named, grads, present)
            if self.on_present is not None:
                self.on_present(present)
        if layout.select is not None:  # frozen parameters, sparse gradients
            grads = list(compress(grads, layout.select))
        return grads, layout

    def _norms(self, grads: list[torch.Tensor], layout: GradLayout
               ) -> tuple[Piece, torch.Tensor]:
        """Per-parameter gradient norms as a piece and its device vector: the layout's cached
        plan when it was found uniform (one device, fp16/bf16/fp32), else the checked path.
        Values come in the plan's order, labelled by the cached names."""
        if layout.plan is not None:
            try:
                return layout.plan_piece, layout.plan(grads)
            except RuntimeError:  # dtype/device changed under the same names: re-check
                self.layout = None
        return layout.piece, norms(grads)

    def clip_sink(self, acc: StepAccum, tensors: list[torch.Tensor]
                  ) -> Callable[[list[torch.Tensor], torch.Tensor], None] | None:
        """When ``tensors`` are exactly this model's gradients in parameter order (what
        ``clip_grad_norm_(model.parameters())`` passes on; identity checks, no device work)
        on one device and dtype: a sink for the per-parameter norms clip_grad_norm_ computes
        before it clips (see :mod:`.clipping`), taken as ``acc``'s gradient norms for free.
        Else None, and also when no norms are due at this step (``grad_norm_every``, or a
        full-statistics step): the clipping then runs as torch's own."""
        cfg = self.config
        if not (due(cfg.grad_norm_every, acc.step)
                or (self.grad_stats and due(cfg.tensor_stats_every, acc.step))):
            return None
        grads, layout = self._grads()
        raw = grads
        if self.sharded:  # clip_grad_norm_ is handed the DTensors themselves
            raw = [p.grad for p in self.params]
            if layout.select is not None:
                raw = list(compress(raw, layout.select))
        if not (layout.one_group and len(raw) == len(tensors)
                and all(a is b for a, b in zip(raw, tensors, strict=True))):
            return None

        def take(per_tensor: list[torch.Tensor], stacked: torch.Tensor) -> None:
            if self.sharded:
                # a DTensor norm is partial: its local value is this shard's norm
                stacked = torch.stack(local_shards(per_tensor))
            acc.add(layout.piece, stacked)
            acc.norms_read = True
            if self.grad_stats and due(self.config.tensor_stats_every, acc.step):
                # A full-statistics step: the gradients' statistics before clipping too
                # (clipping only scales them, but their absmax/std would be the clipped ones).
                self._grad_stats(acc, grads, layout)
        return take

    def _grad_stats(self, acc: StepAccum, grads: list[torch.Tensor], layout: GradLayout
                    ) -> None:
        acc.add(Piece("grad", len(grads) * 8, layout.names, tuple(g.numel() for g in grads)),
                self.full(grads))
        acc.stats_read = True

    def capture(self, acc: StepAccum) -> None:
        """Attach this step's gradient (and weight) statistics that are due to ``acc``."""
        acc.grads_captured = True
        cfg = self.config
        if not self.named:
            return
        now = time.perf_counter()
        if self._last_capture is not None:
            self.budget.step_period(now - self._last_capture)
            self.hist_budget.step_period(now - self._last_capture)
        self._last_capture = now
        # A full-statistics step also reads the norms when the budget's stride skips them,
        # so the steps that have full statistics always have steps.grad_norm too.
        norms_due = due(cfg.grad_norm_every * self.budget.stride, acc.step)
        stats_due = self.grad_stats and due(cfg.tensor_stats_every, acc.step)
        # Norms taken before clipping (clip_grad_norm_) need no second pass over .grad.
        if (norms_due and not acc.norms_read) or (stats_due and not acc.stats_read):
            grads, layout = self._grads()
            if grads:
                if not acc.norms_read and (
                        norms_due or (stats_due and due(cfg.grad_norm_every, acc.step))):
                    t0 = time.perf_counter()
                    acc.add(*self._norms(grads, layout))
                    self._charge(time.perf_counter() - t0)
                if stats_due and not acc.stats_read:
                    self._grad_stats(acc, grads, layout)
        if due(cfg.param_stats_every, acc.step):
            ps = local_shards([p.detach() for p in self.params])
            acc.add(Piece("param", len(ps) * 8, tuple(n for n, _ in self.named),
                          tuple(p.numel() for p in ps)), self.full(ps))
        if due(cfg.histogram_every * self.hist_budget.stride, acc.step):
            t0 = time.perf_counter()
            self._histograms(acc)
            stride = self.hist_budget.read_cost(time.perf_counter() - t0)
            if stride is not None and self.on_hist_stride is not None:
                self.on_hist_stride(stride, self.hist_budget)

    def _histograms(self, acc: StepAccum) -> None:
        """Histograms of the step's gradients (as rank 0 writes their statistics) and of
        the weights, one device at a time (histogram.py)."""
        grads, layout = self._grads() if self.grad_stats else ([], None)
        for label, names, ts in (
                ("hist_grad", layout.names if layout else (), grads),
                ("hist_param", tuple(n for n, _ in self.named),
                 local_shards([p.detach() for p in self.params]))):
            by_dev: dict[Any, list[int]] = {}
            for i, t in enumerate(ts):
                if t.is_floating_point():
                    by_dev.setdefault(t.device, []).append(i)
            for idx in by_dev.values():
                acc.add(*self.hist.piece(label, tuple(names[i] for i in idx),
                                         [ts[i] for i in idx]))

    def guard_update(self, acc: StepAccum) -> None:
        """Before the optimizer update, once a step: ``zero_nonfinite_grads``
        (:mod:`.update_guard`), after the step's norms were read."""
        if not self.config.zero_nonfinite_grads or acc.guarded or self.sharded:
            return
        acc.guarded = True
        grads, _ = self._grads()
        zero_if_nonfinite(grads)

    def _charge(self, seconds: float) -> None:
        stride = self.budget.read_cost(seconds)
        if stride is not None and self.on_stride is not None:
            self.on_stride(stride, self.budget)

    def snapshot_params(self, step: int) -> None:
        """Before the optimizer step: a copy of the trainable parameters at the update-ratio
        cadence (debug only), so the update is new - old afterwards."""
        if due(self.config.update_ratio_every, step):
            params = local_shards([p.detach() for p in self.params if p.requires_grad])
            self.snapshot = torch._foreach_mul(params, 1.0) if params else None

    def update_ratio(self, acc: StepAccum) -> None:
        """After the optimizer step: ‖update‖ and ‖weight‖ per parameter, into ``acc``."""
        old, self.snapshot = self.snapshot, None
        if old is None:
            return
        pairs = [(n, p.detach()) for n, p in self.named if p.requires_grad]
        new = local_shards([p for _, p in pairs])
        delta = torch._foreach_sub(new, old)
        m = torch.stack([norms(delta), norms(new)], dim=1)
        acc.add(Piece("update", len(new) * 2, tuple(n for n, _ in pairs),
                      tuple(p.numel() for p in new)), m)
