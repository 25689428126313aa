"""The recorder fixes glibc's malloc thresholds for CPU training (recorder/training/heap.py),
says so in an event, and leaves malloc alone when told to. Child processes: the thresholds are
process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import ctypes, json, sys
sys.path.insert(0, {root!r})
from torch import nn
from tracealyze.recorder import Recorder
import pyarrow.parquet as pq, glob
with Recorder({run!r}, model=nn.Linear(4, 4), system_interval_s=0, profile_start=0,
              tune_malloc={tune!r}) as rec:
    rec.step(loss=1.0)
kinds = []
for f in glob.glob({run!r} + "/events/rank=0/*.parquet"):
    kinds += pq.read_table(f).column("kind").to_pylist()
print(json.dumps(kinds))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
@pytest.mark.parametrize("tune", [True, False])
def test_cpu_training_gets_fixed_malloc_thresholds_unless_told_not_to(tmp_path: Path,
                                                                       tune: bool) -> None:
    root = str(Path(__file__).resolve().parents[2])
    code = CHILD.format(root=root, run=str(tmp_path / "run"), tune=tune)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    kinds = json.loads(out.stdout.strip().splitlines()[-1])
    assert ("malloc_tuned" in kinds) is tune


def test_the_thresholds_are_set_with_mallopt() -> None:
    from tracealyze.recorder.training import heap

    got = heap.fix_thresholds()
    if got is None:
        pytest.skip("not glibc")
    assert got == {"mmap_threshold": 32 << 20, "trim_threshold": 64 << 20}
