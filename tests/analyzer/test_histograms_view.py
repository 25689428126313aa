"""The histograms table as the analyzer serves it: queryable with its bins, drawn in the
report's Distributions section (one chart per group of alike-named tensors)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tracealyze.analyzer import open_run
from tracealyze.analyzer.report.charts.histograms import group_of
from tracealyze.format.histbins import NBINS, bin_of
from tracealyze.recorder import Recorder

CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-block MLP trained 60 steps with histograms every 10."""
    d = tmp_path_factory.mktemp("hist") / "run"
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
                                  for _ in range(3)], torch.nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(d, model=model, optimizer=opt, histogram_every=10, histogram_budget=0,
                  system_interval_s=0) as rec:
        for _ in range(60):
            x = torch.randn(16, 32)
            loss = (model(x) - x[:, :1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    return d


def test_histograms_are_queryable_with_their_bins(run: Path) -> None:
    with open_run(run) as r:
        _, got = r.query("SELECT count(*), count(DISTINCT step), min(len(counts)), "
                         "max(len(counts)) FROM histograms")
        assert got == [(6 * 2 * 8, 6, NBINS, NBINS)]  # 6 steps x (grad, param) x 8 tensors
        _, bins = r.query("SELECT bin, lower, upper FROM histogram_bins ORDER BY bin")
        assert len(bins) == NBINS and bins[0][1] == float("-inf")
        # every bin's midpoint falls in that bin by the format's reference
        for b, lo, hi in bins[1:-1]:
            if lo != hi and lo != 0 and hi != 0:
                assert bin_of((lo + hi) / 2) == b
        # the documented join: elements of a layer's weights per value range
        _, per_bin = r.query(
            "SELECT sum(h.counts[b.bin + 1]) FROM histograms h CROSS JOIN histogram_bins b "
            "WHERE h.kind = 'param' AND h.name = '0.0.weight' AND h.step = 50")
        assert per_bin == [(32 * 32,)]


def test_the_report_draws_a_chart_per_group(run: Path, tmp_path: Path) -> None:
    out = subprocess.run([*CLI, "report", str(run), "-o", str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    page = (tmp_path / "r.html").read_text()
    assert 'href="#histograms-section"' in page
    # weights and gradients of the stacked blocks' layers, each a group of 3 tensors
    for anchor in ("hist-param-0", "hist-param-1", "hist-grad-0", "hist-grad-1"):
        assert f'"anchor": "{anchor}"' in page or f'"anchor":"{anchor}"' in page, anchor
    assert "*.*.weight (weights)" in page


def test_a_run_without_histograms_has_no_distributions_section(tmp_path: Path) -> None:
    d = tmp_path / "run"
    model = torch.nn.Linear(4, 1)
    with Recorder(d, model=model, preset="minimal") as rec:
        for _ in range(3):
            rec.step(loss=1.0)
    out = subprocess.run([*CLI, "report", str(d), "-o", str(tmp_path / "r.html")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    assert "histograms-section" not in (tmp_path / "r.html").read_text()


def test_groups_join_names_that_differ_in_their_numbers() -> None:
    assert group_of("blocks.11.attn.c_attn.weight") == "blocks.*.attn.c_attn.weight"
    assert group_of("encoder.layer.0.attention.self.query.weight") == \
        "encoder.layer.*.attention.self.query.weight"
    assert group_of("lm_head.weight") == "lm_head.weight"
