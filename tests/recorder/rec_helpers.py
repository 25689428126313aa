"""Shared helpers for the recorder tests: a tiny training loop, run-dir readers, subprocess
runner. Kept free of pytest so subprocess scripts can import it too (PYTHONPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from tracealyze.format.parts import PART_RE  # the format's own part-name rule

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

TABLE_NAMES = ("steps", "tensor_stats", "metrics", "events", "memory", "system")

# Knobs that keep a test run fast and deterministic: no background sampler (its rows arrive
# at wall-clock times), no profiler window, short flush interval, gradient norms at every
# step whatever they cost (the norm budget acts on measured timings; test_norm_budget.py).
FAST: dict[str, Any] = {"system_interval_s": 0, "profile_start": 0, "profile_every": 0,
                        "flush_interval_s": 0.05, "grad_norm_budget": 0.0}


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(dtype)


def batches(n: int, seed: int = 1, dtype: torch.dtype = torch.float32
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 4, generator=g).to(dtype), torch.randn(5, 2, generator=g).to(dtype))
            for _ in range(n)]


def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((model(x) - y) ** 2).mean()


def train(rec: Any, model: nn.Module, opt: torch.optim.Optimizer, data: Iterable[Any], *,
          order: str = "after", **metrics: Any) -> list[float]:
    """Plain training loop; ``order`` puts rec.step() after (or before) opt.step().
    Returns the losses as Python floats (read after the step, so no effect on the run)."""
    losses = []
    for x, y in data:
        loss = loss_fn(model, x, y)
        opt.zero_grad()
        loss.backward()
        if order == "before":
            rec.step(loss=loss, **metrics)
            opt.step()
        else:
            opt.step()
            rec.step(loss=loss, **metrics)
        losses.append(float(loss.detach()))
    return losses


# ------------------------------------------------------------------------- run-dir readers
def part_files(run_dir: Path, table: str, rank: int | None = None) -> list[Path]:
    """The data files of a table a correct reader uses (FORMAT.md): ``part-*.parquet`` only,
    single parts covered by a merged ``part-a-b`` skipped."""
    out: list[Path] = []
    for rd in sorted((Path(run_dir) / table).glob("rank=*")):
        if rank is not None and rd.name != f"rank={rank}":
            continue
        parts = [(PART_RE.match(p.name), p) for p in rd.iterdir()]
        parts = [(m, p) for m, p in parts if m]
        ranges = [(int(m.group(1)), int(m.group(2))) for m, _ in parts if m.group(2)]
        for m, p in sorted(parts, key=lambda mp: mp[1].name):
            if m.group(2) is None and any(a <= int(m.group(1)) <= b for a, b in ranges):
                continue
            out.append(p)
    return out


def read_table(run_dir: Path, table: str, rank: int | None = None) -> pa.Table | None:
    # File by file, with the rank of its rank=<r> folder as a column (schema_version 2 files
    # have none: the folder is the partition).
    tables = []
    for p in part_files(run_dir, table, rank):
        t = pq.read_table(p)
        assert "rank" not in t.column_names, p
        r = int(p.parent.name.split("=", 1)[1])
        tables.append(t.append_column("rank", pa.array([r] * t.num_rows, pa.int32())))
    if not tables:
        return None
    return pa.concat_tables([t.cast(tables[0].schema) for t in tables])


def rows(run_dir: Path, table: str, rank: int | None = None) -> list[dict[str, Any]]:
    t = read_table(run_dir, table, rank)
    return [] if t is None else t.to_pylist()


def steps_by_number(run_dir: Path, rank: int | None = None) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for r in rows(run_dir, "steps", rank):
        assert r["step"] not in out, f"duplicate step row {r['step']}"
        out[r["step"]] = r
    return out


def events(run_dir: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in rows(run_dir, "events") if kind is None or e["kind"] == kind]


def run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "run.json").read_text())


# ------------------------------------------------------------------------- subprocesses
def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    # Keep each child on one thread: the machine has two cores and other tests run too.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    env.update(extra)
    return env


def write_script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return path


def run_script(script: Path, *args: str, timeout: float = 60,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a Python script to completion; a hang fails the test instead of blocking CI."""
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env or subprocess_env())


