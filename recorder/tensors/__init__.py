"""What is measured on the tensors, batched on their device without a host sync: per-tensor
statistics (``stats``; CPU tensors: ``stats_host``), gradients, weights and updates
(``gradients``), the every-step norm budget (``budget``), norms before clipping
(``clipping``), AMP's unscale and loss scale (``amp``), module outputs (``activations``) and
their saturation (``saturation``), the NaN/Inf probes of the backward pass (``backward``),
autograd anomaly mode (``anomaly``), and the model and optimizer hooks that read them all
(``hooks``)."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "FullStats": ".stats",
    "norms": ".stats",
    "GradReader": ".gradients",
    "NormBudget": ".budget",
    "ScalerHook": ".amp",
    "ActivationCapture": ".activations",
    "GradProbes": ".backward",
    "AnomalyWindow": ".anomaly",
    "ActivationHooks": ".hooks",
    "unwrap_model": ".hooks",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
