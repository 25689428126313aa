"""The compare page (`tracealyze compare BASE NEW -o compare.html`) in a real headless
Chromium: every chart drew, the verdict and the tables match the compare result, nothing was
fetched, hostile run names stayed text; screenshots under tests/_artifacts/report/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.compare.page import write_compare_report
from tracealyze.analyzer.ingest.importer import import_traces

from tests.report.test_browser import ARTIFACTS, _open, browser  # noqa: F401 (fixture)
from tests.runfactory import make_run
from tests.traces.trace_helpers import ITEMS_PER_STEP, SAMPLED, with_items

HOSTILE = "<img src=x onerror=\"window.__pwned=1\">"


@pytest.fixture(scope="module")
def pages(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
          ) -> dict[str, tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("compare_pages")
    tb, tn = root / "trace-base", root / "trace-new"
    import_traces([SAMPLED], tb)
    import_traces([with_items(SAMPLED, root / "items.json")], tn)
    leak = make_run(root, name="leak", steps=400, tensors=6, run_meta={"name": HOSTILE},
                    rss=lambda s: 1.4e9 + 4e6 * s, cuda_allocated=lambda s: 2e9 + 1e6 * s)
    base = make_run(root, name="base", steps=400, tensors=6, cuda_allocated=2e9, seed=3)
    return {
        "runs": write_compare_report(runs["healthy"], runs["sick"], root / "runs.html",
                                     threshold=5.0),
        "leak": write_compare_report(base, leak, root / "leak.html", threshold=5.0),
        "traces": write_compare_report(tb, tn, root / "traces.html", threshold=5.0),
    }


def _plots(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('.plot')).map(el => ({
        id: el.id, drawn: !!el.querySelector('.plot-container .main-svg'),
        traces: (el.data || []).length,
        title: (el.querySelector('.gtitle') || {}).textContent || ''}))""")


@pytest.mark.browser
@pytest.mark.parametrize("name", ["runs", "leak", "traces"])
def test_compare_page_renders_in_chromium(browser: Any, pages: dict, name: str) -> None:  # noqa: F811
    path, result = pages[name]
    page, errors, requests = _open(browser, path)
    try:
        plots = _plots(page)
        assert plots, "no charts"
        for p in plots:
            assert p["drawn"] and p["title"], p
        assert not errors, errors
        assert not requests, requests
        assert page.evaluate("window.__pwned === undefined")
        assert page.locator("#verdict").inner_text().strip() == result["verdict"]
        rows = page.locator("#metrics-table tbody tr")
        assert rows.count() == len(result["metrics"])
        ids = {p["id"] for p in plots}
        if name == "runs":
            # both runs' curves overlaid: two traces on each line chart
            assert {"plot-cmp-loss", "plot-cmp-grad-norm", "plot-cmp-step-time",
                    "plot-cmp-step-dist"} <= ids
            assert all(p["traces"] == 2 for p in plots if p["id"] != "plot-cmp-memory")
            assert result["verdict"] in ("regressed", "mixed")
            # the worse metrics are red and named in the verdict line
            worse = page.locator("#metrics-table tr.worse td.mono").all_inner_texts()
            assert set(worse) == {m for m in result["regressions"] if ":" not in m}
        if name == "leak":
            assert "memory_peak_rss_bytes" in result["regressions"]
            assert HOSTILE in page.locator("h1").inner_text()  # shown as text, not run
            mem = next(p for p in plots if p["id"] == "plot-cmp-memory")
            assert mem["traces"] == 4  # RSS and CUDA of both runs
        if name == "traces":
            assert "plot-cmp-gpu" in ids
            table = page.locator("#kernel-table").inner_text()
            assert "aten::item" in table and "cudaStreamSynchronize" in table
            first = page.locator("#kernel-table tbody tr").first.inner_text()
            assert f"→ {ITEMS_PER_STEP:g}" in first or "aten::item" in first
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"compare-{name}.png"), full_page=True)
    finally:
        page.close()


def test_compare_cli_writes_the_page_and_keeps_json_and_exit_codes(runs: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    res = CliRunner().invoke(main, ["compare", str(runs["healthy"]), str(runs["sick"]),
                                    "-o", str(out), "--json", "--fail-on", "regression"])
    assert res.exit_code == 1, res.output
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in html
    assert "<script src=" not in html  # self-contained
    result = json.loads(res.stdout)
    assert f'id="verdict">{result["verdict"]}<' in html
    # a directory as -o: one line, exit 2, nothing written
    res = CliRunner().invoke(main, ["compare", str(runs["healthy"]), str(runs["sick"]),
                                    "-o", str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.output
    assert len(res.output.strip().splitlines()) == 1
