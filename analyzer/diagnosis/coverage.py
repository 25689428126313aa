"""What the analysis could not check, and why: "no problems found" must not be said of a run
whose loss, gradients or memory were never recorded.

Each check names the detectors that depend on it (their ``NEEDS``) and how to record what
they need.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ..run.catalog import Run

CHECKS: tuple[str, ...] = ("loss", "gradients", "memory", "data loading", "step time",
                           "NaN origin by module")
"""What a detector may need (its ``NEEDS``), each a family of data the recorder writes."""

MIN_LOSSES = 20
MIN_MEMORY = 30
MIN_STEPS = 20


def not_checked(run: Run, detectors: Iterable[ModuleType]) -> list[dict[str, Any]]:
    """[{check, detectors, why, how}] for every family of checks the run's data cannot
    support (empty when everything could be checked); ``detectors``: the modules that ran,
    named under each check they declare in ``NEEDS``."""
    needed: dict[str, list[str]] = {c: [] for c in CHECKS}
    for mod in detectors:
        for check in getattr(mod, "NEEDS", ()):
            needed.setdefault(check, []).append(mod.ID)
    con = run.con
    steps, losses, norms, waits, durations = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE isfinite(loss)), count(grad_norm), "
        "count(data_wait_s), count(duration_s) FROM steps").fetchone()
    (grads,) = con.execute("SELECT count(*) FROM (SELECT 1 FROM tensor_stats "
                           "WHERE kind = 'grad' LIMIT 1)").fetchone()
    (mem,) = con.execute("SELECT count(*) FROM memory WHERE step IS NOT NULL").fetchone()
    (losses_any,) = con.execute("SELECT count(loss) FROM steps").fetchone()
    out: list[dict[str, Any]] = []

    def add(check: str, why: str, how: str, detectors: list[str] | None = None) -> None:
        out.append({"check": check,
                    "detectors": needed.get(check, []) if detectors is None else detectors,
                    "why": why, "how": how})

    if not steps:
        if run.files.get("trace_events"):  # imported traces only: those were checked
            add("loss, gradients, memory, data loading and step time",
                "this run holds profiler traces but no recorded steps",
                "record the training with tracealyze.recorder, or run it under "
                "`tracealyze record`",
                sorted({d for c in CHECKS for d in needed.get(c, [])}))
        else:
            add("everything", "no steps were recorded",
                "call rec.step() once per optimizer step")
        return out
    if losses < MIN_LOSSES:
        why = ("no loss was recorded" if not losses_any else
               f"only {losses} finite loss value(s) ({MIN_LOSSES} needed)")
        add("loss", why,
            "pass the loss to rec.step(loss=...)")
    if not norms and not grads:
        add("gradients",
            "no gradient norms were recorded",
            "give the Recorder the model (and optimizer), and keep grad_norm_every > 0")
    if mem < MIN_MEMORY:
        add("memory",
            f"only {mem} memory snapshot(s) ({MIN_MEMORY} needed)" if mem else
            "no memory snapshots were recorded", "keep memory_every > 0 and run longer")
    if not waits:
        add("data loading", "the time spent waiting for data "
            "was not recorded", "iterate over rec.wrap_loader(loader)")
    if durations < MIN_STEPS:
        add("step time",
            f"only {durations} step duration(s) ({MIN_STEPS} needed)",
            "record more steps")
    (untraced,) = con.execute(
        "SELECT count(*) FROM events WHERE kind = 'activation_tracing_unavailable'").fetchone()
    if untraced:
        (why,) = con.execute(
            "SELECT message FROM events WHERE kind = 'activation_tracing_unavailable' "
            "ORDER BY time LIMIT 1").fetchone()
        add("NaN origin by module", str(why),
            "record a debug run without torch.compile to trace module outputs")
    return out
