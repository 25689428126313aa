"""``Analysis``: one run analysed once, read by the summary, the report and compare."""

from __future__ import annotations

import numpy as np
import pytest
from tracealyze.analyzer import Analysis, build_summary, open_run
from tracealyze.analyzer.diagnosis.summary import summary_of
from tracealyze.analyzer.errors import ConfigError

from tests.runfactory import make_run


def test_detectors_run_once_however_often_the_analysis_is_read(tmp_path, monkeypatch):
    run_dir = make_run(tmp_path, steps=300,
                       rss=lambda s: 1.5e9 + np.maximum(s - 100, 0) * 2**20)
    from tracealyze.analyzer.diagnosis.detectors import memory_leak

    calls = []
    real = memory_leak.detect
    monkeypatch.setattr(memory_leak, "detect", lambda ctx, th: calls.append(1) or real(ctx, th))
    with open_run(run_dir) as run:
        analysis = Analysis(run)
        first = summary_of(analysis)
        assert summary_of(analysis) == first
        assert analysis.findings is analysis.findings
        assert analysis.not_checked == first["not_checked"]
    assert calls == [1]
    assert [f["id"] for f in first["findings"]] == ["memory_leak"]
    again = build_summary(run_dir)
    assert (again["findings"], again["not_checked"]) == (first["findings"], first["not_checked"])


def test_a_bad_threshold_fails_before_any_detector_runs(tmp_path):
    run_dir = make_run(tmp_path, steps=50)
    with open_run(run_dir) as run, pytest.raises(ConfigError, match="must be >= 0"):
        Analysis(run, ["memory_leak.min_slope_bytes=-1"])
    with open_run(run_dir) as run, pytest.raises(ConfigError, match="unknown detector"):
        Analysis(run, {"no_such_detector": {"x": 1}})


def test_a_detector_that_raises_is_an_error_finding_and_the_rest_still_run(tmp_path,
                                                                          monkeypatch):
    run_dir = make_run(tmp_path, steps=300,
                       rss=lambda s: 1.5e9 + np.maximum(s - 100, 0) * 2**20)
    from tracealyze.analyzer.diagnosis.detectors import loss_spike

    def boom(ctx, th):
        raise RuntimeError("bug")

    monkeypatch.setattr(loss_spike, "detect", boom)
    with open_run(run_dir) as run:
        ids = {(f.id, f.severity) for f in Analysis(run).findings}
    assert ("loss_spike", "error") in ids and ("memory_leak", "error") in ids
