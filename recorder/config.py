"""Recorder configuration: presets and every knob they set, validated at construction."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from tracealyze.format.vocabulary import PRESETS, Preset

REPORT_TARGETS = ("mlflow", "wandb")

__all__ = ["PRESETS", "Preset", "RecorderConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecorderConfig:
    """What the recorder records and how often. Cadences are in recorded steps; 0 turns a
    feature off. Build one with :meth:`from_preset`; every field can be overridden."""

    enabled: bool = True
    """False makes the recorder a no-op (nothing is written, not even run.json)."""
    grad_norm_every: int = 1
    """Per-parameter gradient L2 norm (one batched reduction). The step's total grad norm and
    nonfinite-gradient count are derived from it, so 0 also leaves those null."""
    grad_norm_budget: float = 0.0
    """Largest share of the step time the every-step gradient norms may cost on the training
    thread (host time, measured). When they cost more (a CPU or slow host; on a GPU they are
    one kernel launch) they are read every 2nd, 4th, ... step (at most 64x
    ``grad_norm_every``) until they fit, with an ``info`` event ``grad_norm_cadence`` each
    time that changes. 0 reads them at every ``grad_norm_every`` step whatever they cost."""
    store_grad_norms: bool = True
    """Write the per-parameter norms to tensor_stats (False keeps only the step totals)."""
    grad_stats_all_ranks: bool = False
    """Under DistributedDataParallel the gradients are identical on every rank after the
    all-reduce, so by default only rank 0 writes per-parameter gradient norms and full
    gradient statistics (every rank still writes its steps.grad_norm and nonfinite count,
    which the NaN and straggler checks compare). True writes them on every rank. Sharded
    runs (FSDP2) always write every rank's shards."""
    tensor_stats_every: int = 100
    """Full gradient statistics (absmax, mean, std, min, max, zero_frac, nonfinite)."""
    param_stats_every: int = 100
    """Full parameter (weight) statistics."""
    histogram_every: int = 100
    """Histograms of every gradient and weight over fixed log-spaced bins (the
    ``histograms`` table; docs/FORMAT.md gives the bins), computed on their device."""
    histogram_budget: float = 0.0
    """Largest share of the step time histograms may cost on the training thread, spread
    over their cadence (host time, measured: on a GPU a few hundred launches, on a CPU the
    counting itself, ~20 ms for 3M values). Costlier ones are taken every 2nd, 4th, ...
    ``histogram_every`` (at most 64x), with an ``info`` event ``histogram_cadence``; 0
    takes them at every ``histogram_every`` whatever they cost."""
    update_ratio_every: int = 0
    """norm(update)/norm(weight) per parameter; costs one copy of the parameters at those
    steps (needs an optimizer)."""
    activation_stats_every: int = 0
    """Full statistics of every module's output (forward hooks)."""
    activation_nonfinite: bool = False
    """Every step, a one-reduction NaN/Inf check of every module's output, so the first
    nonfinite can be traced to the module that produced it."""
    memory_every: int = 1
    """Memory snapshot (RSS, CUDA allocator counters) every N steps, read on the training
    thread at the step's end (no device sync) and written by the writer thread."""
    memory_history: int = 0
    """CUDA: entries of allocation history the allocator keeps
    (``torch.cuda.memory._record_memory_history``, Python stacks); 0 = off. On a CUDA OOM
    the allocator's snapshot (with this history, when on) is written under
    ``memory_snapshots/rank=<r>/`` (pytorch.org/memory_viz opens it)."""
    memory_history_at: float = 0.0
    """CUDA, with ``memory_history``: start the history only once the allocator has reserved
    this share of the device's memory (checked on each memory row's counters; 0 = from the
    start). The history gathers a Python stack at every allocation: measured on an H200,
    GPT-2 small under the debug preset, 7.7 ms a step (+22%). An OOM's snapshot needs the
    stacks of what was allocated near the edge (a leak's recent allocations, the failing
    step's working set), so the debug preset pays for them only there (0.8)."""
    system_interval_s: float = 1.0
    """Background CPU/memory/GPU-utilisation sampler period; 0 = off."""
    profile_every: int = 0
    """Run a torch.profiler window every N steps (0 = only the window at profile_start, if
    profile_start > 0)."""
    profile_start: int = 0
    """First step of the first profiler window; 0 with profile_every=0 disables profiling."""
    profile_warmup: int = 1
    """Profiler warm-up steps before each active window."""
    profile_active: int = 2
    """Steps recorded per profiler window."""
    profile_max_windows: int = 5
    """Stop profiling after this many windows (traces are large)."""
    profile_quiet: bool = False
    """Silence Kineto's ``USDT ... profiler_start/stop`` console lines at each window by
    setting ``KINETO_LOG_LEVEL=6`` (unless the user set it) before the first window. Off by
    default: Kineto logs USDT above ERROR, so this hides Kineto's error lines too."""
    anomaly_mode: bool | str = False
    """torch.autograd anomaly detection: True (always: 5-20x slower), or ``"after_nonfinite"``
    (the debug preset's): off until the first nonfinite loss or gradient, then on for
    ``anomaly_steps`` steps, the failing op and its forward stack kept as an ``anomaly``
    event."""
    zero_nonfinite_grads: bool = False
    """Right before each optimizer update, zero all of the step's gradients on the device when
    any holds a NaN/Inf (no host sync: the flag stays on the device), so the weights stay
    finite and anomaly mode catches the next occurrence in the op that made it, not a
    bystander downstream of NaN weights. One fused norm and one masked fill per gradient a
    step. Not for sharded (FSDP2) gradients."""
    anomaly_steps: int = 20
    """Steps the ``after_nonfinite`` window stays open (it opens again if NaNs come back)."""
    anomaly_action: str = "record"
    """``"record"``: an anomalous backward's error is kept and training goes on (that step's
    gradients dropped); ``"raise"``: the error is raised in the training script."""
    flush_interval_s: float = 10.0
    """Longest time data stays in memory before it is written (what a kill -9 can lose)."""
    flush_rows: int = 200_000
    """Flush a table early once it buffers this many rows."""
    queue_size: int = 2048
    """Items the writer may fall behind by; beyond it data is dropped and counted, never
    blocking training."""
    max_buffered_bytes: int = 128 << 20
    """If writes keep failing (disk full, read-only), rows wait in memory for the next try;
    beyond this many bytes the oldest are dropped and counted (``dropped_data``)."""
    max_buffered_rows: int = 5_000_000
    """The same bound in rows (the older knob; both apply)."""
    merge_on_close: bool = True
    """Merge each table's part files into one at close, and merge small parts as they
    accumulate (a killed run keeps a few dozen files per table, not one per flush). False
    keeps one file per flush."""
    spool_dir: str | None = None
    """Recording to a URL (``s3://``, ``gs://``, ``az://``): the local folder parts are
    written to before they are uploaded (default: the system temporary directory)."""
    max_spool_bytes: int = 1 << 30
    """Recording to a URL: how far the uploads may fall behind (bytes written to the spool
    and not uploaded) before the writer stops adding parts; rows then wait in memory up to
    ``max_buffered_bytes`` and the oldest are dropped, counted as ``dropped_data``."""
    record_sample_ids: bool = True
    """Each step's sample ids (``steps.sample_ids``): the indices its batches' sampler drew,
    when ``wrap_loader`` (or a framework) iterates a Map-style ``torch`` DataLoader; at most
    1,024 per step. Findings about a step (a loss spike, a NaN) name them."""
    peak_flops: float | None = None
    """Peak FLOP/s of one device, for MFU (model FLOPs / step time / this). None: the
    built-in table for A100, H100, H200 and MI300X at the counted step's precision; on
    other devices (and CPUs) MFU is left out unless this is given."""
    report_to: str | None = None
    """At close, attach the findings (tags, a JSON artifact) and report.html to the script's
    MLflow run (``"mlflow"``), wandb run (``"wandb"``) or both (``"mlflow,wandb"``); rank 0
    only. The analysis runs in a subprocess, so the analyzer must be installed."""
    upload_timeout_s: float = 60.0
    """Recording to a URL: how long ``close()`` retries the last upload before it gives up,
    keeping the spool for ``tracealyze upload``."""
    stats_chunk_elems: int = 1 << 24
    """Largest number of elements concatenated at once for full statistics (bounds the
    temporary memory those steps need)."""
    tune_malloc: bool = True
    """CPU training on glibc: fix malloc's trim and mmap thresholds (32/64 MiB) so that the
    recorder's own allocations cannot tip the heap into trimming and re-faulting memory on
    every step (recorder/training/heap.py). False leaves malloc alone."""
    handle_sigterm: bool = True
    """Close the run (status crashed, data flushed) on SIGTERM, then let the signal proceed."""

    # Sections, as torchtitan groups its job config: ``config.stats.grad_norm_every``. The
    # knobs stay flat keywords (``Recorder(grad_norm_every=10)``, ``--set``); each section
    # is a frozen view of its knobs (SECTIONS says which).
    @property
    def general(self) -> Any:
        """enabled, anomaly_mode, handle_sigterm, tune_malloc."""
        return self._section("general")

    @property
    def stats(self) -> Any:
        """Gradient norms and full tensor statistics: what is computed and how often."""
        return self._section("stats")

    @property
    def activations(self) -> Any:
        """Module-output statistics and the per-step NaN/Inf probe."""
        return self._section("activations")

    @property
    def sampling(self) -> Any:
        """Memory snapshots and the background system sampler."""
        return self._section("sampling")

    @property
    def profiling(self) -> Any:
        """The scheduled torch.profiler windows."""
        return self._section("profiling")

    @property
    def writer(self) -> Any:
        """How and when rows reach disk, and what is kept when they cannot."""
        return self._section("writer")

    def _section(self, name: str) -> Any:
        return _SECTION_TYPES[name](**{k: getattr(self, k) for k in SECTIONS[name]})

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            _check(f.name, getattr(self, f.name), hints[f.name])
        if self.flush_interval_s <= 0:
            raise ValueError("flush_interval_s must be > 0")
        report_targets(self.report_to)  # ValueError for an unknown target
        if self.anomaly_mode not in (False, True, "after_nonfinite") or (
                isinstance(self.anomaly_mode, int) and not isinstance(self.anomaly_mode, bool)):
            raise ValueError("anomaly_mode must be False, True or 'after_nonfinite', got "
                             f"{self.anomaly_mode!r}")
        if self.anomaly_action not in ("record", "raise") or self.anomaly_steps < 1:
            raise ValueError("anomaly_action must be 'record' or 'raise' and anomaly_steps "
                             f">= 1, got {self.anomaly_action!r}, {self.anomaly_steps!r}")
        if min(self.queue_size, self.flush_rows, self.stats_chunk_elems,
               self.max_buffered_bytes, self.max_buffered_rows, self.max_spool_bytes) < 1:
            raise ValueError("queue_size, flush_rows, stats_chunk_elems, max_buffered_bytes, "
                             "max_buffered_rows and max_spool_bytes must be >= 1")
        if self.profile_active < 1 and (self.profile_every or self.profile_start):
            raise ValueError("profile_active must be >= 1 when profiling is on")
        for name in ("grad_norm_budget", "histogram_budget"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} is a share of the step time (0 to 1), got "
                                 f"{getattr(self, name)!r}")
        if not 0 <= self.memory_history_at < 1:
            raise ValueError("memory_history_at is a share of the device's memory (0 to 1), "
                             f"got {self.memory_history_at!r}")
        if 0 < self.system_interval_s < 0.05:
            raise ValueError("system_interval_s must be 0 (off) or >= 0.05")

    @classmethod
    def from_preset(cls, preset: Preset = "standard", **overrides: Any) -> RecorderConfig:
        """The preset's knobs with ``overrides`` applied; ValueError for unknown names."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"unknown recorder option(s) {', '.join(unknown)}; "
                f"valid options: {', '.join(sorted(known))}"
            )
        return cls(**{**_PRESET_KNOBS[preset], **overrides})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def report_targets(value: str | None) -> tuple[str, ...]:
    """``"mlflow"``, ``"wandb"`` or ``"mlflow,wandb"`` -> the targets; ValueError else."""
    if value is None:
        return ()
    names = tuple(dict.fromkeys(v.strip().lower() for v in value.split(",") if v.strip()))
    bad = [n for n in names if n not in REPORT_TARGETS]
    if bad or not names:
        raise ValueError(f"report_to must be 'mlflow', 'wandb' or 'mlflow,wandb', got "
                         f"{value!r}")
    return names


def _check(name: str, value: Any, hint: Any) -> None:
    """ValueError unless ``value`` fits the field's annotation (``int``, ``float``, ``bool``,
    ``X | None``): numbers must be finite and non-negative."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return
    if bool in allowed:
        if isinstance(value, bool):
            return
        if str not in allowed:  # (bool | str: anomaly_mode's words, checked after)
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if int in allowed and isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        return
    if str in allowed and isinstance(value, str) and value:
        return
    if float in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
        return
    want = " or ".join("None" if a is type(None) else a.__name__ for a in allowed)
    raise ValueError(f"{name} must be {want}, got {type(value).__name__} {value!r}")


