"""Cause before symptom: link findings that one explains, and order them root cause first.

A gradient explosion explains the NaN that follows it; a divergence explains the loss
spikes and the plateau after it; a data-loading bottleneck explains an idle GPU. Sorting
by severity alone lists "NaN at step 250" (critical) above "gradients exploding since step
100, right after the LR went from 3e-4 to 3e-2" (error), which is the wrong way round for
someone deciding what to fix.

Each rule says: a finding of id ``symptom`` is explained by one of id ``cause`` when the
cause starts no later than the symptom (``slack`` steps of detection blur allowed); a NaN is
explained only by a growth or divergence that itself ended in NaN. A finding explained by
another gets ``caused_by`` (the root's id, following chains to the root); a root lists what it
``explains``. Groups are ordered by their most severe member, then by the root's step; each
root is followed by the findings it explains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .findings import Finding, rank_findings, severity_rank


@dataclass(frozen=True)
class Rule:
    symptom: str
    causes: tuple[str, ...]
    """Candidate causes, in order of preference."""
    slack: int = 2
    needs_step: bool = True
    """Both must have a first_step (else the rule does not apply)."""


# The instability chain: a learning-rate jump (named in the cause's evidence) makes the
# gradients explode, the loss diverge, spike and turn NaN; after that it plateaus.
# A batch that threw the run (a loss spike that stands out, evidence.batch) starts it: the
# explosion, divergence, NaN or plateau that begins with it is its consequence.
# Units that die change the model's function at their step: the loss jumps (to the class
# prior when nothing passes), the layers after them see new inputs and their gradients jump;
# those begin with the death (dead_activation, dated where the gradients went exactly to
# zero). Units killed by an update (one bad batch's, an exploding one's) die after it.
RULES: tuple[Rule, ...] = (
    Rule("gradient_explosion", ("loss_spike", "dead_activation")),
    Rule("loss_divergence", ("gradient_explosion", "loss_spike", "dead_activation"), slack=5),
    Rule("nonfinite", ("gradient_explosion", "loss_divergence", "loss_spike")),
    Rule("loss_spike", ("dead_activation", "gradient_explosion", "loss_divergence",
                        "nonfinite"), slack=5),
    Rule("dead_activation", ("loss_spike", "gradient_explosion")),
    # parameters that cannot learn (a graph cut, a block frozen by mistake, a head the
    # optimizer does not hold, gradients that vanished) explain a loss that does not fall
    Rule("loss_plateau", ("gradient_explosion", "loss_divergence", "nonfinite",
                          "optimizer_coverage", "no_gradient", "unused_module",
                          "dead_activation", "loss_spike", "vanishing_gradient"), slack=5),
    Rule("update_ratio", ("gradient_explosion", "loss_divergence", "nonfinite",
                          "dead_activation"), slack=5),
    # dead units pass no gradient: the layers behind them (upstream) get none either
    Rule("vanishing_gradient", ("dead_activation",), slack=5),
    # a CUDA OOM is what ended the run; a leak of CUDA memory is what ran into the capacity
    Rule("training_crashed", ("nonfinite", "cuda_oom", "memory_leak"), needs_step=False),
    Rule("cuda_oom", ("memory_leak",), needs_step=False),
    Rule("gpu_idle", ("dataloader_bottleneck", "host_sync"), needs_step=False),
)


_COVERAGE = ("optimizer_coverage", "no_gradient", "unused_module")
_IDLE_CAUSE = {"host_sync": "host_sync", "dataloader_bottleneck": "input_bound"}
"""gpu_idle's evidence.cause that each of its candidate causes must match."""


def _explains(cause: Finding, symptom: Finding, rule: Rule) -> bool:
    if "dead_activation" in (cause.id, symptom.id):
        return _dead(cause, symptom, rule)
    if cause.id in _COVERAGE and cause.severity == "info":
        return False  # a block frozen on purpose is context, not a cause
    if cause.id == "loss_divergence" and "loss_factor" in cause.evidence:
        return False  # a rescaled objective (info) is the loss's scale, not an instability
    if cause.id == "loss_spike":
        # only a batch that threw the run, and only what began with it (not before)
        return bool(cause.evidence.get("batch")) and _began_with(symptom, cause, rule.slack)
    if rule.needs_step:
        if cause.first_step is None or symptom.first_step is None:
            return False
        if cause.first_step > symptom.first_step + rule.slack:
            return False
    if symptom.id == "loss_spike" and symptom.evidence.get("batch") and \
            _began_with(cause, symptom, 2):
        return False  # it began with the batch: the batch is the cause, not the symptom
    if symptom.id == "nonfinite":
        # only a growth or divergence that itself ended in NaN/Inf explains the NaN (a rise
        # long before a NaN made elsewhere does not)
        if cause.id == "gradient_explosion":
            return cause.evidence.get("first_nonfinite_step") is not None
        if cause.id == "loss_divergence":
            return bool(cause.evidence.get("ended_nonfinite"))
    if symptom.id == "gpu_idle":
        # an idle GPU is a consequence of syncs or of its input only when the trace says so
        # (gpu.idle_cause): a sync or a data wait in the run does not make the GPU wait
        return symptom.evidence.get("cause") == _IDLE_CAUSE.get(cause.id)
    if symptom.id == "training_crashed" and cause.id in ("memory_leak", "cuda_oom"):
        return bool(symptom.evidence.get("oom") or "memory" in symptom.message.lower())
    if symptom.id == "cuda_oom":
        # the leak is the OOM's cause only when the OOM was diagnosed as one, in CUDA memory
        return (symptom.evidence.get("cause") == "leak"
                and cause.subject == "cuda_allocated_bytes")
    return True


