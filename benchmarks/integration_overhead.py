"""Overhead of each framework integration: the same training with and without tracealyze,
on the acceptance harness's workload (``../shared/bench/overhead_ab.py --model mlp``: 48
blocks of Linear(256)+LayerNorm+ReLU, batch 32, AdamW, torch on one thread).

A framework cannot have two replicas' steps interleaved, so each round trains twice in the
same process, bare and recorded, in alternating order (ABBA over rounds). A run's step time
is the median of its steady steps (after --warm steps, which hold the standard preset's
profiler window at step 50); its CPU is the process CPU time (every thread: the recorder's
writer included) over those steps. Per round: wall = recorded/bare − 1, cpu likewise; the
figure is max(wall, cpu), reported as median and spread over rounds.

    python benchmarks/integration_overhead.py hf --rounds 5
    python benchmarks/integration_overhead.py lightning --rounds 5
    python benchmarks/integration_overhead.py record --rounds 5    # tracealyze record, plain loop
    python benchmarks/integration_overhead.py hf --rounds 5 --aa   # the method's noise floor
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

torch.set_num_threads(1)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256), nn.ReLU())
                           for _ in range(48)])


class Clock:
    """Wall time, process CPU and the ticking thread's CPU at each step boundary."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.thread: list[float] = []

    def tick(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())
        self.thread.append(time.thread_time())

    def figures(self, warm: int) -> tuple[float, float]:
        steps = [b - a for a, b in zip(self.wall[warm:], self.wall[warm + 1:], strict=False)]
        cpu = (self.cpu[-1] - self.cpu[warm]) / max(1, len(steps))
        return statistics.median(steps), cpu


def hf_train(callbacks: list[Any], steps: int, out: Path, max_grad_norm: float = 1.0) -> None:
    """The workload under transformers.Trainer, with ``callbacks``."""
    import transformers

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.mse_loss(self.net(x), y)}

    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(256, generator=g), "y": torch.randn(256, generator=g)}
            for _ in range(128)]
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=32,
        learning_rate=1e-4, report_to=[], use_cpu=True, save_strategy="no",
        logging_steps=10_000, disable_tqdm=True, dataloader_num_workers=0,
        max_grad_norm=max_grad_norm)
    transformers.Trainer(model=Model(), args=args, train_dataset=rows,
                         callbacks=callbacks).train()


def lightning_fit(callbacks: list[Any], steps: int, out: Path) -> None:
    """The workload under Lightning's Trainer.fit, with ``callbacks``."""
    import lightning.pytorch as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp()

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), 1e-4)

    L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
              default_root_dir=str(out)).fit(
        Module(), torch.utils.data.DataLoader(dataset(), batch_size=32))


def dataset() -> torch.utils.data.TensorDataset:
    """The workload's 128 samples (4 batches of 32 an epoch), for every loop alike."""
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(128, 256, generator=g),
                                          torch.randn(128, 256, generator=g))


def plain_fit(step_begin: Callable[[], None], steps: int, out: Path, *, recorded: bool,
              clip: bool = False, knobs: dict[str, Any] | None = None) -> None:
    """The workload in a hand-written loop over the same DataLoader, with the plain Recorder
    when ``recorded`` (``rec.wrap_loader``, ``rec.step``): the reference the callbacks are
    held to. ``step_begin()`` at each step's begin, after its batch is fetched; ``clip``:
    ``clip_grad_norm_(1.0)``, as transformers' Trainer does."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    loader: Any = torch.utils.data.DataLoader(dataset(), batch_size=32)
    rec = None
    if recorded:
        from tracealyze.recorder import Recorder

        rec = Recorder(out / "run", model=model, optimizer=opt, **(knobs or {}))
        loader = rec.wrap_loader(loader)
    step = 0
    while step < steps:
        for x, y in loader:
            step_begin()
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if rec is not None:
                rec.step(loss)
            step += 1
            if step >= steps:
                break
    if rec is not None:
        rec.close()


def run_hf(recorded: bool, steps: int, out: Path) -> Clock:
    import transformers

    clock = Clock()

    class Tick(transformers.TrainerCallback):
        def on_step_end(self, *a: Any, **k: Any) -> None:
            clock.tick()

    callbacks: list[Any] = [Tick()]
    if recorded:
        from tracealyze.recorder.integrations.hf import TracealyzeCallback

        callbacks.insert(0, TracealyzeCallback(run_dir=out / "run"))
    hf_train(callbacks, steps, out)
    return clock


def run_lightning(recorded: bool, steps: int, out: Path) -> Clock:
    import lightning.pytorch as L

    clock = Clock()

    class Tick(L.Callback):
        def on_train_batch_end(self, *a: Any) -> None:
            clock.tick()

    callbacks: list[Any] = []
    if recorded:
        from tracealyze.recorder.integrations.lightning import TracealyzeCallback

        callbacks.append(TracealyzeCallback(run_dir=out / "run"))
    lightning_fit([*callbacks, Tick()], steps, out)
    return clock


PLAIN = '''
import json, sys, time, torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256), nn.ReLU())
                        for _ in range(48)])
opt = torch.optim.AdamW(model.parameters(), 1e-4)
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 256, generator=g),
                                      torch.randn(128, 256, generator=g))
wall, cpu = [], []
while len(wall) < int(sys.argv[1]):
    for x, y in torch.utils.data.DataLoader(data, batch_size=32):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        wall.append(time.perf_counter()); cpu.append(time.process_time())
json.dump({"wall": wall, "cpu": cpu}, open(sys.argv[2], "w"))
'''


def run_record(recorded: bool, steps: int, out: Path) -> Clock:
    script, result = out / "train.py", out / "times.json"
    script.write_text(PLAIN)
    cmd = [sys.executable, str(script), str(steps), str(result)]
    if recorded:
        cmd = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()",
               "record", "--run-dir", str(out / "run"), "--", *cmd]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ,
                                                              "OMP_NUM_THREADS": "1"})
    clock = Clock()
    times = json.loads(result.read_text())
    clock.wall, clock.cpu = times["wall"], times["cpu"]
    return clock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["hf", "lightning", "record"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=260)
    ap.add_argument("--warm", type=int, default=60)
    ap.add_argument("--aa", action="store_true",
                    help="A/A: both runs bare (the method's noise floor on this machine)")
    a = ap.parse_args()
    run = {"hf": run_hf, "lightning": run_lightning, "record": run_record}[a.mode]
    rounds = []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {}
        for recorded in order:
            with tempfile.TemporaryDirectory() as tmp:
                got[recorded] = run(recorded and not a.aa, a.steps, Path(tmp)).figures(a.warm)
        (wb, cb), (wr, cr) = got[False], got[True]
        rounds.append({"wall": wr / wb - 1, "cpu": cr / cb - 1, "bare_step_s": wb})
        print(json.dumps({"round": r, **rounds[-1]}), file=sys.stderr)
    worst = [max(x["wall"], x["cpu"]) for x in rounds]
    print(json.dumps({
        "mode": a.mode + (" A/A" if a.aa else ""), "rounds": a.rounds, "steps": a.steps,
        "warm": a.warm,
        "overhead_median": statistics.median(worst), "overhead_min": min(worst),
        "overhead_max": max(worst),
        "wall_median": statistics.median(x["wall"] for x in rounds),
        "cpu_median": statistics.median(x["cpu"] for x in rounds),
        "bare_step_ms": 1e3 * statistics.median(x["bare_step_s"] for x in rounds)}))


if __name__ == "__main__":
    main()