_PRESET_KNOBS: dict[str, dict[str, Any]] = {
    # Step scalars (loss, lr, time, data wait) and memory every step; the total grad norm
    # every 10 steps (reading every gradient each step alone costs ~1% on small models);
    # nothing per tensor.
    "minimal": dict(
        grad_norm_every=10, grad_norm_budget=0.005, store_grad_norms=False,
        tensor_stats_every=0, param_stats_every=0, histogram_every=0,
        memory_every=10, system_interval_s=5.0, record_sample_ids=False,
    ),
    # Production default: per-parameter grad norm every step (sparser only where reading the
    # gradients would cost over 0.5% of the step: a CPU or slow host), full stats every 100
    # steps, one short profiler window early in the run.
    "standard": dict(
        grad_norm_every=1, grad_norm_budget=0.005, store_grad_norms=True,
        tensor_stats_every=100, param_stats_every=100, histogram_every=100,
        histogram_budget=0.005,
        memory_every=1, system_interval_s=1.0, profile_start=50, profile_every=0,
    ),
    # Everything, more often: update ratios, activation statistics, per-step NaN tracing.
    "debug": dict(
        grad_norm_every=1, store_grad_norms=True, tensor_stats_every=25, param_stats_every=25,
        histogram_every=25, update_ratio_every=25, activation_stats_every=25,
        activation_nonfinite=True,
        memory_every=1, system_interval_s=1.0, profile_start=20, profile_every=1000,
        flush_interval_s=5.0, anomaly_mode="after_nonfinite", memory_history=100_000,
        memory_history_at=0.8, zero_nonfinite_grads=True,
    ),
}


