"""The matrix's runs: one training loop, pathologies injected at known steps, and for each
the truth the analyzer must find (data-driven: a new pathology is one entry in PATHOLOGIES).

Truth is checked on the summary's findings in their ranked order (root causes first): the
healthy runs must have nothing above info; a pathology's top-ranked root cause must be one of
``ids``, about ``subject`` (a module path, a rank, ...) and start within ``STEP_TOLERANCE``
of ``step``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STEPS = 300            # every matrix run trains this many optimizer steps
LR_JUMP_STEP = 150     # lr_jump: the learning rate is raised 100x here (a broken schedule)
LEAK_STEP = 100        # leak: from here on every step's loss is kept with its graph
NAN_STEP = 200         # nan_forward: plain code in a module's forward makes a NaN here
STRAGGLER_RANK = 1     # straggler: this rank's forward is slow (a throttled device)
STEP_TOLERANCE = 2     # first_step must be within this many steps of the truth
LOG0_STEP = 200        # log0: a hand-written loss takes log(0) here
RESCALE_STEP = 150     # loss_x2: the objective is multiplied by 2 from here (a loss weight)
BAD_BATCH_STEP = 170   # bad_batch: one batch's loss is 100x the others' here
STALL_EVERY = 50       # periodic_stall: a synchronous checkpoint every this many steps
DEAD_STEP = 150        # dead_units: the cut module's units die here (inputs all negative)


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
    mentions_if: Callable[[Any], tuple[str, ...]] | None = None
    """model spec -> more words it must contain for that model (e.g. 'chance' where the
    loss has a chance level)."""


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
    lr_schedule: Callable[[int], float] | None = None
    """A healthy schedule (warm-up + cosine) instead of lr_mult."""
    bf16: bool = False
    """Forward and loss under torch.autocast(bfloat16)."""
    accum: int = 1
    """Micro-batches per optimizer step (gradient accumulation over halves of the batch)."""
    detach: bool = False
    """The model spec's ``cut`` module's output is detached (graph cut)."""
    freeze: bool = False
    """The spec's ``freeze`` block is frozen by mistake before the optimizer is built."""
    unused: bool = False
    """A module the forward never calls is added before the optimizer is built."""
    random_labels: bool = False
    """Targets drawn at random (the spec's ``randomize``)."""
    log0_at: int | None = None
    """A hand-written loss takes log(0) at this step."""
    nan_backward_at: int | None = None
    """plain code in ``nan_parent``'s forward makes a NaN in the backward at this step (a
    finite forward: |h| written as sqrt(h*h) at h = 0 exactly)."""
    late_block: bool = False
    """The spec's ``freeze`` block is replaced by a fresh copy after the optimizer is built
    (a new head put in after ``AdamW(model.parameters())``): it trains in no param group."""
    keep_outputs_from: int | None = None
    """From this step, every leaf module's output is kept (detached) in a list."""
    stall_every: int = 0
    stall_s: float = 0.0
    """Every ``stall_every`` steps the training process stops for ``stall_s`` (a checkpoint
    written synchronously: time.sleep, the process's CPU at 0%), on the step that ends the
    cycle."""
    workers: int = 0
    worker_period_steps: float = 0.0
    worker_period_min_s: float = 0.0
    """DataLoader worker processes, and how slowly they deliver: together one batch per
    ``worker_period_steps`` of the model's own steps (each worker takes ``workers`` times
    that to make one), timed in the run's own process before it records, and never faster
    than one per ``worker_period_min_s``. Relative: a fixed delay is a bottleneck only next
    to a fast step, and a busy machine stretches the step (the truth then depended on the
    load: 26/45 with two recordings on 2 cores). With a floor: next to a 3 ms step, three
    steps' wait is under a second over the whole run, a large share of almost nothing."""
    dead_from: int | None = None
    """From this step the spec's ``cut`` module's output goes through a ReLU whose inputs
    are all far below zero (a bias pushed down by a bug, units killed by one huge update):
    the output and every gradient through it exactly zero, and no gradient ever again to
    revive them."""
    loss_factor: Callable[[int], float] | None = None
    """step -> a factor on the loss (and so on every gradient) at that step."""
    needs: str = ""
    """The model-spec field this pathology needs (cells without it are not in the matrix)."""
    must_show: bool = False
    """Whether the pathology may leave training unharmed on some models (a high LR that a
    model tolerates): the run counts only when it visibly did harm (``manifested``)."""


