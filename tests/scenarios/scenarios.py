"""Real, tiny CPU training runs with one pathology each, recorded with the real Recorder.

Every ``run_*`` function trains a small model for a few hundred steps, injects its
pathology at a known step (the module-level ``*_STEP`` constants, so tests can compare the
analyzer's ``first_step`` with the truth), and returns the run directory. The same functions
feed the scenario tests (``tests/scenarios/test_scn_*.py``) and the committed sample runs
(``generate_samples.py``), so what the README shows is what the tests check.

Design notes:

* Models and data are seeded; the data is a synthetic "teacher" task that a small model
  learns steadily over a few hundred steps (so a healthy loss keeps falling and a
  plateau/divergence is the injected one, not an artefact of a too-easy task).
* Recorder knobs: a short ``flush_interval_s`` so kills lose little, profiling off unless a
  scenario asks for it (a CPU profiler window is slow and would only add noise to the
  step-time detectors of runs that are about something else).
* torch runs single-threaded inside a scenario: the CI box has two cores shared with the
  recorder's writer thread and other processes; intra-op threads only add jitter.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, TensorDataset
from tracealyze.recorder import Recorder

REPO_ROOT = Path(__file__).resolve().parents[2]

# Injection points (recorded step numbers; steps count from 0).
LR_JUMP_STEP = 100          # the learning rate is raised 80x here (a broken schedule)
NAN_STEP = 120              # a module's output is poisoned with NaN here
NAN_MODULE = "body.1.proj"  # ... this module (path from model.named_modules())
LEAK_STEP = 60              # the leaks start here
CRASH_STEP = 120            # an exception leaves the training loop here
SPIKE_STEPS = (150,)        # batches with scrambled labels (loss spikes)
SLOW_STEPS = (60, 110, 170, 230)  # steps that stall (e.g. a checkpoint write, a GC pause)
STRAGGLER_RANK = 1          # the rank that sleeps every step

# Model size: big enough that a step is a few milliseconds of torch compute (which releases
# the GIL) rather than ~1 ms of Python overhead, so scheduler and GIL jitter on a busy
# 2-core box stay small next to a step; small enough for the whole suite to run in minutes.
HIDDEN = int(os.environ.get("SCN_HIDDEN", 512))
BATCH = int(os.environ.get("SCN_BATCH", 128))

# Recorder defaults of every scenario (overridable per call). Flushes every 2 s (the default
# is 10 s): short enough that the runs exercise several part files and merging, while not
# flushing so often that the writer's work shows up as stalls in second-long runs.
BASE_KNOBS: dict[str, Any] = {
    # The gradient-norm budget depends on measured timings; scenario tests assert exact steps
    # (first NaN, explosion onset), so they read norms every step. Runs with norms spread by
    # the budget are tested on their own (tests/scenarios/test_scn_norm_stride.py).
    "grad_norm_budget": 0.0,
    "flush_interval_s": 2.0,
    "system_interval_s": 0.5,
    "profile_start": 0,
    "profile_every": 0,
}


# ---------------------------------------------------------------------------- models
def mlp(seed: int = 0, d_in: int = 32, hidden: int = HIDDEN, classes: int = 10) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        fc1=nn.Linear(d_in, hidden), act1=nn.ReLU(),
        fc2=nn.Linear(hidden, hidden), act2=nn.ReLU(),
        head=nn.Linear(hidden, classes)))


class SmallConv(nn.Module):
    """Two conv layers and a linear head over 1x12x12 'images'."""

    def __init__(self, seed: int = 0, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.head = nn.Linear(16 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, 1, 12, 12)).flatten(1))


class TinyTransformer(nn.Module):
    """Embedding + one pre-norm encoder layer + mean pooling over 8 tokens of 4 features."""

    def __init__(self, seed: int = 0, classes: int = 10, d_model: int = 32) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(4, d_model)
        self.encoder = nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True,
            norm_first=True)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x.view(-1, 8, 4)))
        return self.head(h.mean(dim=1))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.proj(x))


def nested_mlp(seed: int = 0, width: int = HIDDEN, classes: int = 10) -> nn.Module:
    """stem -> body.0, body.1 (Blocks) -> head; used where module paths matter."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        stem=nn.Linear(32, width),
        body=nn.Sequential(Block(width), Block(width)),
        head=nn.Linear(width, classes)))


