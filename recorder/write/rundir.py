"""The run directory as the recorder sees it: checked and claimed at construction (a run
already there is refused unless resuming), then run.json and this rank's file rewritten at
every heartbeat and at close. The format itself lives in ``tracealyze.format``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tracealyze.format.hparams import MAX_KEYS
from tracealyze.format.metaschema import check_meta
from tracealyze.format.parts import (
    data_parts,
    make_writable_dir,
    rank_dir,
    remove_stale_tmp,
)

from ..tensors.gradients import is_dtensor
from .ranklock import RankLock
from .runmeta import new_run_meta, rank_meta, read_json, write_json_atomic
from .schema import SCHEMA_VERSION


class RunDir:
    """Owns run.json (rank 0) and ``ranks/rank=<r>.json`` of one rank. Construction raises
    ``ValueError`` for a path that cannot hold this run; nothing else here raises to
    training (the Recorder guards the calls)."""

    def __init__(self, path: Path, *, rank: int, world_size: int, preset: str,
                 knobs: dict[str, Any], flush_interval_s: float, resume: bool,
                 model: nn.Module | None, hparams: dict[str, Any] | None = None) -> None:
        self.path = d = path
        self.rank = rank
        self.notes: dict[str, Any] = {}  # fields for the next write, from any thread
        if d.exists() and not d.is_dir():
            raise ValueError(f"run_dir {str(d)!r} exists and is not a directory")
        run_json = d / "run.json"
        mine = run_json if rank == 0 else self.rank_file
        existing = read_json(run_json) if run_json.exists() else None
        if existing is not None:  # fields of the wrong type are left out, not tripped on
            existing = check_meta(existing)[0]
        if run_json.exists() and existing is None and rank == 0:
            raise ValueError(f"{run_json} exists but is not readable JSON; refusing to "
                             "overwrite it (move it away or choose another run_dir)")
        if mine.exists() and not resume:
            status = (existing or {}).get("status", "?")
            raise ValueError(
                f"run_dir {str(d)!r} already holds a run (run_id "
                f"{(existing or {}).get('run_id', '?')}, status {status}); pass resume=True "
                "to append to it (e.g. after preemption), if_exists='new' for a new run beside "
                "it, or choose a new directory")
        try:
            make_writable_dir(d)
        except OSError as exc:
            raise ValueError(f"cannot write to run_dir {str(d)!r}: {exc.strerror or exc}") \
                from exc
        # One writer per rank folder, held until close (ranklock): checked before anything
        # is read for resume or written.
        self.lock = RankLock(d, rank)
        try:
            self.lock.acquire(flush_interval_s=flush_interval_s)
        except OSError as exc:
            raise ValueError(f"cannot lock rank {rank} of run_dir {str(d)!r}: {exc}") from exc
        self.resumed_from: int | None = None
        self.next_step = 0
        if resume and mine.exists():
            last = last_step(d, rank)
            self.next_step = 0 if last is None else last + 1
            self.resumed_from = self.next_step
            remove_stale_tmp(d, rank)
        meta = existing if (existing and resume) else new_run_meta(
            preset=preset, knobs=knobs, world_size=world_size, model=model_summary(model),
            device=device_summary(model), flush_interval_s=flush_interval_s)
        if resume and existing:
            meta.setdefault("resumes", []).append(
                {"time": time.time(), "from_step": self.next_step, "rank": rank})
            meta["status"], meta["ended"] = "running", None
            meta["knobs"], meta["preset"] = knobs, preset
            meta["schema_version"] = SCHEMA_VERSION  # new parts are written in this format
        self.hparams: dict[str, Any] = dict(meta.get("hparams") or {}) if resume else {}
        self.add_hparams(hparams or {})
        meta["hparams"] = dict(self.hparams)
        self.meta = meta
        self.rank_meta = rank_meta(rank)
        # The run's id is rank 0's: another rank takes it from run.json, or, if it started
        # before rank 0 wrote that, at its next heartbeat (adopt_run_id).
        self.rank_meta["run_id"] = (meta if rank == 0 else existing or {}).get("run_id")
        try:
            if rank == 0:
                write_json_atomic(run_json, meta)
            write_json_atomic(self.rank_file, self.rank_meta)
        except OSError as exc:
            self.lock.release()
            raise ValueError(f"cannot write run metadata in {str(d)!r}: {exc}") from exc

    @property
    def rank_file(self) -> Path:
        return self.path / "ranks" / f"rank={self.rank}.json"

    def step_committed(self) -> None:
        self.rank_meta["steps"] = self.rank_meta.get("steps", 0) + 1

    def adopt_run_id(self) -> None:
        if self.rank != 0 and not self.rank_meta.get("run_id"):
            self.rank_meta["run_id"] = (read_json(self.path / "run.json") or {}).get("run_id")

    def discard(self) -> None:
        """Take back a new run whose start failed before any step: the metadata files
        written above (so a retry is not refused), and the directories if left empty."""
        files = [self.rank_file] + ([self.path / "run.json"] if self.rank == 0 else [])
        self.lock.release()
        files.append(self.lock.path)
        for f in files:
            f.unlink(missing_ok=True)
        for d in (self.rank_file.parent, self.path):
            try:
                d.rmdir()  # only when empty: never anything else that is there
            except OSError:
                pass

    def add_hparams(self, flat: dict[str, Any]) -> int:
        """Merge flattened hyperparameters (``format.hparams.flatten``) into run.json's
        ``hparams``, later values winning; the number of new keys left out past
        ``MAX_KEYS``. Written with the next heartbeat, or at close (a crash included)."""
        dropped = 0
        for k, v in flat.items():
            if k in self.hparams or len(self.hparams) < MAX_KEYS:
                self.hparams[k] = v
            else:
                dropped += 1
        self.note(hparams=dict(self.hparams))
        return dropped

    def note(self, **fields: Any) -> None:
        """Add ``fields`` to this rank's file and run.json at the next write. Callable from
        the training thread while the writer thread writes: the dict is replaced, never
        changed, and only ``write`` (writer thread) touches the metadata it serialises."""
        self.notes = {**self.notes, **fields}

    def write(self, counters: dict[str, Any], status: str | None = None) -> None:
        """Rewrite this rank's file (and run.json on rank 0): the heartbeat, the counters,
        and at close the final ``status``."""
        now = time.time()
        self.adopt_run_id()
        fields: dict[str, Any] = {"heartbeat": now, "counters": counters, **self.notes}
        if status is not None:
            fields.update(status=status, ended=now)
        self.rank_meta.update(fields)
        write_json_atomic(self.rank_file, self.rank_meta)
        if self.rank == 0:
            self.meta.update(fields)
            write_json_atomic(self.path / "run.json", self.meta)


def model_summary(model: nn.Module | None) -> dict[str, Any] | None:
    if model is None:
        return None
    params = list(model.parameters())
    return {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "tensors": len(params),
        "modules": sum(1 for _ in model.modules()),
        "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
        "devices": sorted({str(p.device) for p in params}),
        # FSDP2: each rank records its shards; the analyzer combines them (FORMAT.md)
        "sharded": any(is_dtensor(p) for p in params),
    }


def device_summary(model: nn.Module | None) -> dict[str, Any] | None:
    dev = next((p.device for p in model.parameters()), None) if model is not None else None
    if dev is None or dev.type != "cuda":
        return {"type": dev.type if dev is not None else "cpu"}
    try:
        props = torch.cuda.get_device_properties(dev)
        return {"type": "cuda", "name": props.name, "total_memory_bytes": props.total_memory,
                "count": torch.cuda.device_count()}
    except Exception:
        return {"type": "cuda"}


def last_step(run_dir: Path, rank: int) -> int | None:
    """Highest step already recorded by this rank (for resume); unreadable parts ignored."""
    import pyarrow.parquet as pq

    best = None
    for p in data_parts(rank_dir(run_dir, "steps", rank)):
        try:
            col = pq.read_table(p, columns=["step"]).column("step")
            values = [v for v in col.to_pylist() if v is not None]
            if values:
                best = max(values) if best is None else max(best, max(values))
        except Exception:
            continue
    return best