def _warmup_cosine(step: int) -> float:
    warm = STEPS // 10
    if step < warm:
        return (step + 1) / warm
    t = (step - warm) / (STEPS - warm)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))


def _step_decay(step: int) -> float:
    """torch's MultiStepLR: ×0.1 at half and at three quarters of the run."""
    return 1.0 if step < STEPS // 2 else 0.1 if step < 3 * STEPS // 4 else 0.01


def _restarts(step: int) -> float:
    """CosineAnnealingWarmRestarts: four cosine periods, back to the full rate at each."""
    period = STEPS // 4
    return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * (step % period) / period))


def _one_cycle(step: int) -> float:
    """OneCycleLR: from 1/25 of the peak up to it over 30% of the run, then cosine down
    to 1/10,000 of it."""
    up = int(0.3 * STEPS)
    if step < up:
        return 0.04 + 0.96 * step / up
    t = (step - up) / (STEPS - up)
    return 1e-4 + (1 - 1e-4) * 0.5 * (1 + math.cos(math.pi * t))


def _linear(step: int) -> float:
    """transformers' default: linear warm-up over 6% of the run, linear decay to 0."""
    warm = max(1, int(0.06 * STEPS))
    return (step + 1) / warm if step < warm else max(0.0, (STEPS - step) / (STEPS - warm))