def saturating_deep(seed: int = 0, depth: int = 20, width: int = 32) -> nn.Module:
    """depth x (Linear + Sigmoid): sigmoid' <= 1/4, so backprop shrinks the gradient by at
    least 4x per layer and the first layers barely learn."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(32, width), nn.Sigmoid()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Sigmoid()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class Arch:
    """A healthy-control architecture: model factory, input features, a learning rate at
    which it learns its teacher task steadily over a few hundred steps, and whether its
    labels come from a random teacher of the same architecture (conv/transformer: a task
    their inductive bias can actually fit in 300 steps) or the default MLP teacher."""

    factory: Callable[[int], nn.Module]
    d_in: int
    lr: float
    same_arch_teacher: bool


ARCHS: dict[str, Arch] = {
    "mlp": Arch(lambda seed: mlp(seed), 32, 1e-3, False),
    "conv": Arch(lambda seed: SmallConv(seed), 144, 3e-3, True),
    "transformer": Arch(lambda seed: TinyTransformer(seed), 32, 1e-3, True),
}


# ---------------------------------------------------------------------------- data
def teacher_data(seed: int = 0, n: int = 4096, d_in: int = 32, classes: int = 10,
                 teacher: nn.Module | None = None) -> TensorDataset:
    """Inputs ~ N(0, 1), labels = argmax of a random teacher network's (standardised)
    outputs, 5% label noise: learnable, but not in a handful of steps (the loss keeps
    falling for a few hundred steps of batch 32). Default teacher: a random 2-layer tanh
    MLP."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(n, d_in, generator=g)
    if teacher is None:
        w1 = torch.randn(d_in, 64, generator=g) / math.sqrt(d_in)
        w2 = torch.randn(64, classes, generator=g) / 8.0
        logits = torch.tanh(x @ w1) @ w2
    else:
        with torch.no_grad():
            logits = teacher(x)
        # standardise per class so that no class dominates the argmax
        logits = (logits - logits.mean(0)) / logits.std(0).clamp_min(1e-6)
    y = logits.argmax(dim=1)
    noisy = torch.rand(n, generator=g) < 0.05
    y[noisy] = torch.randint(0, classes, (int(noisy.sum()),), generator=g)
    return TensorDataset(x, y)


def regression_data(seed: int = 0, n: int = 4096, d_in: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(20_000 + seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, 1, generator=g) / math.sqrt(d_in)
    return TensorDataset(x, x @ w + 0.05 * torch.randn(n, 1, generator=g))


class SlowDataset(Dataset):
    """A dataset whose batches are expensive to produce (decoding/augmentation stand-in: a
    sleep per fetched batch; the loader hands it whole lists of indices)."""

    def __init__(self, base: TensorDataset, delay_s: float) -> None:
        self.base = base
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        time.sleep(self.delay_s)
        return self.base[idx]


def loader_for(ds: Dataset, seed: int = 0, batch_size: int = BATCH) -> DataLoader:
    """Whole batches are indexed at once (``ds[list_of_indices]``), as an efficient
    in-memory pipeline would, so that a healthy run's step is not dominated by the
    per-sample Python overhead of the default collate path on such a tiny model."""
    g = torch.Generator().manual_seed(seed)
    sampler = BatchSampler(RandomSampler(ds, generator=g), batch_size, drop_last=True)
    return DataLoader(ds, sampler=sampler, batch_size=None)


# ---------------------------------------------------------------------------- the loop
@dataclass
class Hooks:
    """Where a scenario injects its pathology into the common loop."""

    before: Callable[[int], None] | None = None
    """called with the step number before the forward pass."""
    batch: Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] \
        | None = None
    """may replace the step's batch (corrupted data)."""
    after: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None
    """called with (step, x, output, loss) after rec.step (leaks, stalls, crashes)."""
    lr: Callable[[int], float] | None = None
    """learning rate schedule (None: constant)."""
    state: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _batches(rec: Recorder, loader: DataLoader, steps: int) -> Iterator[tuple[Any, Any]]:
    """``steps`` batches, re-iterating the loader over epochs, each timed by the recorder."""
    n = 0
    while n < steps:
        for batch in rec.wrap_loader(loader):
            yield batch
            n += 1
            if n >= steps:
                return


