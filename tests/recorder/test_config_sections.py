"""RecorderConfig's knobs grouped by section (torchtitan-style), with every flat keyword
knob still working."""

from __future__ import annotations

import dataclasses

import pytest
from tracealyze.recorder import PRESETS, RecorderConfig
from tracealyze.recorder.config import SECTIONS


def test_every_knob_is_in_exactly_one_section() -> None:
    knobs = [f.name for f in dataclasses.fields(RecorderConfig)]
    placed = [k for names in SECTIONS.values() for k in names]
    assert sorted(placed) == sorted(knobs)


@pytest.mark.parametrize("preset", PRESETS)
def test_sections_read_the_same_values_as_the_flat_knobs(preset: str) -> None:
    cfg = RecorderConfig.from_preset(preset, grad_norm_every=7, flush_rows=1234,
                                     profile_active=3, profile_start=5)
    for name, knobs in SECTIONS.items():
        section = getattr(cfg, name)
        assert {k: getattr(section, k) for k in knobs} == {k: getattr(cfg, k) for k in knobs}
    assert (cfg.stats.grad_norm_every, cfg.writer.flush_rows, cfg.profiling.profile_active) \
        == (7, 1234, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.stats.grad_norm_every = 1  # type: ignore[misc]
