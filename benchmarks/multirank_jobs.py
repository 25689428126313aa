"""Multi-rank profiler jobs for the many-rank benchmarks and tests.

* :func:`assembled_job` — N ranks made from a shipped real trace (HTA's sampled rank-0 trace:
  NCCL SendRecv, two ProfilerSteps): each copy gets its own ``distributedInfo.rank``, a clock
  offset (ranks on different hosts) and ±1% jitter in how long it waits in each collective;
  the ``slow`` ranks reach every collective late (they spend ``late`` of its time less in it).
* :func:`synthetic_job` — N small ranks from scratch (``steps`` ProfilerSteps of
  ``kernels`` compute kernels, each launched by its runtime call, then an all-reduce);
  ranks are named only by their file name (``worker_<r>``, no ``distributedInfo``); the
  ``slow`` ranks compute ``slowdown`` longer, so they start the all-reduce late and the others
  wait for them.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterable
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"
BASE = SHIPPED / "gpu_sampled_rank0.json.gz"


def _write(path: Path, doc: dict) -> Path:
    with gzip.open(path, "wt", compresslevel=1) as f:
        json.dump(doc, f, separators=(",", ":"))
    return path


def assembled_job(out: Path, ranks: int = 64, slow: Iterable[int] = (), late: float = 0.5,
                  seed: int = 0) -> Path:
    """``ranks`` copies of the sampled trace in ``out`` (see the module doc)."""
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(BASE) as f:
        base = json.loads(f.read())
    slow = set(slow)
    rng = random.Random(seed)
    for r in range(ranks):
        offset = rng.uniform(0, 5e6)  # another host's clock: up to 5 s apart
        events = []
        for e in base["traceEvents"]:
            e = dict(e)
            if "ts" in e:
                e["ts"] = e["ts"] + offset
            if e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl"):
                # the collective ends together on every rank; a late rank waits less in it
                cut = e["dur"] * (late if r in slow else rng.uniform(0.0, 0.01))
                e["ts"], e["dur"] = e["ts"] + cut, e["dur"] - cut
            events.append(e)
        doc = {**base, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": ranks},
               "traceEvents": events}
        _write(out / f"host{r // 8}.{r}.pt.trace.json.gz", doc)
    return out


def _rank_events(r: int, steps: int, kernels: int, slow_factor: float, wait_end: float,
                 offset: float) -> list[dict]:
    ev: list[dict] = []
    pid, tid, corr, t = 100 + r, 1, 0, offset
    step_len = wait_end + 500.0
    for s in range(steps):
        t0 = offset + s * step_len
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}",
                   "pid": pid, "tid": tid, "ts": t0, "dur": step_len - 10})
        g = t0 + 50.0
        for i in range(kernels):
            corr += 1
            t = t0 + 5.0 + 8.0 * i
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid,
                       "ts": t, "dur": 7.0, "args": {"External id": corr}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "pid": pid, "tid": tid, "ts": t + 1, "dur": 5.0,
                       "args": {"correlation": corr, "External id": corr}})
            dur = 60.0 * slow_factor
            ev.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn",
                       "pid": 0, "tid": 7, "ts": g, "dur": dur,
                       "args": {"device": 0, "stream": 7, "correlation": corr,
                                "External id": corr}})
            g += dur + 2.0
        corr += 1
        t = t0 + 5.0 + 8.0 * kernels
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
                   "tid": tid, "ts": t, "dur": 5.0, "args": {"correlation": corr}})
        end = t0 + wait_end
        ev.append({"ph": "X", "cat": "kernel",
                   "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
                   "pid": 0, "tid": 20, "ts": g, "dur": end - g,
                   "args": {"device": 0, "stream": 20, "correlation": corr}})
    return ev


def synthetic_job(out: Path, ranks: int = 1024, steps: int = 3, kernels: int = 60,
                  slow: Iterable[int] = (), slowdown: float = 0.5, seed: int = 0) -> Path:
    """``ranks`` synthetic traces in ``out`` (see the module doc)."""
    out.mkdir(parents=True, exist_ok=True)
    slow = set(slow)
    rng = random.Random(seed)
    # every rank's all-reduce ends once the slowest rank has computed and sent
    wait_end = 50.0 + kernels * (60.0 * (1 + slowdown) + 2.0) + 1500.0
    for r in range(ranks):
        factor = (1 + slowdown) if r in slow else rng.uniform(0.99, 1.01)
        events = _rank_events(r, steps, kernels, factor, wait_end, rng.uniform(0, 5e6))
        _write(out / f"worker_{r}.pt.trace.json.gz",
               {"schemaVersion": 1, "traceEvents": events})
    return out