def _dead(cause: Finding, symptom: Finding, rule: Rule) -> bool:
    """Dead units explain what began at their step or after (a dead forward makes that
    step's loss and the later layers' gradients: no slack before it, but for the slow
    symptoms whose onsets blur); they are explained by an update before them (a batch that
    threw the run, an explosion) that they followed within BATCH_LEAD steps and the rule's
    slack, never by what began at their own step."""
    if cause.first_step is None or symptom.first_step is None:
        return False
    if cause.id == "dead_activation":
        return cause.first_step <= symptom.first_step + (
            rule.slack if symptom.id in ("loss_divergence", "loss_plateau", "update_ratio",
                                         "vanishing_gradient") else 0)
    if cause.first_step >= symptom.first_step:
        return False
    if cause.id == "loss_spike":
        return bool(cause.evidence.get("batch")) and _began_with(symptom, cause, rule.slack)
    return symptom.first_step - cause.first_step <= BATCH_LEAD + rule.slack


BATCH_LEAD = 10
"""Steps an onset estimate may come before the batch it began with (a smoothed series bends
a few steps early): the window in which _changes.within names a learning-rate jump as the
cause of an instability."""


def _began_with(f: Finding, spike: Finding, slack: int) -> bool:
    """Did ``f`` begin with the batch of ``spike`` (evidence.batch)? Not when it began after the
    loss had come back (evidence.batch.until, BATCH_LEAD steps of grace). Its onset is at the
    batch (within ``slack``), unless it is a gradient already past its explosion bar before
    the batch (the update of the step before threw the loss: a clip taken away, applied
    norm ×14, then the loss ×25); or it is a growth that became clear only after the batch
    (crossing_step at or after it) with an onset at most BATCH_LEAD steps before; or a
    divergence from a best level the loss still held right before the batch."""
    batch = spike.evidence.get("batch") or {}
    b = batch.get("step")
    if f.first_step is None or b is None:
        return False
    if f.first_step > batch.get("until", b) + BATCH_LEAD:
        return False  # it began after the loss had come back: not the batch's doing
    cross = f.evidence.get("crossing_step")
    if f.id == "gradient_explosion" and cross is not None and cross < b:
        return False  # out of range before the batch: the update before it threw the loss
    if f.first_step >= b - slack:
        return True
    if cross is not None and cross >= b and f.first_step >= b - BATCH_LEAD:
        return True
    best, noise, level = (f.evidence.get("best_loss"), f.evidence.get("loss_noise"),
                          batch.get("level"))
    return f.id == "loss_divergence" and None not in (best, noise, level) and \
        level <= best + 2 * noise


def link(findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` with ``caused_by``/``explains`` set, ordered root cause first."""
    ranked = rank_findings(list(findings))
    parent: dict[int, int] = {}
    rules = {r.symptom: r for r in RULES}
    for i, f in enumerate(ranked):
        rule = rules.get(f.id)
        if rule is None or (f.severity == "info" and f.id != "loss_plateau"):
            continue
        for cause_id in rule.causes:
            j = next((j for j, c in enumerate(ranked) if c.id == cause_id and j != i
                      and _explains(c, f, rule)), None)
            if j is not None:
                parent[i] = j
                break

    # A plateau that a problem explains is the run stopping because of it, not convergence
    # (a converging loss has no cause): at least a warning, whatever its own share of the
    # run (the loss thrown to chance for the last 38% of a run by one batch). Only under a
    # cause above info, so a clean run never gains a finding from it.
    for i, j in parent.items():
        if ranked[i].id == "loss_plateau" and ranked[i].severity == "info" \
                and ranked[j].severity != "info":
            ranked[i] = dataclasses.replace(ranked[i], severity="warning")

    def root(i: int) -> int:
        seen = {i}
        while i in parent and parent[i] not in seen:
            i = parent[i]
            seen.add(i)
        return i

    groups: dict[int, list[int]] = {}
    for i in range(len(ranked)):
        groups.setdefault(root(i), []).append(i)
    order = sorted(groups, key=lambda r: (
        -max(severity_rank(ranked[i].severity) for i in groups[r]),
        ranked[r].first_step is None, ranked[r].first_step or 0, r))
    out: list[Finding] = []
    for r in order:
        members = groups[r]
        explained = tuple(dict.fromkeys(ranked[i].id for i in members if i != r))
        out.append(dataclasses.replace(ranked[r], caused_by=None, explains=explained))
        out.extend(dataclasses.replace(ranked[i], caused_by=ranked[r].id, explains=())
                   for i in members if i != r)
    return out
