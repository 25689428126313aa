"""What the analysis could not check, and why: "no problems found" must not be said of a run
whose loss, gradients or memory were never recorded.

Each check names the detectors that depend on it and how to record what they need.
"""

from __future__ import annotations

from typing import Any

from ..run.catalog import Run

MIN_LOSSES = 20
MIN_MEMORY = 30
MIN_STEPS = 20


def not_checked(run: Run) -> list[dict[str, Any]]:
    """[{check, detectors, why, how}] for every family of checks the run's data cannot
    support (empty when everything could be checked)."""
    con = run.con
    steps, losses, norms, waits, durations = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE isfinite(loss)), count(grad_norm), "
        "count(data_wait_s), count(duration_s) FROM steps").fetchone()
    (grads,) = con.execute("SELECT count(*) FROM (SELECT 1 FROM tensor_stats "
                           "WHERE kind = 'grad' LIMIT 1)").fetchone()
    (mem,) = con.execute("SELECT count(*) FROM memory WHERE step IS NOT NULL").fetchone()
    (losses_any,) = con.execute("SELECT count(loss) FROM steps").fetchone()
    out: list[dict[str, Any]] = []

    def add(check: str, detectors: list[str], why: str, how: str) -> None:
        out.append({"check": check, "detectors": detectors, "why": why, "how": how})

    if not steps:
        add("everything", [], "no steps were recorded", "call rec.step() once per optimizer step")
        return out
    if losses < MIN_LOSSES:
        why = ("no loss was recorded" if not losses_any else
               f"only {losses} finite loss value(s) ({MIN_LOSSES} needed)")
        add("loss", ["loss_spike", "loss_divergence", "loss_plateau"], why,
            "pass the loss to rec.step(loss=...)")
    if not norms and not grads:
        add("gradients", ["gradient_explosion", "vanishing_gradient"],
            "no gradient norms were recorded",
            "give the Recorder the model (and optimizer), and keep grad_norm_every > 0")
    if mem < MIN_MEMORY:
        add("memory", ["memory_leak", "cuda_fragmentation"],
            f"only {mem} memory snapshot(s) ({MIN_MEMORY} needed)" if mem else
            "no memory snapshots were recorded", "keep memory_every > 0 and run longer")
    if not waits:
        add("data loading", ["dataloader_bottleneck"], "the time spent waiting for data "
            "was not recorded", "iterate over rec.wrap_loader(loader)")
    if durations < MIN_STEPS:
        add("step time", ["step_time_outlier", "straggler"],
            f"only {durations} step duration(s) ({MIN_STEPS} needed)",
            "record more steps")
    (untraced,) = con.execute(
        "SELECT count(*) FROM events WHERE kind = 'activation_tracing_unavailable'").fetchone()
    if untraced:
        (why,) = con.execute(
            "SELECT message FROM events WHERE kind = 'activation_tracing_unavailable' "
            "ORDER BY time LIMIT 1").fetchone()
        add("NaN origin by module", ["nonfinite", "dead_activation"], str(why),
            "record a debug run without torch.compile to trace module outputs")
    return out
