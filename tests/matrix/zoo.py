"""Every architecture of the matrix: the original four (models.MODELS, also used by the
integration tests) and the wider set (archs.MORE, archs_more.MORE2)."""

from __future__ import annotations

from .archs import MORE
from .archs_more import MORE2
from .models import MODELS, ModelSpec

ALL: dict[str, ModelSpec] = {**MODELS, **MORE, **MORE2}
