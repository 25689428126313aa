"""Fixtures for the recorder tests (helpers live in rec_helpers.py, importable from
subprocesses too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rec_helpers import tiny_model


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def model_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = tiny_model()
    return model, torch.optim.SGD(model.parameters(), lr=0.05)
