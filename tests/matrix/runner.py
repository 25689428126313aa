"""Records the matrix's runs: ``record(model, pathology, run_dir)`` trains one run with the
real Recorder; ``python -m tests.matrix.runner ROOT MODEL:PATHOLOGY ...`` records several in
one fresh interpreter (the test fixture runs one such process per model), and DDP runs start
their ranks as processes of their own (gloo over loopback), as torchrun would.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tracealyze.recorder import Recorder

from .models import ModelSpec
from .pathologies import PATHOLOGIES, STEPS, STRAGGLER_RANK, Pathology
from .zoo import ALL as MODELS

REPO_ROOT = Path(__file__).resolve().parents[2]

# Recorder knobs of every matrix run: norms every step (the truth is checked to ±2 steps and
# the norm budget depends on timing), frequent flushes, no profiler window (a CPU profiler
# window only adds step-time noise to runs that are about something else).
BASE_KNOBS: dict[str, Any] = {"grad_norm_budget": 0.0, "flush_interval_s": 2.0,
                              "system_interval_s": 0.5, "profile_start": 0, "profile_every": 0}


class _SlowWorkers(torch.utils.data.Dataset):
    """Batches made by DataLoader worker processes, each taking ``delay_s`` (decoding)."""

    def __init__(self, batches: list[Any], delay_s: float) -> None:
        self.batches, self.delay_s = batches, delay_s

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay_s)
        return self.batches[i]


def _worker_delay_s(spec: ModelSpec, p: Pathology, model: nn.Module, batch: Any) -> float:
    """Seconds each DataLoader worker takes per batch: together they deliver one per
    ``p.worker_period_steps`` of the model's own training step (forward, backward, optimizer;
    the median of 6 timed on a copy, after 2 that warm the allocator up), at most one per
    ``p.worker_period_min_s``. Called before the recorder hooks the model (a copy would
    carry its hooks)."""
    if not p.workers:
        return 0.0
    model = copy.deepcopy(model)
    opt = spec.optimizer(model, spec.lr)
    times = []
    for i in range(8):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _loss(spec, p, model, batch, i).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    own = statistics.median_high(times[2:])
    return p.workers * max(p.worker_period_min_s, p.worker_period_steps * own)


def _batches(rec: Recorder, spec: ModelSpec, p: Pathology, seed: int, rank: int,
             worker_delay_s: float) -> Iterator[Any]:
    draw = spec.data(seed * 100 + rank)
    # Drawn up front, as an efficient input pipeline would have them ready: sampling the
    # synthetic language in the loop costs a third of a tiny model's step, which the
    # recorder rightly reports as data-loading time.
    batches = [draw(step) for step in range(STEPS)]
    if p.random_labels and spec.randomize is not None:
        g = torch.Generator().manual_seed(77 + seed)
        batches = [spec.randomize(b, g) for b in batches]
    if p.workers:
        yield from rec.wrap_loader(torch.utils.data.DataLoader(
            _SlowWorkers(batches, worker_delay_s), batch_size=None, shuffle=False,
            num_workers=p.workers))
        return

    def gen() -> Iterator[Any]:
        for batch in batches:
            if p.loader_delay_s:
                time.sleep(p.loader_delay_s)  # decoding/augmentation in the main process
            yield batch

    yield from rec.wrap_loader(gen())


def _poison(spec: ModelSpec, model: nn.Module, at: int, state: dict[str, int]) -> None:
    """Plain code in ``spec.nan_parent``'s forward makes a NaN right before it calls
    ``nan_child`` (a forward pre-hook on the child runs inside the parent's forward, like a
    line of arithmetic there; registered before the recorder's hooks)."""
    child = model.get_submodule(f"{spec.nan_parent}.{spec.nan_child}")

    def pre(_m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if state["step"] != at or not torch.is_grad_enabled():
            return None
        x = args[0]
        zero = torch.zeros((), dtype=x.dtype)
        x = x.clone()
        x[0, 0] = zero / zero  # 0/0: the NaN a bad division or log(0)*0 makes
        return (x, *args[1:])

    child.register_forward_pre_hook(pre)


def _poison_backward(spec: ModelSpec, model: nn.Module, at: int, state: dict[str, int]
                     ) -> None:
    """Plain code in ``spec.nan_parent``'s forward, right before it calls ``nan_child``,
    adds |h| written as sqrt(h*h) for an h that is exactly 0: the forward adds 0 (finite),
    the backward multiplies sqrt's infinite slope at 0 by 0: NaN, made in the parent."""
    child = model.get_submodule(f"{spec.nan_parent}.{spec.nan_child}")

    def pre(_m: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if state["step"] != at or not torch.is_grad_enabled():
            return None
        x = args[0]
        h = x * 0
        return (x + torch.sqrt(h * h), *args[1:])

    child.register_forward_pre_hook(pre)


def _largest(out: Any) -> torch.Tensor | None:
    """The largest tensor in a model's output (logits rather than a scalar loss)."""
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) \
        else [out]
    ts = [t for t in items if isinstance(t, torch.Tensor)]
    return max(ts, key=lambda t: t.numel()) if ts else None


def _set_up(spec: ModelSpec, p: Pathology, model: nn.Module, state: dict[str, int],
            kept: list[torch.Tensor]) -> None:
    """The pathology's changes to the model, before the optimizer is built."""
    if p.detach:
        model.get_submodule(spec.cut).register_forward_hook(
            lambda _m, _a, out: out.detach())  # the graph-cut bug
    if p.dead_from is not None:
        start = p.dead_from

        def die(_m: nn.Module, _a: Any, out: Any) -> Any:
            if state["step"] < start:
                return None
            if isinstance(out, tuple):  # (transformers' blocks: hidden states first)
                return (torch.relu(out[0] - 1e4), *out[1:])
            return torch.relu(out - 1e4)  # every unit's input far below zero: dead
        model.get_submodule(spec.cut).register_forward_hook(die)
    if p.freeze:
        model.get_submodule(spec.freeze).requires_grad_(False)
    if p.unused:
        model.unused_head = nn.Linear(8, 8)  # built, never called
    if p.keep_outputs_from is not None:
        start = p.keep_outputs_from

        def keep(_m: nn.Module, _a: Any, out: Any) -> None:
            t = _largest(out)
            if state["step"] >= start and t is not None and torch.is_grad_enabled():
                kept.append(t.detach())  # "acts[name].append(out.detach())": never cleared
        # a debugging hook that keeps every layer's output for plotting, and a list nobody
        # empties
        for m in model.modules():
            if not any(True for _ in m.children()):
                m.register_forward_hook(keep)


def _loss(spec: ModelSpec, p: Pathology, model: nn.Module, batch: Any, step: int
          ) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=p.bf16):
        loss = spec.loss(model, batch)
    if p.log0_at is not None:
        # a hand-written loss, -log(likelihood), whose likelihood underflows to 0 at one step
        lik = torch.exp(-loss) * (0.0 if step == p.log0_at else 1.0)
        loss = -torch.log(lik)
    if p.loss_factor is not None:
        loss = loss * p.loss_factor(step)
    return loss


def _halves(batch: Any, n: int) -> list[Any]:
    """A batch split into ``n`` micro-batches along its leading dimension."""
    if isinstance(batch, torch.Tensor):
        return list(batch.chunk(n))
    parts = [_halves(b, n) for b in batch]
    return [type(batch)(x[i] for x in parts) for i in range(n)]


class Unsupported(Exception):
    """This machine's torch cannot run the cell (not a failure of the recorder or the cell)."""


def _can_autocast(spec: ModelSpec, p: Pathology, model: nn.Module, seed: int) -> None:
    """The cell's first loss, before any recording: oneDNN's LSTM has no bf16 kernel on CPUs
    without AVX-512 BF16 (an AMD EPYC box: "could not create a primitive descriptor"), and a
    run that dies at its first step is no healthy bf16 run to judge."""
    try:
        with torch.no_grad():
            _loss(spec, p, model, spec.data(seed)(0), 0)
    except RuntimeError as e:
        raise Unsupported(f"bf16 autocast on this CPU: {str(e).splitlines()[0]}") from e


def record(model_name: str, pathology: str, run_dir: str | os.PathLike[str], *,
           seed: int = 0, rank: int = 0) -> Path:
    """Train one matrix run (one rank of it, for DDP runs started by :func:`record_ddp`)."""
    spec, p = MODELS[model_name], PATHOLOGIES[pathology]
    torch.set_num_threads(1)
    model = spec.build(seed)
    state = {"step": -1}
    if p.nan_at is not None:
        _poison(spec, model, p.nan_at, state)
    if p.slow_rank_s and rank == STRAGGLER_RANK:
        model.register_forward_pre_hook(lambda _m, _a: time.sleep(p.slow_rank_s))
    if p.nan_backward_at is not None:
        _poison_backward(spec, model, p.nan_backward_at, state)
    kept: list[torch.Tensor] = []
    _set_up(spec, p, model, state, kept)
    train_model: nn.Module = model
    if p.world_size > 1:
        train_model = nn.parallel.DistributedDataParallel(model)
    opt = spec.optimizer(model, spec.lr)
    if p.late_block:  # the bug: a fresh block put in after the optimizer was built
        parent, _, leaf = spec.freeze.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        fresh = copy.deepcopy(getattr(holder, leaf))
        for t in fresh.parameters():
            with torch.no_grad():
                t.add_(torch.randn_like(t) * 0.01)
        setattr(holder, leaf, fresh)
    if p.bf16:
        _can_autocast(spec, p, model, seed)
    base = [g["lr"] for g in opt.param_groups]
    mult = p.lr_schedule or p.lr_mult
    worker_delay_s = _worker_delay_s(spec, p, model, spec.data(seed * 100 + rank)(0))
    with Recorder(run_dir, model=train_model, optimizer=opt, preset=p.preset,
                  **{**BASE_KNOBS, **p.knobs}) as rec:
        for step, batch in enumerate(_batches(rec, spec, p, seed, rank, worker_delay_s)):
            state["step"] = step
            for g, lr in zip(opt.param_groups, base, strict=True):
                g["lr"] = lr * mult(step)
            opt.zero_grad(set_to_none=True)
            if p.accum > 1:
                micro = _halves(batch, p.accum)
                for i, mb in enumerate(micro):
                    part = _loss(spec, p, train_model, mb, step) / p.accum
                    part.backward()
                    if i < len(micro) - 1:
                        rec.step(loss=part.detach() * p.accum)  # folded into one step
                loss = part * p.accum
            else:
                loss = _loss(spec, p, train_model, batch, step)
                loss.backward()
            if p.clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), p.clip)
            opt.step()
            if p.stall_every and step % p.stall_every == p.stall_every - 1:
                time.sleep(p.stall_s)  # a checkpoint written synchronously
            rec.step(loss=loss.detach().float())
            if p.leak_from is not None and step >= p.leak_from:
                kept.append(loss)  # a loss history kept without .item(): graph and all
    return Path(run_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(rank: int | None = None, world: int | None = None, port: int = 0) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env["HF_HUB_OFFLINE"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if rank is not None:
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def ddp_rank(model_name: str, pathology: str, run_dir: str) -> None:
    """One DDP rank (RANK/WORLD_SIZE/MASTER_* set by :func:`record_ddp`)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        record(model_name, pathology, run_dir, rank=dist.get_rank())
    finally:
        dist.destroy_process_group()


def record_ddp(model_name: str, pathology: str, run_dir: str | os.PathLike[str],
               timeout_s: float = 300.0) -> Path:
    world = PATHOLOGIES[pathology].world_size
    port = _free_port()
    code = ("import sys; from tests.matrix.runner import ddp_rank; "
            "ddp_rank(sys.argv[1], sys.argv[2], sys.argv[3])")
    procs = [subprocess.Popen([sys.executable, "-c", code, model_name, pathology,
                               str(run_dir)], cwd=REPO_ROOT, env=_env(r, world, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout_s)
            outs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outs, strict=False):
        if p.returncode != 0:
            raise RuntimeError(f"DDP rank failed ({p.returncode}):\n{out[-3000:]}")
    return Path(run_dir)


def run_dir_of(root: Path, model: str, pathology: str, seed: int = 0) -> Path:
    return root / (f"{model}-{pathology}" + (f"-s{seed}" if seed else ""))


def main(argv: list[str]) -> None:
    """ROOT MODEL:PATHOLOGY[:SEED] ...: record each (DDP ones through their own rank
    processes; other seeds only for single-process runs)."""
    root = Path(argv[0])
    for item in argv[1:]:
        model, pathology, *rest = item.split(":")
        seed = int(rest[0]) if rest else 0
        out = run_dir_of(root, model, pathology, seed)
        t0 = time.perf_counter()
        if PATHOLOGIES[pathology].world_size > 1:
            record_ddp(model, pathology, out)
        else:
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    record(model, pathology, out, seed=seed)
            except Unsupported as e:  # the model's other cells still run
                print(f"{item}: skipped, {e}", flush=True)
                continue
        print(f"{item}: {time.perf_counter() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
