"""The matrix's runs: one training loop, pathologies injected at known steps, and for each
the truth the analyzer must find (data-driven: a new pathology is one entry in PATHOLOGIES).

Truth is checked on the summary's findings in their ranked order (root causes first): the
healthy runs must have nothing above info; a pathology's top-ranked root cause must be one of
``ids``, about ``subject`` (a module path, a rank, ...) and start within ``STEP_TOLERANCE``
of ``step``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STEPS = 300            # every matrix run trains this many optimizer steps
LR_JUMP_STEP = 150     # lr_jump: the learning rate is raised 100x here (a broken schedule)
LEAK_STEP = 100        # leak: from here on every step's loss is kept with its graph
NAN_STEP = 200         # nan_forward: plain code in a module's forward makes a NaN here
STRAGGLER_RANK = 1     # straggler: this rank's forward is slow (a throttled device)
STEP_TOLERANCE = 2     # first_step must be within this many steps of the truth


@dataclass(frozen=True, kw_only=True)
class Truth:
    """What the analyzer must report for a run."""

    ids: tuple[str, ...] = ()
    """Finding ids acceptable as the top-ranked root cause; empty: a healthy run."""
    subject: Callable[[Any], str | tuple[str, ...]] | None = None
    """model spec -> the subject it must name, or the names it may give (None: any)."""
    step: int | None = None
    """The first step it must give (± STEP_TOLERANCE); None: not checked."""
    mentions: tuple[str, ...] = ()
    """Words its title or message must contain (e.g. 'learning rate')."""


@dataclass(frozen=True, kw_only=True)
class Pathology:
    """One way a run is set up or goes wrong."""

    truth: Truth
    lr_mult: Callable[[int], float] = lambda step: 1.0
    """step -> factor on the model's healthy learning rate."""
    clip: float | None = None
    """clip_grad_norm_ max_norm (None: no clipping)."""
    loader_delay_s: float = 0.0
    """seconds each batch takes to load (in the main process)."""
    leak_from: int | None = None
    """keep every step's loss, with its autograd graph, from this step on."""
    nan_at: int | None = None
    """plain code in the model's ``nan_parent`` forward makes a NaN at this step."""
    world_size: int = 1
    """>1: gloo DDP over this many processes."""
    slow_rank_s: float = 0.0
    """seconds STRAGGLER_RANK's forward is slowed by."""
    preset: str = "standard"
    knobs: dict[str, Any] = field(default_factory=dict)


PATHOLOGIES: dict[str, Pathology] = {
    "healthy": Pathology(truth=Truth()),
    # transformers.Trainer's default max_grad_norm; half the steps of a small LM clip
    "healthy_clip": Pathology(truth=Truth(), clip=1.0),
    "lr_x100": Pathology(
        truth=Truth(ids=("loss_divergence", "gradient_explosion", "nonfinite", "loss_plateau",
                         "loss_spike"), mentions=("learning rate",)),
        lr_mult=lambda step: 100.0),
    "lr_jump": Pathology(
        truth=Truth(ids=("loss_divergence", "gradient_explosion", "nonfinite"),
                    step=LR_JUMP_STEP, mentions=("learning rate",)),
        lr_mult=lambda step: 100.0 if step >= LR_JUMP_STEP else 1.0, clip=1.0),
    "leak": Pathology(truth=Truth(ids=("memory_leak",),
                                  subject=lambda spec: ("heap_bytes", "rss_bytes"),
                                  step=LEAK_STEP),
                      leak_from=LEAK_STEP),
    "slow_loader": Pathology(truth=Truth(ids=("dataloader_bottleneck",)),
                             loader_delay_s=0.02),
    "nan_forward": Pathology(
        truth=Truth(ids=("nonfinite",), subject=lambda spec: spec.nan_parent, step=NAN_STEP),
        nan_at=NAN_STEP, preset="debug"),
    "straggler": Pathology(
        truth=Truth(ids=("straggler",), subject=lambda spec: f"rank {STRAGGLER_RANK}"),
        world_size=2, slow_rank_s=0.02),
}
