"""Runs for the report tests, built once per session with tests.runfactory.

``sick`` has a bit of everything the report draws: a loss spike and a NaN tail, exploding and
nonfinite gradients, host and CUDA memory leaks (with a projected OOM), slow outlier steps,
two ranks (one a straggler), a profiler trace, and hostile names and messages.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

_ROOT = Path(__file__).resolve().parents[2]

from tests.runfactory import make_run  # noqa: E402

HOSTILE = '<script>alert("x")</script></SCRIPT><!--<img src=x onerror="window.__pwned=1">'
"""A module name / message that would run script if any layer failed to escape it."""
TRACE = _ROOT / "tests" / "data" / "traces" / "gpu_alexnet_cuda_sync.json.gz"
SLOW_STEPS = (250, 700, 1100)
SPIKE_STEP = 600
NAN_FROM = 1300
STEPS = 1500


def _sick(root: Path) -> Path:
    def loss(s: np.ndarray) -> np.ndarray:
        v = 2.5 * np.exp(-s / 400) + 0.4 + 0.01 * np.sin(s / 7.0)
        v[SPIKE_STEP] = 8.0
        v[s >= NAN_FROM] = np.inf  # inf: the factory writes NaN as null
        return v

    def grad_norm(s: np.ndarray) -> np.ndarray:
        g = (1.0 + 0.05 * np.sin(s / 20)) * np.where(s > 1100, 1.03 ** (s - 1100), 1.0)
        g[s >= NAN_FROM] = np.inf
        return g

    def duration(s: np.ndarray) -> np.ndarray:
        d = 0.1 + 0.005 * np.sin(s / 13.0)
        d[list(SLOW_STEPS)] = 0.8
        return d

    def tensor_norm(steps: np.ndarray, name: str, kind: str) -> np.ndarray | None:
        if kind != "grad":
            return None
        v = 0.05 * (1 + len(name) % 5) * np.where(steps > 1100, 1.03 ** (steps - 1100), 1.0)
        if name.startswith("layers.3"):
            v = np.where(steps >= NAN_FROM, np.nan, v)
        return v

    names = [f"layers.{i}.{w}" for i in range(6) for w in ("weight", "bias")]
    rd = make_run(
        root, name="sick", steps=STEPS, ranks=2, status="crashed",
        tensors=[*names, HOSTILE + ".weight"], tensor_kinds=("grad",), tensor_norm=tensor_norm,
        loss=loss, grad_norm=grad_norm,
        duration={0: duration, 1: lambda s: 0.14 + 0 * s},
        data_wait=lambda s: 0.02 + 0.01 * (s % 10 == 0),
        lr=lambda s: 3e-4 * np.minimum(1, s / 200),
        nonfinite_grads=lambda s: (s >= NAN_FROM).astype(int) * 2,
        rss=lambda s: 2e9 + 4e5 * s, cuda_allocated=lambda s: 8e9 + 4e6 * s,
        cuda_reserved=lambda s: 1.1e10 + 4e6 * s, cuda_total=int(24e9),
        metrics={"accuracy": lambda s: 1 - np.exp(-s / 300), HOSTILE: lambda s: 0 * s + 1},
        run_meta={"host": "gpu-node-07", "model": {
            "class": "GPT2Small", "parameters": 124_000_000, "trainable_parameters": 124_000_000,
            "tensors": 13, "dtypes": ["bfloat16"], "devices": ["cuda:0"]}},
        events=[
            {"step": NAN_FROM, "kind": "nonfinite", "severity": "error",
             "subject": "layers.3.weight", "message": "gradient of layers.3.weight holds NaN"},
            {"step": NAN_FROM + 50, "kind": "exception", "severity": "critical",
             "subject": HOSTILE, "message": "RuntimeError: " + HOSTILE,
             "stack": "Traceback (most recent call last):\n  File \"train.py\", line 88\n"
                      + HOSTILE + "\nRuntimeError: boom"},
            {"step": None, "kind": HOSTILE, "severity": "info", "message": "warm-up started"},
            *({"step": int(k), "kind": "recorder_error", "severity": "warning",
               "message": "flush took 3 s"} for k in range(100, 1200, 50)),
        ],
    )
    (rd / "traces" / "rank=0").mkdir(parents=True)
    shutil.copy(TRACE, rd / "traces" / "rank=0" / "alexnet.pt.trace.json.gz")
    return rd


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> run dir: healthy, sick, running (fresh heartbeat), killed (stale heartbeat)."""
    root = tmp_path_factory.mktemp("report_runs")
    return {
        "healthy": make_run(root, name="healthy", steps=400, tensors=6,
                            metrics={"accuracy": lambda s: 1 - np.exp(-s / 100)}),
        "sick": _sick(root),
        "running": make_run(root, name="running", steps=50, status="running"),
        "killed": make_run(root, name="killed", steps=50, status="running",
                           heartbeat_age_s=7200.0),
    }


@pytest.fixture(scope="session")
def reports(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> report written to a separate folder (the run dirs stay untouched)."""
    from tracealyze.analyzer.report.page import write_report

    out = tmp_path_factory.mktemp("reports")
    return {name: write_report(rd, out / f"{name}.html", progress=False)
            for name, rd in runs.items()}
