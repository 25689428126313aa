"""Log axes label every tick in full (#26): a "5" beside a "5" meaning 0.5 and 50 was
Plotly's default on log axes (it labels 2 and 5 by their leading digit)."""

from __future__ import annotations

import math

from tracealyze.analyzer.report.figures import log_axis


def test_ticks_are_full_numbers_in_a_1_2_5_series():
    ax = log_axis([0.3, 7.0, 70.0])
    assert ax["type"] == "log" and ax["tickmode"] == "array"
    assert ax["ticktext"][:9] == ["0.1", "0.2", "0.5", "1", "2", "5", "10", "20", "50"]
    assert all(float(t) == v for t, v in zip(ax["ticktext"], ax["tickvals"], strict=True))


def test_wide_ranges_thin_out_and_cover_the_data():
    for lo, hi in [(1e-9, 1e9), (2e-3, 4e2), (5.0, 6.0)]:
        ax = log_axis([lo, hi])
        v = ax["tickvals"]
        assert len(v) <= 40
        assert min(v) <= lo and max(v) >= hi
        assert len(set(ax["ticktext"])) == len(v)  # no two ticks read the same
        assert all(math.isclose(float(t), x, rel_tol=5e-3) for t, x in
                   zip(ax["ticktext"], v, strict=True))
