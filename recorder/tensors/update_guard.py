"""``zero_nonfinite_grads``: a step whose gradients hold a NaN or Inf applies none of them.

Without it, the step that makes the first NaN gradient also makes the weights NaN (the
optimizer applies it), every later forward is NaN, and the anomaly window that opens a few
steps later (the writer sees the NaN without a sync, so late) catches a bystander: the
loss's backward, every step, downstream of weights that were already gone. With it, right
before the optimizer update (its pre-hook, after the step's norms were read, so the rows
still show the NaN), every gradient of the step is zeroed on the device when any of them
is nonfinite, as a GradScaler skips an overflowing step, but without the scaler's host
read: the decision stays on the device. The weights stay finite, and the next occurrence
is caught by anomaly mode in the op that made it.

Cost: one fused norm per device and one masked fill per gradient (a launch each), every
step the knob is on (the debug preset). The update of a zeroed step is not a full skip:
momentum and weight decay still move the weights by their finite amounts. Sharded
gradients (FSDP2) are left alone: each rank would decide on its own shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .stats import norms


def zero_if_nonfinite(grads: Sequence[torch.Tensor | None]) -> None:
    """Zero every tensor in ``grads`` on its device when any holds a NaN/Inf; leave them
    untouched otherwise. No host-device sync: the flag never leaves the device."""
    present = [g for g in grads if g is not None and (g.is_floating_point() or g.is_complex())]
    if not present:
        return
    with torch.no_grad():
        by_dev: dict[torch.device, list[torch.Tensor]] = {}
        for g in present:
            by_dev.setdefault(g.device, []).append(g)
        bad: torch.Tensor | None = None
        for gs in by_dev.values():
            # NaN/Inf propagate into the norms: one reduction a device finds any of them
            b = ~torch.isfinite(norms(gs)).all()
            bad = b if bad is None else bad | b.to(bad.device, non_blocking=True)
        assert bad is not None
        for dev, gs in by_dev.items():
            mask = bad if bad.device == dev else bad.to(dev, non_blocking=True)
            for g in gs:
                # a fill, not arithmetic: NaN * 0 is NaN, a fill is 0 (a 0-dim mask
                # broadcasts: every element when the step is bad, none when it is not)
                g.masked_fill_(mask, 0)
