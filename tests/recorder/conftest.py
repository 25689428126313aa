"""Fixtures for the recorder tests (helpers live in rec_helpers.py, importable from
subprocesses too)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from rec_helpers import tiny_model  # noqa: E402


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def model_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = tiny_model()
    return model, torch.optim.SGD(model.parameters(), lr=0.05)
