"""Regenerate docs/report.png, the README's picture of a report.

    python tests/report/make_screenshot.py [--out docs/report.png]

Builds a synthetic GPT-style run (tests.runfactory) whose learning rate is too high for its
last phase: gradients grow geometrically from step 3,000, turn NaN at 3,400 and the run
crashes; CUDA memory leaks slowly all along. Renders its report and photographs the top of
the page in headless Chromium (same launch flags as the browser test).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tracealyze.analyzer.report import write_report  # noqa: E402

from tests.report.test_browser import LAUNCH_ARGS, _chromium  # noqa: E402
from tests.runfactory import make_run  # noqa: E402

STEPS, BLOW_UP, NAN_AT = 3600, 3000, 3400


def build(root: Path) -> Path:
    rng = np.random.default_rng(7)
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(6):
        for part in ("ln_1.weight", "attn.c_attn.weight", "attn.c_proj.weight", "ln_2.weight",
                     "mlp.c_fc.weight", "mlp.c_proj.weight"):
            names.append(f"transformer.h.{i}.{part}")
    names += ["transformer.ln_f.weight", "lm_head.weight"]
    depth = {n: (int(n.split(".")[2]) if ".h." in n else (0 if "w" in n[12:15] else 6))
             for n in names}

    def growth(s: np.ndarray) -> np.ndarray:
        return np.where(s > BLOW_UP, 1.012 ** (s - BLOW_UP), 1.0)

    def loss(s: np.ndarray) -> np.ndarray:
        v = 3.2 * np.exp(-s / 900) + 2.1 + 0.04 * rng.normal(0, 1, len(s))
        v = v + np.where(s > BLOW_UP + 200, 0.002 * (s - BLOW_UP - 200), 0)
        v[s >= NAN_AT] = np.nan
        return v

    def lr(s: np.ndarray) -> np.ndarray:
        warm = np.minimum(1.0, s / 300)
        return 6e-4 * warm * (0.55 + 0.45 * np.cos(np.pi * s / STEPS))

    def grad_norm(s: np.ndarray) -> np.ndarray:
        g = (0.9 + 0.6 * np.exp(-s / 300) + 0.05 * rng.normal(0, 1, len(s))) * growth(s)
        g[s >= NAN_AT] = np.nan
        return g

    def tensor_norm(steps: np.ndarray, name: str, kind: str) -> np.ndarray | None:
        if kind != "grad":
            return None
        base = 0.02 * (1 + depth[name]) * (3 if "attn" in name else 1) * (
            0.2 if "ln" in name else 1)
        v = base * (1 + 0.08 * rng.normal(0, 1, len(steps))) * growth(steps) ** (
            1 + depth[name] / 6)
        return np.where(steps >= NAN_AT, np.nan, v) if ".h.5." in name else v

    def duration(s: np.ndarray) -> np.ndarray:
        d = 0.21 + 0.01 * np.abs(rng.normal(0, 1, len(s)))
        d[s % 500 == 499] = 1.4  # checkpointing
        return d

    return make_run(
        root, name="gpt2-small-lr6e-4", steps=STEPS, status="crashed", tensors=names,
        tensor_kinds=("grad",), tensor_norm=tensor_norm, loss=loss, lr=lr,
        grad_norm=grad_norm, duration=duration,
        data_wait=lambda s: 0.012 + 0.004 * np.abs(rng.normal(0, 1, len(s))),
        nonfinite_grads=lambda s: (s >= NAN_AT).astype(int) * 6,
        rss=lambda s: 6.1e9 + 2e7 * np.sin(s / 200),
        cuda_allocated=lambda s: 9.5e9 + 1.4e6 * s + 1e8 * np.abs(np.sin(s / 3)),
        cuda_reserved=lambda s: 1.3e10 + 1.4e6 * s,
        cuda_total=24 * 2**30,
        metrics={"tokens_per_s": lambda s: 38_000 + 900 * rng.normal(0, 1, len(s))},
        run_meta={"host": "gpu-node-07", "preset": "standard",
                  "versions": {"python": "3.11.9", "torch": "2.13.0", "cuda": "12.8",
                               "tracealyze": "0.1.0"},
                  "model": {"class": "GPT2", "parameters": 124_439_808,
                            "trainable_parameters": 124_439_808, "tensors": len(names),
                            "dtypes": ["bfloat16"], "devices": ["cuda:0"]}},
        events=[
            {"step": NAN_AT, "kind": "nonfinite", "severity": "error",
             "subject": "transformer.h.5.attn.c_attn.weight",
             "message": "gradient of transformer.h.5.attn.c_attn.weight holds NaN/Inf"},
            {"step": NAN_AT + 199, "kind": "exception", "severity": "critical",
             "message": "RuntimeError: loss is NaN, stopping",
             "stack": "Traceback (most recent call last):\n  File \"train.py\", line 212, in "
                      "<module>\n    raise RuntimeError(\"loss is NaN, stopping\")\n"
                      "RuntimeError: loss is NaN, stopping"},
        ],
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    ap.add_argument("--height", type=int, default=2300)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        report = write_report(build(Path(tmp)), Path(tmp) / "report.html", progress=False)
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
