"""Import hygiene: the recorder lives in training processes and must not drag in the
analyzer's dependencies (DESIGN.md)."""

from __future__ import annotations

import json
from pathlib import Path

from rec_helpers import run_script, write_script

# the analyzer's dependencies, and the frameworks the integrations are for
FORBIDDEN = ("duckdb", "jinja2", "click", "transformers", "lightning", "pytorch_lightning",
             "accelerate")


def test_recorder_import_loads_no_analyzer_dependencies(tmp_path: Path) -> None:
    script = write_script(tmp_path, "imp.py", """
        import json, sys
        import tracealyze.recorder
        import tracealyze.recorder.integrations  # noqa: F401
        from tracealyze.recorder import Recorder  # noqa: F401
        # Constructing and using a recorder must not import them lazily either.
        import torch
        m = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with Recorder(sys.argv[1], model=m, optimizer=opt, system_interval_s=0,
                      flush_interval_s=0.05) as rec:
            m(torch.ones(1, 2)).sum().backward(); opt.step(); rec.step(loss=1.0)
        print(json.dumps(sorted(k for k in sys.modules
                                if k.split(".")[0] in sys.argv[2].split(","))))
    """)
    proc = run_script(script, str(tmp_path / "run"), ",".join(FORBIDDEN), timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"tracealyze.recorder imported {loaded}"
    assert (tmp_path / "run" / "run.json").exists()  # the script really used the recorder


def test_forbidden_modules_are_detectable(tmp_path: Path) -> None:
    # The check above can fail: importing one of them shows up in sys.modules.
    script = write_script(tmp_path, "neg.py", """
        import json, sys
        import click  # noqa: F401
        print(json.dumps(sorted(k for k in sys.modules if k.split(".")[0] == "click")))
    """)
    proc = run_script(script, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])


def test_recorder_without_torch_says_how_to_install_it() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import tracealyze.recorder\n"
            "except ImportError as e:\n    print('ERR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("ERR") and "needs PyTorch" in out and "tracealyze[torch]" in out


def test_first_flush_mid_training_imports_nothing(tmp_path: Path) -> None:
    # A module first imported by the writer's first flush holds the GIL mid-training and
    # shows up as a step in the process's RSS: pyarrow's lazy pandas shim alone is ~58 MB,
    # which a short healthy run's leak check took for a leak. Everything the writer needs is
    # imported when the Recorder is built.
    script = write_script(tmp_path, "flush.py", """
        import json, sys, time
        import torch
        from tracealyze.recorder import Recorder
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rec = Recorder(sys.argv[1], model=model, optimizer=opt, system_interval_s=0,
                       profile_start=0, flush_interval_s=0.3)
        before = set(sys.modules)
        for i in range(30):
            loss = model(torch.randn(3, 4)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step(); rec.step(loss=loss)
            time.sleep(0.03)  # ~1 s: the writer flushes a few times while training runs
        parts = list((__import__("pathlib").Path(sys.argv[1]) / "steps").rglob("part-*"))
        # (torch's own lazy imports, e.g. under torch.profiler, are not the writer's)
        new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] != "torch")
        rec.close()
        print(json.dumps({"parts": len(parts), "new": new}))
    """)
    proc = run_script(script, str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parts"] >= 1  # the flush really happened during training
    assert out["new"] == [], f"imported during training: {out['new'][:20]}"
