"""Names both halves of the format share and users type: the recorder's presets (run.json
``preset``, ``Recorder(preset=)``, ``tracealyze record --preset``) and the severities of
findings (the summary JSON's ``severity``, ``--fail-on``)."""

from __future__ import annotations

from typing import Literal, get_args

Preset = Literal["minimal", "standard", "debug"]
PRESETS: tuple[str, ...] = get_args(Preset)
"""Every preset, cheapest first."""

Severity = Literal["info", "warning", "error", "critical"]
SEVERITIES: tuple[str, ...] = get_args(Severity)
"""Severity order, lowest first (DESIGN.md)."""

TensorKind = Literal["grad", "param", "update", "activation", "watch"]
TENSOR_KINDS: tuple[str, ...] = get_args(TensorKind)
"""``tensor_stats.kind``: gradients, weights, optimizer updates, module outputs (the
activation probes) and tensors the user watched (``rec.watch``)."""

EventKind = Literal[
    "exception", "signal", "anomaly", "nonfinite", "recorder_error", "dropped_data",
    "resumed", "grad_norm_cadence", "activation_tracing_unavailable",
    "step_from_another_thread", "optimizer_ignored", "profiler_window", "param_coverage",
    "model_structure", "flops_counted", "anomaly_mode", "model_tree", "memory_snapshot",
    "recorder_cost", "hparams_truncated", "histogram_cadence",
]
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
"""``events.kind`` the recorder itself writes (docs/FORMAT.md says what each holds); a
user's ``rec.event(kind, ...)`` may add any other."""
