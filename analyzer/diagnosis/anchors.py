"""Anchors of the report's charts: the names a finding's ``chart`` may point to. Every
detector links to one of these, and every one of these is a chart the report can draw
(``tests/report/test_anchors.py``)."""

from __future__ import annotations

LOSS = "loss"
LR = "lr"
GRAD_NORM = "grad-norm"
GRAD_HEATMAP = "grad-heatmap"
METRICS = "metrics"
ACTIVATIONS = "activations"
ACTIVATION_NORMS = "activation-norms"
UPDATE_RATIO = "update-ratio"
STEP_TIME = "step-time"
MEMORY = "memory"
SYSTEM = "system"
RANKS = "ranks"
RANKS_TIME = "ranks-time"
EVENTS = "events"
PROFILER = "profiler"
PROFILER_KERNELS = "profiler-kernels"
GPU_TIME = "gpu-time"
KERNEL_TYPES = "kernel-types"
PROFILER_OVERVIEW = "profiler-overview"
PROFILER_STEPS = "profiler-steps"
TRACE_MEMORY = "trace-memory"
TRACE_ALLOCS = "trace-allocs"

ALL: frozenset[str] = frozenset(v for k, v in dict(globals()).items()
                                if k.isupper() and isinstance(v, str))
