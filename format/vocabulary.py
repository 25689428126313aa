"""Names both halves of the format share and users type: the recorder's presets (run.json
``preset``, ``Recorder(preset=)``, ``tracealyze record --preset``) and the severities of
findings (the summary JSON's ``severity``, ``--fail-on``)."""

from __future__ import annotations

from typing import Literal, get_args

Preset = Literal["minimal", "standard", "debug"]
PRESETS: tuple[str, ...] = get_args(Preset)
"""Every preset, cheapest first."""

Severity = Literal["info", "warning", "error", "critical"]
SEVERITIES: tuple[str, ...] = get_args(Severity)
"""Severity order, lowest first (DESIGN.md)."""
