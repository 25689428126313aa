"""Scenario suite: real tiny CPU training runs with injected pathologies (see scenarios.py).

Makes ``tests.scenarios`` importable under plain ``pytest`` too (``python -m pytest`` from
the repo root already has the root on sys.path), and gives each test module a fresh
directory for its runs.
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