def check_arguments(run_dir: Any, model: Any, optimizer: Any, scaler: Any, resume: Any) -> None:
    """ValueError for Recorder arguments of the wrong kind (at construction, never later)."""
    import os

    import torch

    if not isinstance(run_dir, (str, os.PathLike)) or str(run_dir) == "":
        raise ValueError(f"run_dir must be a path, got {run_dir!r}")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(unwrap_optimizer(optimizer),
                                                torch.optim.Optimizer):
        raise ValueError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if scaler is not None and not hasattr(scaler, "unscale_"):
        raise ValueError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if not isinstance(resume, bool):
        raise ValueError(f"resume must be True or False, got {resume!r}")


def unwrap_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside a framework's wrapper: accelerate's
    ``AcceleratedOptimizer`` (``.optimizer``; it subclasses Optimizer without initialising
    its hook registries), Lightning's ``LightningOptimizer`` (``._optimizer``). The hooks go
    on the inner one, which every wrapper steps."""
    import torch

    for _ in range(8):
        if isinstance(optimizer, torch.optim.Optimizer) and hasattr(
                optimizer, "_optimizer_step_pre_hooks"):
            return optimizer
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            return optimizer
        optimizer = inner
    return optimizer


SECTIONS: dict[str, tuple[str, ...]] = {
    "general": ("enabled", "anomaly_mode", "zero_nonfinite_grads", "anomaly_steps",
                "anomaly_action",
                "handle_sigterm", "tune_malloc", "report_to",
                "peak_flops"),
    "stats": ("grad_norm_every", "grad_norm_budget", "store_grad_norms", "grad_stats_all_ranks",
              "tensor_stats_every", "param_stats_every", "histogram_every",
              "histogram_budget", "update_ratio_every", "stats_chunk_elems"),
    "activations": ("activation_stats_every", "activation_nonfinite"),
    "sampling": ("memory_every", "memory_history", "memory_history_at", "system_interval_s",
                 "record_sample_ids"),
    "profiling": ("profile_every", "profile_start", "profile_warmup", "profile_active",
                  "profile_max_windows", "profile_quiet"),
    "writer": ("flush_interval_s", "flush_rows", "queue_size", "max_buffered_bytes",
               "max_buffered_rows", "merge_on_close", "spool_dir", "max_spool_bytes",
               "upload_timeout_s"),
}
"""Every knob of :class:`RecorderConfig`, in exactly one section."""

_SECTION_TYPES: dict[str, type] = {
    name: dataclasses.make_dataclass(
        f"{name.title()}Config",
        [(k, RecorderConfig.__dataclass_fields__[k].type) for k in knobs],
        frozen=True, kw_only=True)
    for name, knobs in SECTIONS.items()
}
