"""Module outputs of a step: per-module NaN/Inf probes (every step, ``activation_nonfinite``)
and full activation statistics at their cadence, gathered by forward hooks and joined into
one piece each when the step is committed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..capture import Piece, StepAccum
from ..config import RecorderConfig
from .backward import GradProbes
from .backward import flush as flush_grads
from .gradients import due
from .hooks import ActivationHooks, nonfinite_probes
from .saturation import bounded_modules, saturated_share
from .saturation import join as join_saturation
from .stats import FullStats

# Module outputs recorded per step at most (a few forward passes of a large model).
MAX_ACT_PIECES = 20_000


class ActivationCapture:
    """Forward hooks on every module of ``model``, feeding the step that ``current()``
    returns. ``guard(where, fn, *args)`` runs recorder work that must never raise."""

    def __init__(self, model: nn.Module, config: RecorderConfig, full: FullStats,
                 current: Callable[[], StepAccum], guard: Callable[..., Any], *,
                 compiled: bool = False) -> None:
        """``compiled``: the model runs through torch.compile (its hooks never fire); said
        at the first commit."""
        self.config = config
        self.full = full
        self.current = current
        self.guard = guard
        self.traced = False
        self.empty = 0
        self.compiled = compiled
        self.hooks = ActivationHooks(model, self._on_activation, self._on_input,
                                     probe=config.activation_nonfinite,
                                     on_end=self._on_forward_end)
        self.bounded = bounded_modules(model)  # (indices as the hooks' names)
        self.grads = GradProbes(current)

    UNTRACED_AFTER = 3
    """Committed steps with no module hook firing before the recorder says so (once)."""

    def untraced(self, acc: StepAccum) -> str | None:
        """Called at each commit until a hook has fired: after UNTRACED_AFTER steps in which
        none did, the reason tracing cannot work (once), else None."""
        if self.traced:
            return None
        if self.compiled:
            self.traced = True  # (said once)
            return ("the model is torch.compile'd: its module hooks are compiled away, so NaN "
                    "tracing and activation statistics cannot run. The NaN origin falls back "
                    "to the first parameter whose gradient went nonfinite; record a debug run "
                    "without torch.compile to trace modules.")
        if acc.act_seq:
            self.traced = True
            return None
        self.empty += 1
        if self.empty != self.UNTRACED_AFTER:
            return None
        return (f"no module forward hook fired in {self.empty} steps: NaN tracing and "
                "activation statistics cannot run (a torch.compile'd model compiles its "
                "hooks away; or the forward runs under no_grad/another model object). The "
                "NaN origin falls back to the first parameter whose gradient went nonfinite.")

    def next_step(self, step: int) -> None:
        """Hook every module (statistics due at ``step``) or only those that can create a
        NaN/Inf (probes only)."""
        self.hooks.hook_all(due(self.config.activation_stats_every, step))

    def remove(self) -> None:
        self.hooks.remove()

    def _on_activation(self, index: int, t: torch.Tensor | None,
                       inp: torch.Tensor | None) -> None:
        cfg = self.config
        acc = self.current()
        if acc.act_seq >= MAX_ACT_PIECES:  # rec.step() not called for a long time: bound
            return                         # the memory the open step holds
        acc.act_seq += 1
        name = self.hooks.names[index]
        if cfg.activation_nonfinite:
            self.grads.module_called(name, *self.hooks.raw)  # (backward.py)
            if t is not None:
                acc.to_probe.append((name, t.numel(), acc.act_seq, t, t._version))
            if inp is not None:  # the module's input: seq negated (rows.py tells them apart)
                acc.to_probe.append((name, inp.numel(), -acc.act_seq, inp, inp._version))
        if t is None:
            return
        if due(cfg.activation_stats_every, acc.step):
            spec = self.bounded.get(index)
            sat = saturated_share(t, spec) if spec is not None and t.is_floating_point() \
                else None
            acc.act_stats.append((name, t.numel(), acc.act_seq, self.full.one(t), sat))

    def _on_input(self, t: torch.Tensor) -> None:
        if self.config.activation_nonfinite:
            self.current().to_probe.append(("<input>", t.numel(), 0, t, t._version))

    def _on_forward_end(self) -> None:
        self.guard("activation_probe", probe_outputs, self.current())
        self.grads.forward_ended()


def probe_outputs(acc: StepAccum) -> None:
    """Probe the module outputs collected during the forward pass that just ended, all at
    once, and drop the references (until then they keep those outputs alive)."""
    if acc.to_probe:
        names, numels, seqs, ts, versions = zip(*acc.to_probe, strict=True)
        acc.to_probe = []
        # An output modified in place after its module returned (ReLU(inplace=True),
        # `out += x`, masked_fill_) is probed with its later values: flagged, so that it
        # alone never raises a NaN alarm (host-side version counters, no device work).
        late = tuple(t._version != v for t, v in zip(ts, versions, strict=True))
        acc.probes.append((names, numels, seqs, late, nonfinite_probes(list(ts))))


def join_pieces(acc: StepAccum) -> None:
    """At commit: the step's NaN probes and activation statistics, in forward-completion
    order, as one piece each (one stack/cat here instead of a piece per module)."""
    if acc.to_probe:  # a forward whose model call did not return (or a submodule)
        probe_outputs(acc)
    if acc.probes:
        blocks = acc.probes
        if len(blocks) == 1:  # one forward pass
            names, numels, seqs, late, vec = blocks[0]
        else:  # micro-batches: one block per forward pass
            names, numels, seqs, late = (sum((b[k] for b in blocks), ()) for k in range(4))
            vec = torch.cat([b[4] for b in blocks])
        acc.add(Piece("act_nf", len(names), names, numels, seqs, late=late), vec)
    flush_grads(acc)  # (a backward whose end callback did not run: an error in it)
    if acc.grad_probes:  # backward.py: blocks in the order autograd fired them
        blocks, acc.grad_probes = acc.grad_probes, []
        labels = sum((b[0] for b in blocks), ())
        vec = blocks[0][1] if len(blocks) == 1 else torch.cat([b[1] for b in blocks])
        acc.add(Piece("act_bnf", len(labels), labels, (0,) * len(labels),
                      tuple(range(len(labels)))), vec)
    if acc.act_stats:
        names, numels, seqs, vals, sats = zip(*acc.act_stats, strict=True)
        acc.add(Piece("activation", 8 * len(vals), names, numels, seqs), torch.cat(vals))
        sat = join_saturation(list(sats), vals[0].device)
        if sat is not None:  # (right after its rows: rows.py joins them)
            acc.add(Piece("act_sat", len(vals), names, numels, seqs), sat)
