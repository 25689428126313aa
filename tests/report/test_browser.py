"""Open reports in a real headless Chromium (Debian's, never a downloaded one) and check that
every chart drew, the page logged no error, nothing injected ran, and save screenshots under
tests/_artifacts/report/."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "_artifacts" / "report"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


def _chromium() -> str | None:
    for cand in (os.environ.get("TRACEALYZE_CHROMIUM"), "/usr/bin/chromium",
                 shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and Path(cand).is_file():
            return cand
    return None


@pytest.fixture(scope="module")
def browser() -> Any:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=LAUNCH_ARGS, headless=True)
        yield b
        b.close()


def _open(browser: Any, path: Path) -> tuple[Any, list[str], list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("dialog", lambda d: (errors.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(
        ("file:", "data:", "blob:")) else None)
    page.goto(path.as_uri())
    # Poll from Python: wait_for_function would eval a string, which the report's CSP forbids.
    for _ in range(200):
        if page.evaluate("""() => Array.from(document.querySelectorAll('.plot')).every(
                el => el.querySelector('.main-svg') || el.classList.contains('plot-error'))"""):
            break
        page.wait_for_timeout(100)
    return page, errors, requests


@pytest.mark.parametrize("name", ["healthy", "sick", "running", "killed"])
def test_report_renders_in_chromium(browser: Any, reports: dict[str, Path], name: str) -> None:
    page, errors, requests = _open(browser, reports[name])
    try:
        plots = page.evaluate("""() => Array.from(document.querySelectorAll('.plot')).map(el => ({
            id: el.id,
            drawn: !!el.querySelector('.plot-container .main-svg'),
            title: (el.querySelector('.gtitle') || {}).textContent || '',
            traces: (el.data || []).length}))""")
        assert plots, "no charts"
        for p in plots:
            assert p["drawn"] and p["traces"] > 0, p
            assert p["title"], p
        assert not errors, errors
        assert not requests, requests  # offline: nothing fetched
        assert page.evaluate("window.__pwned === undefined")
        if name == "sick":
            # stack traces are collapsed until clicked
            det = page.locator("details", has_text="stack trace").first
            assert not det.evaluate("d => d.open")
            det.locator("summary").click()
            assert det.evaluate("d => d.open")
            assert "RuntimeError: boom" in det.inner_text()
            # hostile text is shown as text
            assert "<img src=x" in page.locator(".event-msg").first.inner_text()
            # hover shows values: anywhere above a step on line charts, per cell on heatmaps
            for pid in ("loss", "memory", "grad-heatmap"):
                page.locator(f"#{pid}").scroll_into_view_if_needed()
                box = page.locator(f"#plot-{pid} .nsewdrag").first.bounding_box()
                for frac in (0.3, 0.32):  # plotly acts on mouse *moves*
                    page.mouse.move(box["x"] + box["width"] * frac,
                                    box["y"] + box["height"] * 0.4)
                    page.wait_for_timeout(120)
                label = page.evaluate(f"""() => Array.from(document.querySelectorAll(
                    '#plot-{pid} .hoverlayer .hovertext')).map(e => e.textContent).join(' ')""")
                assert "step" in label or "steps from" in label, (pid, label)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    finally:
        page.close()


def test_distributions_and_hyperparameters_render(browser: Any, tmp_path: Path) -> None:
    """A recorded run with histograms and hparams: each Distributions heatmap is drawn, with
    hover text, and the hyperparameters table shows the run's values."""
    import torch
    from tracealyze.analyzer.report.page import write_report
    from tracealyze.recorder import Recorder

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(tmp_path / "run", model=model, optimizer=opt, histogram_every=5,
                  histogram_budget=0, system_interval_s=0,
                  hparams={"optimizer": {"lr": 0.05}}) as rec:
        for _ in range(40):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(loss=loss)
    page, errors, requests = _open(browser, write_report(tmp_path / "run", tmp_path / "r.html",
                                                         progress=False))
    try:
        drawn = page.evaluate("""() => Array.from(document.querySelectorAll(
            '#histograms-section .plot')).map(el => !!el.querySelector('.main-svg'))""")
        assert len(drawn) == 4 and all(drawn), drawn  # weights and gradients, 2 groups each
        assert not errors and not requests, (errors, requests)
        assert "optimizer.lr" in page.locator("#hparams-table").inner_text()
        pid = page.evaluate("() => document.querySelector('#histograms-section .plot').id")
        page.locator(f"#{pid}").scroll_into_view_if_needed()
        box = page.locator(f"#{pid} .nsewdrag").first.bounding_box()
        label = ""
        for frac in (0.5, 0.52, 0.7, 0.72):
            page.mouse.move(box["x"] + box["width"] * frac, box["y"] + box["height"] * 0.5)
            page.wait_for_timeout(120)
            label += page.evaluate(f"""() => Array.from(document.querySelectorAll(
                '#{pid} .hoverlayer .hovertext')).map(e => e.textContent).join(' ')""")
        assert "step" in label and "bin from" in label, label
    finally:
        page.close()
