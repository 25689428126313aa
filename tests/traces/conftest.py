"""Fixtures of the trace tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from trace_helpers import DATA


@pytest.fixture(scope="session")
def hta_reference() -> dict:
    return json.loads((DATA / "hta_reference.json").read_text())


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[..., Path]:
    """Write a synthetic Kineto trace (events plus top-level metadata) to a .json file."""

    def _write(events: list[dict], name: str = "t.json", **meta) -> Path:
        p = tmp_path / name
        p.write_text(json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}))
        return p

    return _write
