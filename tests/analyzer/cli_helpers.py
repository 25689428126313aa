"""Helpers shared by the CLI tests."""

from __future__ import annotations

from typing import Any


def bad(result: Any) -> str:
    """Assert exit 2 with exactly one line on stderr and no traceback; return that line."""
    assert result.exit_code == 2, result.output
    err = result.stderr.strip().splitlines()
    assert len(err) == 1, result.stderr
    assert "Traceback" not in result.output
    return err[0]