# DESIGN.md's minimum columns (every table also has rank).
DESIGN_MINIMUM = {
    "steps": ["step", "time", "duration_s", "data_wait_s", "loss", "lr", "grad_norm",
              "nonfinite_grads"],
    "tensor_stats": ["step", "name", "kind", "numel", "norm", "absmax", "mean", "std", "min",
                     "max", "zero_frac", "nonfinite"],
    "metrics": ["step", "name", "value"],
    "events": ["step", "time", "kind", "severity", "subject", "message", "stack", "details"],
    "memory": ["step", "time", "rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes",
               "cuda_peak_bytes", "cuda_alloc_retries", "cuda_ooms"],
    "system": ["time", "cpu_percent", "proc_cpu_percent", "mem_percent", "gpu_util"],
    "trace_events": ["trace_id", "step", "cat", "name", "ts_us", "dur_us", "pid", "tid",
                     "stream", "correlation", "external_id"],
}


def sgd_step(model: nn.Module, opt: torch.optim.Optimizer, rec: Any, x: torch.Tensor) -> None:
    """One recorded SGD step on ``x``."""
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    rec.step(loss=loss)


def record_small_run(run_dir: str | Path, steps: int, **knobs: Any) -> list[float]:
    """A small seeded MLP trained ``steps`` steps under a Recorder at ``run_dir`` (a path or a
    store URL), 5 ms apart; the steps' durations."""
    from tracealyze.recorder import Recorder

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    durations = []
    with Recorder(run_dir, model=model, optimizer=opt, flush_interval_s=0.2,
                  system_interval_s=0, profile_start=0, **knobs) as rec:
        for _ in range(steps):
            t = time.perf_counter()
            sgd_step(model, opt, rec, torch.randn(16, 8))
            time.sleep(0.005)
            durations.append(time.perf_counter() - t)
    return durations


def cli_ok(*args: str) -> str:
    """The output of ``tracealyze ARGS`` run in process; it must succeed."""
    from click.testing import CliRunner
    from tracealyze.analyzer.cli import main

    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.output


# Detectors that read the clock or the machine (step durations, data waits, profiles, RSS):
# two recordings of the same seeded run differ there by the machine's load (a busy CI
# machine makes one 6 ms step 25 ms: an info step_time_outlier on one side only)
MEASURED = frozenset({"step_time_outlier", "straggler", "dataloader_bottleneck", "gpu_idle",
                      "host_sync", "top_ops", "memory_leak", "cuda_oom"})


def _numeric_findings(summary: dict[str, Any]) -> list[str]:
    """The ids of a summary's findings that are functions of the training's own numbers
    (losses, gradients, parameters), which a seeded run reproduces exactly."""
    return [f["id"] for f in summary["findings"] if f["id"] not in MEASURED]


def check_store_run(url: str, tmp_path: Path) -> None:
    """Record a small run to the store ``url`` and the same run locally: the store's reads
    as the local one (steps, status, findings, losses bit for bit), the spool is emptied,
    one compacted ``steps`` part is left in the store, and ``report`` writes into it."""
    from tracealyze.format import storage

    spool = tmp_path / "spool"
    record_small_run(url, 40, spool_dir=str(spool))
    record_small_run(tmp_path / "local", 40)
    remote = json.loads(cli_ok("summary", url, "--json"))
    local = json.loads(cli_ok("summary", str(tmp_path / "local"), "--json"))
    assert remote["run"]["steps"] == local["run"]["steps"] == 40
    assert remote["run"]["status"] == "completed"
    assert _numeric_findings(remote) == _numeric_findings(local)
    sql = "SELECT sum(loss), count(*) FROM steps"
    assert cli_ok("query", url, sql, "--format", "csv") == \
        cli_ok("query", str(tmp_path / "local"), sql, "--format", "csv")  # bit for bit
    assert not any(spool.iterdir())  # uploaded, then the spool is gone
    loc = storage.locate(url)
    parts = [f.rel for f in storage.list_run(loc) if f.rel.startswith("steps/")]
    assert len(parts) == 1  # compacted on close, covered parts deleted from the store
    name = url.rstrip("/").rsplit("/", 1)[1]
    assert cli_ok("report", url, "-o", f"{url}/report.html").strip() == f"{url}/report.html"
    assert f"<h1>{name}" in storage.read_bytes(loc, "report.html").decode()
