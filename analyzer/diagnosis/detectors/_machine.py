"""Whether other work kept the machine busy during a run's slow steps (step_time_outlier,
for runs without the recorder's per-step host figures)."""

from __future__ import annotations

import math
from typing import Any

from .base import Context


def busy(ctx: Context, best: dict[str, Any], limit: float, others_cores: float
                  ) -> tuple[float, float] | None:
    """(machine CPU % during the slow steps, typical machine CPU %) when other work kept the
    machine busy then (system table, sampled in the background); None otherwise."""
    cores = ctx.run.meta.get("cpu_count")
    cores = cores if isinstance(cores, int) and cores > 0 else None
    ends = [float(t) for t in best["ends"] if math.isfinite(t)]
    if not ends:
        return None
    starts = [t - float(d) - 1.0 for t, d in zip(ends, best["durs"], strict=False)]
    cond = " OR ".join("(time BETWEEN ? AND ?)" for _ in ends[:200])
    params: list[Any] = [best["rank"]]
    for a, b in zip(starts[:200], ends[:200], strict=False):
        params += [a, b + 1.0]
    during, others, proc = ctx.rows(
        f"SELECT avg(cpu_percent), avg(cpu_percent - proc_cpu_percent / {cores or 1}), "
        f"avg(proc_cpu_percent) FROM system WHERE rank = ? AND ({cond})", params)[0]
    typical, proc_typical = ctx.rows(
        "SELECT median(cpu_percent), median(proc_cpu_percent) FROM system WHERE rank = ?",
        [best["rank"]])[0]
    if during is None or typical is None:
        return None
    if proc is not None and proc_typical and proc < 0.5 * proc_typical:
        return None  # the training process itself went idle: its own stall (I/O, a lock)
    if during >= limit and during >= typical + 20.0:
        return float(during), float(typical)
    if cores is not None and others is not None and others * cores / 100.0 >= others_cores:
        return float(during), float(typical)
    return None