def train(run_dir: str | os.PathLike[str], *, model: nn.Module, steps: int = 200,
          data: Dataset | None = None, seed: int = 0, lr: float = 1e-3, optimizer: str = "adam",
          opt_params: Any = None, loss: str = "ce", hooks: Hooks | None = None,
          preset: str = "standard", clip: float | None = None, batch_size: int = BATCH,
          **knobs: Any) -> Path:
    """The common training loop every scenario runs (see module docstring)."""
    run_dir = Path(run_dir)
    hooks = hooks or Hooks()
    data = data if data is not None else teacher_data(seed)
    loader = loader_for(data, seed, batch_size)
    params = opt_params if opt_params is not None else model.parameters()
    opt: torch.optim.Optimizer = (torch.optim.Adam(params, lr=lr) if optimizer == "adam"
                                  else torch.optim.SGD(params, lr=lr))
    loss_fn: Callable[..., torch.Tensor] = (nn.functional.cross_entropy if loss == "ce"
                                            else nn.functional.mse_loss)
    with _one_thread(), Recorder(run_dir, model=model, optimizer=opt, preset=preset,
                                 **{**BASE_KNOBS, **knobs}) as rec:
        for i, (x, y) in enumerate(_batches(rec, loader, steps)):
            if hooks.lr is not None:
                for group in opt.param_groups:
                    group["lr"] = hooks.lr(i)
            if hooks.before is not None:
                hooks.before(i)
            if hooks.batch is not None:
                x, y = hooks.batch(i, x, y)
            out = model(x)
            loss_t = loss_fn(out, y)
            opt.zero_grad(set_to_none=True)
            loss_t.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            rec.step(loss=loss_t.detach())
            if hooks.after is not None:
                hooks.after(i, x, out, loss_t)
    return run_dir


# ---------------------------------------------------------------------------- scenarios
def run_healthy(run_dir: str | os.PathLike[str], *, arch: str = "mlp", seed: int = 0,
                steps: int = 300, **knobs: Any) -> Path:
    """Control: a well-configured model learning the teacher task (Adam, lr 1e-3)."""
    spec = ARCHS[arch]
    teacher = spec.factory(seed + 777) if spec.same_arch_teacher else None
    knobs.setdefault("lr", spec.lr)
    return train(run_dir, model=spec.factory(seed), steps=steps, seed=seed,
                 data=teacher_data(seed, d_in=spec.d_in, teacher=teacher), **knobs)


LEAK_BYTES_PER_STEP = 1 << 20  # ~1 MiB kept alive per step by every leak scenario


