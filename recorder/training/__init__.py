"""What is measured of the training itself: the model's structure read in its first forward
(``structure``) and its tree (``model_tree``), every parameter accounted for (``coverage``),
the samples each step drew (``samples``), data waits (``loader``), throughput and MFU
(``throughput``), memory and system samples (``sampler``), malloc's thresholds for CPU
training (``heap``), and the scheduled torch.profiler windows (``profiling``)."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "StructureProbe": ".structure",
    "ModelWatch": ".model_tree",
    "Coverage": ".coverage",
    "SamplerTap": ".samples",
    "TimedLoader": ".loader",
    "FlopMeter": ".throughput",
    "MemoryProbe": ".sampler",
    "SystemSampler": ".sampler",
    "ProfilerSchedule": ".profiling",
    "tune_for": ".heap",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
