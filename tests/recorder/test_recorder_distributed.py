"""Two ranks on the gloo backend with a DDP-wrapped model, as two real processes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from rec_helpers import HERE, TABLE_NAMES, part_files, rows, run_json, subprocess_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="torch.distributed with gloo not available"),
]
PARAM_NAMES = {"0.weight", "0.bias", "2.weight", "2.bias"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(run_dir: Path, *extra: str) -> list[str]:
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = subprocess_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                             WORLD_SIZE="2", LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "rec_ddp.py"), str(run_dir),
                                       *extra],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-3000:]
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def test_two_rank_ddp_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    outs = _launch(run_dir)
    pids = {int(line.split()[1]): int(line.split()[2])
            for out in outs for line in out.splitlines() if line.startswith("DONE")}
    assert set(pids) == {0, 1}

    for rank in (0, 1):
        # Each rank wrote its own parts, under rank=<r>, with its rank in the rows.
        for table in ("steps", "tensor_stats", "memory"):
            files = part_files(run_dir, table, rank)
            assert files, (table, rank)
            assert all(f.parent.name == f"rank={rank}" for f in files)
            assert {r["rank"] for r in rows(run_dir, table, rank)} == {rank}
        assert [r["step"] for r in rows(run_dir, "steps", rank)] == [0, 1, 2, 3]
        ts = rows(run_dir, "tensor_stats", rank)
        # Names are the user's module's own: no DDP 'module.' prefix. The gradients are
        # the same on both ranks after the all-reduce: only rank 0 writes their rows.
        grads = {r["name"] for r in ts if r["kind"] == "grad"}
        assert grads == (PARAM_NAMES if rank == 0 else set())
        act = {r["name"] for r in ts if r["kind"] == "activation"}
        assert act and not any(n.startswith("module") for n in act)
    for table in TABLE_NAMES:
        ranks_dirs = {p.name for p in (run_dir / table).glob("rank=*")} if (
            run_dir / table).exists() else set()
        assert ranks_dirs <= {"rank=0", "rank=1"}

    # Each rank's own compute before the all-reduce wait (what shows a straggler when the
    # collective makes every rank's step time equal).
    for rank in (0, 1):
        c = [r["compute_s"] for r in rows(run_dir, "steps", rank)]
        assert all(v is not None and 0 < v < 60 for v in c), c
    # DDP averaged the gradients: both ranks recorded the same gradient norms.
    g = {rank: [r["grad_norm"] for r in rows(run_dir, "steps", rank)] for rank in (0, 1)}
    assert g[0] == pytest.approx(g[1], rel=1e-5)
    l0 = [r["loss"] for r in rows(run_dir, "steps", 0)]
    l1 = [r["loss"] for r in rows(run_dir, "steps", 1)]
    assert l0 != l1  # but each its own loss

    meta = run_json(run_dir)
    assert meta["pid"] == pids[0]  # written by rank 0
    assert meta["world_size"] == 2 and meta["status"] == "completed"
    for rank in (0, 1):
        rm = json.loads((run_dir / "ranks" / f"rank={rank}.json").read_text())
        assert rm["rank"] == rank and rm["pid"] == pids[rank]
        assert rm["status"] == "completed" and rm["steps"] == 4
        assert rm["run_id"] == meta["run_id"]  # one run, whichever rank started first


def test_ddp_gradient_rows_on_every_rank_when_asked(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _launch(run_dir, "all")
    for rank in (0, 1):
        ts = rows(run_dir, "tensor_stats", rank)
        assert {r["name"] for r in ts if r["kind"] == "grad"} == PARAM_NAMES
