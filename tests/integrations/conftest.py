"""Integration tests: real frameworks (transformers.Trainer, Lightning), real models from
tests/matrix, and the zero-code runner. Helpers come from tests/recorder/rec_helpers.py."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
for p in (str(_ROOT / "tests" / "recorder"), str(_ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)