def run_leak_tensor_list(run_dir: str | os.PathLike[str], *, seed: int = 0,
                         steps: int = 200, **knobs: Any) -> Path:
    """Leak: every step appends fresh tensors (a copy of the batch's features, as a
    'debug buffer' would) to a Python list that is never cleared."""
    kept: list[torch.Tensor] = []

    def after(i: int, x: torch.Tensor, out: torch.Tensor, loss: torch.Tensor) -> None:
        if i >= LEAK_STEP:
            kept.append(torch.randn(LEAK_BYTES_PER_STEP // 4))

    return train(run_dir, model=mlp(seed), steps=steps, seed=seed,
                 hooks=Hooks(after=after), **knobs)


def run_leak_loss_history(run_dir: str | os.PathLike[str], *, seed: int = 0,
                          steps: int = 200, **knobs: Any) -> Path:
    """Leak: a 'running validation loss' computed every step without torch.no_grad() and
    appended to a history list without .item(): each entry keeps its whole autograd graph
    alive, including the activations saved for a backward pass that never comes."""
    history: list[torch.Tensor] = []
    probe = teacher_data(seed + 1, n=512).tensors

    def after(i: int, x: torch.Tensor, out: torch.Tensor, loss: torch.Tensor) -> None:
        # 512 x 64 float hidden activations, saved twice per layer: ~0.5 MiB per step
        if i >= LEAK_STEP:
            history.append(nn.functional.cross_entropy(model(probe[0]), probe[1]))

    model = mlp(seed)
    return train(run_dir, model=model, steps=steps, seed=seed, hooks=Hooks(after=after),
                 **knobs)


def run_leak_cache_dict(run_dir: str | os.PathLike[str], *, seed: int = 0,
                        steps: int = 200, **knobs: Any) -> Path:
    """Leak: a memo cache keyed by step number (so it never hits) that stores each step's
    output logits and a feature buffer; entries are never evicted."""
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def after(i: int, x: torch.Tensor, out: torch.Tensor, loss: torch.Tensor) -> None:
        if i >= LEAK_STEP:
            cache[i] = (out.detach().clone(), torch.empty(LEAK_BYTES_PER_STEP // 4).fill_(i))

    return train(run_dir, model=mlp(seed), steps=steps, seed=seed,
                 hooks=Hooks(after=after), **knobs)


def run_high_lr(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 200,
                jump: float = 80.0, hidden: int = 64, **knobs: Any) -> Path:
    """Too-high learning rate: plain SGD on a small tanh regression MLP learns fine at lr
    0.01, then a broken schedule raises it ``jump`` (80) times at LR_JUMP_STEP. The weights
    oscillate with growing amplitude: the gradient norm grows geometrically (x2-x10 per
    step) for a couple of dozen steps, overflows to Inf, and the loss turns NaN.
    (hidden=512, jump=10, batch_size=512: the larger lr is still stable, a control.)"""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    base = 0.01

    def lr(i: int) -> float:
        return base if i < LR_JUMP_STEP else base * jump

    return train(run_dir, model=model, steps=steps, seed=seed, data=regression_data(seed),
                 optimizer="sgd", lr=base, loss="mse", hooks=Hooks(lr=lr), **knobs)


def run_nan_in_module(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 160,
                      preset: str = "debug", **knobs: Any) -> Path:
    """NaN injected into the output of NAN_MODULE at NAN_STEP (debug preset: every module's
    output is checked for NaN/Inf every step). Training goes on with NaN afterwards, as an
    unattended job would."""
    model = nested_mlp(seed)
    layer = model.get_submodule(NAN_MODULE)
    state = {"step": -1}

    # Poison the layer's output with a forward hook registered *before* the recorder's (so
    # the recorder sees the NaN output exactly as if the layer itself had produced it, and
    # the module keeps its real path).
    def hook(_m: nn.Module, _inp: Any, out: torch.Tensor) -> torch.Tensor | None:
        if state["step"] != NAN_STEP:
            return None
        out = out.clone()
        out[0, 0] = float("nan")
        return out

    layer.register_forward_hook(hook)

    def before(i: int) -> None:
        state["step"] = i

    return train(run_dir, model=model, steps=steps, seed=seed, optimizer="sgd", lr=0.05,
                 hooks=Hooks(before=before), preset=preset, **knobs)


def run_vanishing(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 200,
                  **knobs: Any) -> Path:
    """20 Linear+Sigmoid layers with PyTorch's default init and plain SGD: the gradient
    reaching the first layers is ~4^-20 of the last layer's."""
    return train(run_dir, model=saturating_deep(seed), steps=steps, seed=seed,
                 optimizer="sgd", lr=0.1, **knobs)


def run_slow_dataloader(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 150,
                        delay_s: float = 0.02, **knobs: Any) -> Path:
    """Each batch costs delay_s to load in the main process (num_workers=0), several times
    the few milliseconds the step computes."""
    return train(run_dir, model=mlp(seed), steps=steps, seed=seed,
                 data=SlowDataset(teacher_data(seed), delay_s), **knobs)


def run_frozen_lr0(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 200,
                   **knobs: Any) -> Path:
    """Frozen optimizer: lr=0 (e.g. a scheduler that starts from 0 and never warms up)."""
    return train(run_dir, model=mlp(seed), steps=steps, seed=seed, lr=0.0, **knobs)


def run_frozen_stale_params(run_dir: str | os.PathLike[str], *, seed: int = 0,
                            steps: int = 200, **knobs: Any) -> Path:
    """Frozen optimizer: the optimizer was built over the parameters of an earlier model
    object (the model was re-created afterwards), so it steps tensors nobody uses."""
    stale = mlp(seed + 100)
    model = mlp(seed)

    def before(i: int) -> None:
        model.zero_grad(set_to_none=True)  # the optimizer's zero_grad misses these

    return train(run_dir, model=model, steps=steps, seed=seed,
                 opt_params=stale.parameters(), hooks=Hooks(before=before), **knobs)


class SimulatedFailure(RuntimeError):
    """What run_crash raises inside the recorder's with block."""


def run_crash(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 200,
              **knobs: Any) -> Path:
    """An exception leaves the training loop at CRASH_STEP (after that step was recorded,
    before the next one): the recorder records it and marks the run crashed. The exception
    is swallowed here so callers get the run dir."""

    def before(i: int) -> None:
        if i == CRASH_STEP:
            raise SimulatedFailure(f"simulated failure while loading batch {i}")

    with contextlib.suppress(SimulatedFailure):
        train(run_dir, model=mlp(seed), steps=steps, seed=seed, hooks=Hooks(before=before),
              **knobs)
    return Path(run_dir)


def run_step_time_outliers(run_dir: str | os.PathLike[str], *, seed: int = 0,
                           steps: int = 260, stall_s: float = 0.3, **knobs: Any) -> Path:
    """A few steps stall for stall_s (a synchronous checkpoint write, a GC pause)."""

    def after(i: int, x: torch.Tensor, out: torch.Tensor, loss: torch.Tensor) -> None:
        # sleep *before* the next step's work: the stall counts into step i+1's duration
        if i + 1 in SLOW_STEPS:
            time.sleep(stall_s)

    return train(run_dir, model=mlp(seed), steps=steps, seed=seed, hooks=Hooks(after=after),
                 **knobs)


def run_loss_spike(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 260,
                   **knobs: Any) -> Path:
    """A corrupted batch (labels scrambled, e.g. a shard with misaligned labels) at each of
    SPIKE_STEPS: the loss of that step jumps far above its level. Gradient clipping keeps
    the one bad update from derailing training."""

    def batch(i: int, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if i in SPIKE_STEPS:
            g = torch.Generator().manual_seed(i)
            # scale the inputs too: confident wrong predictions, a clear spike
            return x * 4.0, torch.randint(0, 10, y.shape, generator=g)
        return x, y

    return train(run_dir, model=mlp(seed), steps=steps, seed=seed, hooks=Hooks(batch=batch),
                 clip=1.0, **knobs)


# ---------------------------------------------------------------------------- processes
def _child_env(rank: int | None = None, world: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    if rank is not None:
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], cwd=str(REPO_ROOT), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def rank_worker(run_dir: str, rank: int, steps: int, delay_s: float, seed: int) -> None:
    """One rank of the straggler scenario (runs in a child process with RANK set): the same
    model and data on every rank; the slow rank sleeps delay_s per step (a throttled GPU,
    a noisy neighbour)."""

    def after(i: int, x: torch.Tensor, out: torch.Tensor, loss: torch.Tensor) -> None:
        if delay_s:
            time.sleep(delay_s)

    train(run_dir, model=mlp(seed), steps=steps, seed=seed, hooks=Hooks(after=after))


def run_straggler(run_dir: str | os.PathLike[str], *, seed: int = 0, steps: int = 200,
                  delay_s: float = 0.01, timeout_s: float = 180.0) -> Path:
    """Two ranks (RANK/WORLD_SIZE set, as torchrun does) writing into one run dir; rank
    STRAGGLER_RANK sleeps delay_s every step."""
    run_dir = Path(run_dir)
    procs = []
    for rank in (0, 1):
        delay = delay_s if rank == STRAGGLER_RANK else 0.0
        code = ("from tests.scenarios.scenarios import rank_worker; "
                f"rank_worker({str(run_dir)!r}, {rank}, {steps}, {delay}, {seed})")
        procs.append(_python(code, _child_env(rank, 2)))
    for p in procs:
        out, _ = p.communicate(timeout=timeout_s)
        if p.returncode != 0:
            raise RuntimeError(f"rank process failed ({p.returncode}):\n{out.decode()}")
    return run_dir


def killed_worker(run_dir: str, steps: int, seed: int) -> None:
    """Trains 'forever' (steps is large); the parent kills it with SIGKILL."""
    run_healthy(run_dir, seed=seed, steps=steps, flush_interval_s=0.2)


def run_killed(run_dir: str | os.PathLike[str], *, seed: int = 0, min_steps: int = 100,
               timeout_s: float = 120.0) -> Path:
    """A training process killed with SIGKILL (OOM killer, preemption without grace): no
    handler runs, run.json still says 'running'. Killed once at least min_steps steps are
    on disk."""
    import pyarrow.parquet as pq

    run_dir = Path(run_dir)
    code = ("from tests.scenarios.scenarios import killed_worker; "
            f"killed_worker({str(run_dir)!r}, 1_000_000, {seed})")
    proc = _python(code, _child_env())
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"training process exited early ({proc.returncode}):\n{out}")
            rows = 0
            for part in (run_dir / "steps" / "rank=0").glob("part-*.parquet"):
                with contextlib.suppress(Exception):
                    rows += pq.ParquetFile(part).metadata.num_rows
            if rows >= min_steps:
                break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"fewer than {min_steps} steps recorded in {timeout_s}s")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
    return run_dir


def run_strided_norms(run_dir: str | os.PathLike[str], *, scenario: str = "run_healthy",
                      **knobs: Any) -> Path:
    """Any scenario with the gradient norms spread by the norm budget, as on a host where
    reading them costs more than 1% of the step: a budget no read meets and no floor, so
    after the warm-up reads (11 steps) they come every 64th step."""
    from tracealyze.recorder.tensors import budget

    budget.MIN_COST_S = 0.0  # this process only (scenarios run in their own interpreter)
    return globals()[scenario](run_dir, **{**knobs, "grad_norm_budget": 1e-9})