PATHOLOGIES: dict[str, Pathology] = {
    "healthy": Pathology(truth=Truth()),
    # transformers.Trainer's default max_grad_norm; half the steps of a small LM clip
    "healthy_clip": Pathology(truth=Truth(), clip=1.0),
    "lr_x100": Pathology(must_show=True,
        # (a collapse of every layer's gradient is what ×100 does to BERT: vanishing
        # gradients across the model, named with the learning rate)
        truth=Truth(ids=("loss_divergence", "gradient_explosion", "nonfinite", "loss_plateau",
                         "loss_spike", "vanishing_gradient"), mentions=("learning rate",)),
        lr_mult=lambda step: 100.0),
    "lr_jump": Pathology(
        truth=Truth(ids=("loss_divergence", "gradient_explosion", "nonfinite"),
                    step=LR_JUMP_STEP, mentions=("learning rate",)),
        lr_mult=lambda step: 100.0 if step >= LR_JUMP_STEP else 1.0, clip=1.0, must_show=True),
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
        world_size=2, slow_rank_s=0.02, needs="ddp"),
    # ---- healthy variants (#26): what healthy training commonly looks like
    "healthy_sched": Pathology(truth=Truth(), lr_schedule=_warmup_cosine, clip=1.0),
    # ---- #45: the schedule shapes people use; their moves are by design, not alarms
    "healthy_stepdecay": Pathology(truth=Truth(), lr_schedule=_step_decay),
    "healthy_restarts": Pathology(truth=Truth(), lr_schedule=_restarts),
    "healthy_onecycle": Pathology(truth=Truth(), lr_schedule=_one_cycle),
    "healthy_linear": Pathology(truth=Truth(), lr_schedule=_linear, clip=1.0),
    "healthy_bf16": Pathology(truth=Truth(), bf16=True),
    "healthy_accum": Pathology(truth=Truth(), accum=2),
    # the standard preset's own profiler window at step 50 (the recorder's memory must
    # never be a finding)
    "healthy_profiled": Pathology(truth=Truth(), knobs={"profile_start": 50}),
    # ---- pathologies (#26)
    "lr_ramp": Pathology(must_show=True,
        truth=Truth(ids=("gradient_explosion", "loss_divergence", "nonfinite", "loss_spike",
                         "loss_plateau"), mentions=("learning rate",)),
        lr_mult=lambda step: 1.0 + 59.0 * step / STEPS),
    "detach": Pathology(truth=Truth(ids=("no_gradient",), subject=lambda spec: spec.cut_subject),
                        detach=True, needs="cut"),
    "frozen": Pathology(truth=Truth(ids=("optimizer_coverage",), subject=lambda spec: spec.freeze),
                        freeze=True, needs="freeze"),
    "unused": Pathology(truth=Truth(ids=("unused_module",), subject=lambda spec: "unused_head"),
                        unused=True),
    "random_labels": Pathology(
        truth=Truth(ids=("loss_plateau",),
                    mentions_if=lambda spec: ("chance",) if spec.chance_loss else ()),
        random_labels=True, needs="randomize"),
    "log0": Pathology(truth=Truth(ids=("nonfinite",), step=LOG0_STEP), log0_at=LOG0_STEP),
    # ---- #30: a NaN made by the backward, a block outside the optimizer
    "nan_backward": Pathology(
        truth=Truth(ids=("nonfinite",), subject=lambda spec: spec.nan_parent, step=NAN_STEP,
                    mentions=("backward",)),
        nan_backward_at=NAN_STEP, preset="debug"),
    "late_block": Pathology(truth=Truth(ids=("optimizer_coverage",),
                                        subject=lambda spec: spec.freeze),
                            late_block=True, needs="freeze"),
    "leak_list": Pathology(truth=Truth(ids=("memory_leak",),
                                       subject=lambda spec: ("heap_bytes", "rss_bytes"),
                                       step=LEAK_STEP),
                           keep_outputs_from=LEAK_STEP),
    # the workers deliver a batch per 3 of the model's steps (at most one per 20 ms): the
    # training waits ~2/3 of each step for data (the detector's bar is 25%)
    "slow_workers": Pathology(truth=Truth(ids=("dataloader_bottleneck",)), workers=2,
                              worker_period_steps=3.0, worker_period_min_s=0.02),
    # ---- #45: structure by design, and a batch that throws the run
    # a loss weight doubled mid-run (every gradient x2 at once): a rescaled objective, which
    # the analyzer says at info; nothing to alarm about
    "loss_x2": Pathology(truth=Truth(),
                         loss_factor=lambda step: 2.0 if step >= RESCALE_STEP else 1.0),
    # a second task on every 4th step whose loss is 3x the first's (multi-task): the pattern
    # is the loop's structure
    "multitask": Pathology(truth=Truth(),
                           loss_factor=lambda step: 3.0 if step % 4 == 3 else 1.0),
    # a checkpoint saved synchronously every 50 steps (0.3 s of 5-30 ms steps: 15-40% of
    # the wall time), the training's own periodic stall whatever the machine's load
    "periodic_stall": Pathology(
        truth=Truth(ids=("step_time_outlier",), step=STALL_EVERY - 1),
        stall_every=STALL_EVERY, stall_s=0.3),
    # units that die mid-run (#45: dead units -> no gradient upstream -> plateau): found
    # from the gradients (the standard preset records no activations), at their step, named
    # where the gradient stops
    "dead_units": Pathology(
        truth=Truth(ids=("dead_activation",), subject=lambda spec: spec.cut_subject,
                    step=DEAD_STEP),
        dead_from=DEAD_STEP, needs="cut"),
    # one corrupt batch (a sample 100x out of scale): found at its own step, whatever it
    # sets off afterwards
    "bad_batch": Pathology(
        truth=Truth(ids=("loss_spike", "gradient_explosion", "loss_divergence", "nonfinite"),
                    step=BAD_BATCH_STEP),
        loss_factor=lambda step: 100.0 if step == BAD_BATCH_STEP else 1.0),
}


def applies(model: str, spec: Any, pathology: str) -> bool:
    """Whether (model, pathology) is a cell of the matrix: the pathology's ``needs`` is a
    field the model spec fills ("ddp": the original four architectures only, each DDP run
    being two processes)."""
    need = PATHOLOGIES[pathology].needs
    if not need:
        return True
    if need == "ddp":
        return model in ("gpt2", "bert", "nanogpt", "resnet")
    return bool(getattr(spec, need))


OPEN: dict[str, str] = {}
"""Cells the detectors do not meet yet, with their measured rate: recorded and judged by
benchmarks/matrix.py (README's rates table), left out of the suite's cases until they do."""

