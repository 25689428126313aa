"""The TensorBoard profiler plugin's seven recommendations, each with the numbers that
triggered it (rules as the plugin's, thresholds its defaults):

1. ``dataloader``: the data loader takes over 5% of a profiled step;
2. ``data_parallel``: one process runs kernels on several GPUs (``nn.DataParallel``);
3. ``ddp_without_nccl``: GPU training whose collectives go through gloo;
4. ``communication``: communication over 10% of a profiled step;
5. ``low_gpu_utilization``: the GPU busy under 50% of a profiled step (median; of its
   own active span without ProfilerSteps) → larger batches;
6. ``tensor_cores_unused``: matmul/conv kernels are a large part of GPU time but none runs
   on Tensor Cores → AMP (bf16/fp16) or TF32;
7. ``memory_near_capacity``: peak CUDA memory over 90% of the device → activation
   checkpointing, AMP.

Each is ``{"id", "rank", "value", "threshold", "message"}``; ``rank`` None when it is about
the whole job. Read from the step overview (``gpu.overview``), the GPU time breakdown and
the recorder's memory table.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .gputime import has_trace_events
from .vocabulary import KERNEL_SQL

DATALOADER_PCT = 5.0
COMMUNICATION_PCT = 10.0
GPU_BUSY_PCT = 50.0
MEMORY_PCT = 90.0
MATMUL_SHARE_PCT = 20.0

_MATMUL = r"(?i)(gemm|conv|cutlass|wgrad|dgrad|matmul)"
_TENSOR_CORE = (r"(?i)(884|1688|16816|tensorop|xmma|hmma|wmma|bf16|fp16|f16|tf32|"
                r"sm8\d_|sm9\d_|sm10\d_|gmma|mma_)")


def _share(rows: list[dict[str, Any]], key: str) -> dict[int, tuple[float, float]]:
    """Per rank: (median share of the steps in %, worst step's share in %)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if r["total_us"] > 0:
            by.setdefault(r["rank"], []).append(100.0 * r[key] / r["total_us"])
    return {rank: (sorted(v)[len(v) // 2], max(v)) for rank, v in by.items()}


def _worst(shares: dict[int, tuple[float, float]]) -> tuple[int, float] | None:
    if not shares:
        return None
    rank = max(shares, key=lambda r: shares[r][0])
    return rank, shares[rank][0]


def recommendations(con: duckdb.DuckDBPyConnection, overview: list[dict[str, Any]],
                    gpu_time: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recommendations that apply, in the plugin's order."""
    out: list[dict[str, Any]] = []

    def add(id_: str, rank: int | None, value: float, threshold: float, message: str) -> None:
        out.append({"id": id_, "rank": rank, "value": round(value, 2),
                    "threshold": threshold, "message": message})

    def over_share(key: str, id_: str, threshold: float, what: str, advice: str) -> None:
        """A category's median share of the step, on its worst rank, over ``threshold``."""
        w = _worst(_share(overview, key))
        if w and w[1] > threshold:
            add(id_, w[0], w[1], threshold, f"{what} takes {w[1]:.1f}% of a profiled step "
                f"(median, rank {w[0]}): {advice}")

    over_share("dataloader_us", "dataloader", DATALOADER_PCT, "The data loader",
               "use DataLoader(num_workers>0, pin_memory=True, persistent_workers=True) and "
               "prefetching.")
    if not has_trace_events(con):
        return out
    for rank, devices in con.execute(
            f"SELECT rank, count(DISTINCT device) FROM trace_events WHERE cat = {KERNEL_SQL} "
            "AND device IS NOT NULL GROUP BY rank, trace_id, pid HAVING count(DISTINCT device) > 1 "
            "ORDER BY rank LIMIT 1").fetchall():
        add("data_parallel", int(rank), float(devices), 1.0,
            f"One process drives {devices} GPUs (rank {rank}): nn.DataParallel replicates "
            "the model every step from one Python thread; use DistributedDataParallel, one "
            "process per GPU.")
    (gloo, gpu) = con.execute(
        "SELECT count(*) FILTER (WHERE name LIKE 'gloo:%'), "
        f"count(*) FILTER (WHERE cat = {KERNEL_SQL}) FROM trace_events").fetchone()
    if gloo and gpu:
        add("ddp_without_nccl", None, float(gloo), 0.0,
            f"{gloo} collectives go through gloo while the model trains on GPUs: "
            "init_process_group('nccl') keeps them on the GPU.")
    over_share("communication_us", "communication", COMMUNICATION_PCT, "Communication",
               "overlap it with compute (DDP bucket_cap_mb, FSDP prefetch), accumulate "
               "gradients over more micro-batches (no_sync), or compress gradients.")
    # Only ranks whose trace holds GPU work (those the GPU time breakdown lists): a CPU-only
    # trace is 0% busy on no GPU at all, and "a larger batch size" for its GPU is nonsense.
    on_gpu = {g["rank"] for g in gpu_time}
    busy = [(r, v[0]) for r, v in _share(overview, "gpu_busy_us").items() if r in on_gpu] or [
        (g["rank"], 100.0 * (g["total_us"] - g["idle_us"]) / g["total_us"])
        for g in gpu_time if g.get("total_us")]  # no ProfilerStep: over the GPU's own span
    if busy:
        rank, pct = min(busy, key=lambda x: x[1])
        if pct < GPU_BUSY_PCT:
            add("low_gpu_utilization", rank, pct, GPU_BUSY_PCT,
                f"The GPU is busy {pct:.1f}% of the profiled time (rank {rank}): a larger "
                "batch size gives each launch more work (see also gpu_idle).")
    mm, tc, total = con.execute(
        f"SELECT sum(dur_us) FILTER (WHERE regexp_matches(name, '{_MATMUL}')), "
        f"sum(dur_us) FILTER (WHERE regexp_matches(name, '{_MATMUL}') "
        f"AND regexp_matches(name, '{_TENSOR_CORE}')), sum(dur_us) "
        f"FROM trace_events WHERE cat = {KERNEL_SQL} AND NOT starts_with(name, 'Cijk_')"
    ).fetchone()
    if total and mm and 100.0 * mm / total >= MATMUL_SHARE_PCT and not tc:
        add("tensor_cores_unused", None, 100.0 * mm / total, MATMUL_SHARE_PCT,
            f"Matmul/conv kernels take {100.0 * mm / total:.0f}% of GPU kernel time and none "
            "runs on Tensor Cores: train under torch.autocast (bf16) or allow TF32 "
            "(torch.backends.cuda.matmul.allow_tf32 = True).")
    try:
        row = con.execute(
            "SELECT rank, max(coalesce(cuda_peak_bytes, cuda_reserved_bytes)) AS peak, "
            "max(cuda_total_bytes) AS cap FROM memory GROUP BY rank "
            "HAVING cap > 0 ORDER BY peak / cap DESC LIMIT 1").fetchone()
    except duckdb.Error:  # no memory table (a trace-only run has an empty one)
        row = None
    if row and row[1] is not None and 100.0 * row[1] / row[2] > MEMORY_PCT:
        pct = 100.0 * row[1] / row[2]
        add("memory_near_capacity", int(row[0]), pct, MEMORY_PCT,
            f"Peak CUDA memory reaches {pct:.0f}% of the device (rank {row[0]}): activation "
            "checkpointing or AMP leaves room (and avoids allocator retries).")
    return out
