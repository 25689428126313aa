"""FSDP2 (``fully_shard``), 2 ranks, gloo on CPU: each rank records its shards (no
collective from the recorder); the analyzer's views give the full parameters' gradient
norms, equal to an unsharded reference run's, before clipping."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from rec_helpers import run_json, subprocess_env
from reference import assert_close, grad_norms

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_fsdp2_shards_combine_into_the_true_gradient_norms(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not on PATH")
    run, ref_file = tmp_path / "run", tmp_path / "ref.json"
    out = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2",
                          str(HERE / "fsdp_child.py"), str(run), str(ref_file)],
                         capture_output=True, text=True, timeout=240,
                         env=subprocess_env())
    assert out.returncode == 0, out.stderr[-3000:]
    ref = json.loads(ref_file.read_text())
    meta = run_json(run)
    assert meta["model"]["sharded"] is True and meta["world_size"] == 2
    recorded = grad_norms(run)
    from tracealyze.analyzer.run.catalog import open_run

    with open_run(run) as r:
        totals = dict(r.con.execute("SELECT step, grad_norm FROM steps").fetchall())
        (n_shard_rows,) = r.con.execute(
            "SELECT count(*) FROM tensor_stats_shards WHERE kind = 'grad' AND step = 0"
        ).fetchone()
        (numel,) = r.con.execute(
            "SELECT sum(numel) FROM tensor_stats WHERE kind = 'grad' AND step = 0").fetchone()
    assert n_shard_rows == 2 * len(ref[0])  # one row per shard and rank, combined to one
    assert numel == meta["model"]["parameters"]  # the shards add up to the whole model
    clipped = 0
    for step, expected in enumerate(ref):
        assert set(recorded[step]) == set(expected)
        for name, v in expected.items():
            assert_close(recorded[step][name], v, 1e-3, f"{name} at {step}")
        total = math.sqrt(sum(v * v for v in expected.values()))
        assert_close(totals[step], total, 1e-3, f"grad_norm at {step}")
        clipped += total > 0.5
    assert clipped >= 1  # the recorded norms are from before clipping
