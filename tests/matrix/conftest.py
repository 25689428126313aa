"""Real-model matrix (see pathologies.py).

Makes ``tests.matrix`` importable under plain ``pytest`` too (``python -m pytest`` from the
repo root already has the root on sys.path).
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
