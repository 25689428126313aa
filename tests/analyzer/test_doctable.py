"""The findings table in README.md and docs/ANALYZER.md matches the detectors' own docs."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracealyze.analyzer.diagnosis.detectors import base

from tools import doctable

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["README.md", "docs/ANALYZER.md"])
def test_findings_table_is_up_to_date(name: str) -> None:
    text = (ROOT / name).read_text()
    assert doctable.replace_table(text, doctable.findings_table()) == text, (
        f"{name}: run `python tools/doctable.py --write`")


def test_every_detector_documents_meaning_rule_and_fixes() -> None:
    mods, errors = base.discover()
    assert not errors
    for m in mods:
        assert {"meaning", "rule", "fixes"} <= set(m.DOC), m.ID
        assert all(m.DOC[k].strip() for k in ("meaning", "rule", "fixes")), m.ID
    table = doctable.findings_table()
    assert all(f"`{m.ID}`" in table for m in mods)


def test_replace_table_needs_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        doctable.replace_table("no table here", "| x |")
