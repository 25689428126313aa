"""Regenerate docs/report.png, the README's picture of a report.

    python tests/report/make_screenshot.py [--out docs/report.png] [--run RUN_DIR]

``--run``: photograph the report of an existing run (the README's picture is
``sample_traces/gpu_oom_leak``, recorded on an H200). Without it, records a real run (needs
torch and transformers): the matrix's Hugging Face GPT-2 (small config, random weights,
synthetic language; tests/matrix) trained 300 steps with gradient clipping at 1.0, whose
learning rate a broken schedule raises 100x at step 150; the run directory's name, shown in
the report's header, says so. Renders the report and photographs the top of the page in
headless Chromium (same launch flags as the browser test).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tracealyze.analyzer.report.page import write_report  # noqa: E402

from tests.report.test_browser import LAUNCH_ARGS, _chromium  # noqa: E402

RUN_NAME = "hf-gpt2-clip1.0-lr-x100-at-step-150"


def build(root: Path) -> Path:
    from tests.matrix.runner import record

    return record("gpt2", "lr_jump", root / RUN_NAME)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    ap.add_argument("--height", type=int, default=2300)
    ap.add_argument("--run", type=Path, default=None, help="an existing run directory")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        run = args.run if args.run is not None else build(Path(tmp))
        report = write_report(run, Path(tmp) / "report.html", progress=False)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_chromium(), args=LAUNCH_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": args.height})
            page.goto(report.as_uri())
            page.wait_for_timeout(1500)
            page.screenshot(path=str(args.out))
            browser.close()
    print(args.out)


if __name__ == "__main__":
    main()
