"""The README's framework examples, run as a user would paste them (each in a fresh
interpreter, in an empty directory), and the run they record checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from rec_helpers import run_json, steps_by_number, subprocess_env

README = Path(__file__).resolve().parents[2] / "README.md"
CLI = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]


def example(name: str) -> str:
    m = re.search(rf"<!-- readme-example: {name} -->\s*```\w+\n(.*?)```", README.read_text(),
                  re.S)
    assert m, f"README has no example {name!r}"
    return m.group(1)


@pytest.mark.parametrize("name,module", [("hf", "transformers"),
                                         ("lightning", "lightning.pytorch")])
def test_framework_example_records_its_steps(tmp_path: Path, name: str, module: str) -> None:
    pytest.importorskip(module)
    out = subprocess.run([sys.executable, "-c", example(name)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "out" / "tracealyze"
    assert run_json(run)["status"] == "completed"
    steps = steps_by_number(run)
    assert sorted(steps) == list(range(20))
    assert all(s["loss"] is not None and s["grad_norm"] is not None for s in steps.values())


def test_sweep_example_records_hparams_and_histograms(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", example("sweep")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "{'key': 'optimizer.lr', 'base': '0.1', 'new': '0.01'}" in out.stdout
    assert "batch_size" in out.stdout and "optimizer.name" in out.stdout
    for lr in ("0.1", "0.01"):
        meta = run_json(tmp_path / "runs" / f"lr-{lr}")
        assert meta["hparams"]["optimizer.lr"] == float(lr)
    # the histogram printed: the 16 x 8 first-layer gradient elements over their bins
    assert "lower" in out.stdout and "upper" in out.stdout
    from tracealyze.analyzer import open_run

    with open_run(tmp_path / "runs" / "lr-0.01") as run:
        assert run.query("SELECT sum(h.counts[b.bin + 1]) FROM histograms h CROSS JOIN "
                         "histogram_bins b WHERE h.kind = 'grad' AND h.name = '0.weight' "
                         "AND h.step = (SELECT max(step) FROM histograms)")[1] == [(16 * 8,)]


def test_record_example_runs_the_first_command(tmp_path: Path) -> None:
    line = example("record").splitlines()[0]
    assert line.startswith("tracealyze record --run-dir runs/plain -- python train.py")
    (tmp_path / "train.py").write_text(
        "import torch\nm = torch.nn.Linear(4, 1)\no = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(5):\n    m(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    o.step(); o.zero_grad()\n")
    args = line.split()[1:]
    args[args.index("python")] = sys.executable
    out = subprocess.run([*CLI, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(steps_by_number(tmp_path / "runs" / "plain")) == list(range(5))


def test_fleet_example_runs_on_the_shipped_samples(tmp_path: Path) -> None:
    import json
    import shlex
    import shutil

    samples = README.parent / "sample_traces"
    shutil.copytree(samples, tmp_path / "runs", ignore=shutil.ignore_patterns("report.html"))
    lines = [ln.split("  #")[0].replace("/shared/runs", str(tmp_path / "runs"))
             for ln in example("fleet").splitlines() if ln.strip()]
    outs = []
    for line in lines:
        args = shlex.split(line)
        assert args[0] == "tracealyze"
        out = subprocess.run([*CLI, *args[1:]], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
        outs.append(out)
    assert outs[0].returncode == 0, outs[0].stderr[-2000:]
    assert (tmp_path / "fleet.html").exists() and any((tmp_path / "fleet-reports").iterdir())
    assert outs[1].returncode == 1  # the samples hold crashed and NaN runs: the gate fails
    assert len(json.loads(outs[1].stdout)["runs"]) == len(
        [d for d in samples.iterdir() if (d / "run.json").exists()])
    assert outs[2].returncode == 0 and "nonfinite" in outs[2].stdout


def test_notebook_example_reads_a_shipped_sample_as_frames() -> None:
    # run from the repository's root, as the README says, in a fresh interpreter
    out = subprocess.run([sys.executable, "-c", example("notebook")], cwd=README.parent,
                         capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("error gradient_explosion 100 ")  # the summary's first finding
    assert "('gradient_explosion', 'error', 100)" in lines[-1]  # Analysis(run).findings
    assert "0.8" in out.stdout  # the steps frame's last rows (lr after the jump)
    assert "┌" in out.stdout  # the polars frame was built and printed
