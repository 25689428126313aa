"""Writer-thread side of histograms: a ``hist_grad``/``hist_param`` piece of a step (per
tensor, NBINS high halves then NBINS low halves of the counts: tensors/histogram.py) as rows
of the ``histograms`` table."""

from __future__ import annotations

from typing import Any

import numpy as np
from tracealyze.format.histbins import NBINS

from ..capture import Piece
from ..tensors.histogram import SPLIT
from .buffers import Codes


def hist_columns(step: int, p: Piece, seg: np.ndarray) -> dict[str, Any]:
    """One row per tensor: its counts over the fixed bins (int64, exact) and ``nonfinite``,
    the elements in no bin (NaN)."""
    n = len(p.names)
    halves = seg.reshape(n, 2, NBINS).astype(np.int64)
    counts = halves[:, 0] * SPLIT + halves[:, 1]
    numel = np.asarray(p.numels, dtype=np.int64)
    return {"step": np.full(n, step, dtype=np.int64),
            "name": Codes(p.names, np.arange(n, dtype=np.int32)),
            "kind": Codes((p.label.removeprefix("hist_"),), np.zeros(n, np.int32)),
            "numel": numel, "nonfinite": numel - counts.sum(axis=1),
            "counts": counts}  # ([tensors, NBINS]: one list per row, buffers.py)
