"""Kineto prints 'USDT ... profiler_start/stop' on stderr at every profiler window; the
``profile_quiet`` knob silences it (opt-in: it hides Kineto's error lines too)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rec_helpers import run_script, write_script

SCRIPT = """
import sys, torch
from rec_helpers import batches, tiny_model, train
from tracealyze.recorder import Recorder
model = tiny_model(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
with Recorder(sys.argv[1], model=model, optimizer=opt, system_interval_s=0, profile_start=2,
              profile_quiet=sys.argv[2] == "1") as rec:
    train(rec, model, opt, batches(8))
print("OK")
"""


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [False, True])
def test_profile_quiet(tmp_path: Path, quiet: bool) -> None:
    script = write_script(tmp_path, "prof.py", SCRIPT)
    res = run_script(script, str(tmp_path / "run"), "1" if quiet else "0")
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr
    assert ("profiler_start" in res.stderr) is not quiet
    assert list((tmp_path / "run" / "traces" / "rank=0").glob("*.json.gz"))
