"""Chart anchors are constants: every finding's ``chart`` names a chart the report can draw
(``dead_activation`` once pointed to "activations" and ``update_ratio`` to "update-ratio",
charts that did not exist), and a recorded debug run draws the per-tensor ones."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch import nn
from tracealyze.analyzer.diagnosis import anchors
from tracealyze.analyzer.diagnosis.findings import Finding

REPO = Path(__file__).resolve().parents[2]


def _chart_values_in_detectors() -> set[str]:
    found = set()
    for f in (REPO / "analyzer" / "diagnosis" / "detectors").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "chart":
                v = node.value
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name):
                    assert v.value.id == "anchors", f
                    found.add(getattr(anchors, v.attr))
                elif isinstance(v, ast.Constant) and v.value is not None:
                    raise AssertionError(f"{f.name}: chart={v.value!r}: use an anchors constant")
    return found


def test_every_finding_links_to_a_known_anchor() -> None:
    used = _chart_values_in_detectors()
    assert {"activations", "update-ratio", "memory", "loss"} <= used
    assert used <= anchors.ALL


def test_every_anchor_is_drawn_by_some_chart_builder() -> None:
    source = "".join(p.read_text() for p in (REPO / "analyzer" / "report").rglob("*.py"))
    for name in dir(anchors):
        value = getattr(anchors, name)
        if name.isupper() and isinstance(value, str):
            assert f'"{value}"' in source or f"{name}," in source or f"{name})" in source, value


def test_debug_run_draws_activation_and_update_ratio_charts(tmp_path: Path) -> None:
    from tracealyze.analyzer.report.page import collect
    from tracealyze.analyzer.run.catalog import open_run
    from tracealyze.recorder import Recorder

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, preset="debug",
                  system_interval_s=0, profile_start=0, profile_every=0,
                  activation_stats_every=5, update_ratio_every=5) as rec:
        for _ in range(20):
            x = torch.randn(8, 6)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    with open_run(tmp_path / "run") as run:
        model_ = collect(run, [Finding(id="update_ratio", severity="warning", title="t",
                                       message="m", chart=anchors.UPDATE_RATIO)])
    drawn = {c.anchor for c in model_["charts"]}
    assert {anchors.ACTIVATIONS, anchors.UPDATE_RATIO} <= drawn
    assert model_["findings"][0].link == anchors.UPDATE_RATIO
