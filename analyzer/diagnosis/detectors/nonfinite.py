"""nonfinite: where NaN/Inf first appeared (DESIGN.md rule).

Subject, in order of preference: the module whose activation went nonfinite first at the
first nonfinite step (lowest ``seq``: post-order, so its inputs came from modules that had
finished with finite outputs); ``input`` when an event or a watch row says the batch itself was
nonfinite; else the first parameter in model order whose gradient went nonfinite; else
``loss``. With a GradScaler, occasional inf gradients on skipped steps are normal and only
reported as info unless frequent.
"""

from __future__ import annotations

from typing import Any

from .. import anchors
from ..findings import Finding
from ..thresholds import Thresholds
from . import _changes, _data, _structure
from .base import Context

ID = "nonfinite"
# per rank: all skipped steps, steps with an AMP flag, and the skips that are not the
# scaler's calibration (before its first applied step) nor a probe of a grown scale
_AMP_SKIPS = """
WITH s AS (
    SELECT rank, step, amp_skipped,
           loss_scale > lag(loss_scale) OVER (PARTITION BY rank ORDER BY step) AS grown,
           min(step) FILTER (WHERE NOT amp_skipped) OVER (PARTITION BY rank) AS first_ok
    FROM steps WHERE amp_skipped IS NOT NULL)
SELECT count(*) FILTER (WHERE amp_skipped), count(*),
       count(*) FILTER (WHERE amp_skipped AND step > coalesce(first_ok, step)
                        AND NOT coalesce(grown, false))
FROM s"""
NEEDS: tuple[str, ...] = ("NaN origin by module",)
DEFAULTS: dict[str, Any] = {
    "amp_skip_frac": 0.05,   # with AMP, more than this share of skipped steps → warning
}
DOC = {
    "meaning": "NaN or Inf appeared in the loss, gradients or activations.",
    "rule": "first step with a nonfinite loss, gradient norm, nonfinite_grads > 0, tensor "
            "norm/nonfinite count or nonfinite event; subject = the module whose forward made "
            "it: its output went nonfinite while its inputs were finite (debug preset's NaN "
            "tracing probes module inputs and outputs; plain code in a parent's forward is the "
            "parent's), 'input' for a nonfinite batch; else, the forward finite, the module "
            "whose backward turned finite gradients nonfinite (debug preset's backward "
            "probes on module inputs and outputs; 'loss' when the gradient reaching the "
            "model's output was already nonfinite; the parent when the input is one its own "
            "code also takes, as a hook sees the sum over a tensor's consumers); else the "
            "module of the first parameter "
            "(model order) with a nonfinite gradient, as backward-made when the loss was "
            "still finite. evidence.direction: forward | backward. AMP overflow skips are "
            "info, unless beyond the GradScaler's own (its first calibration, a probe "
            "after each growth) they exceed amp_skip_frac of the steps.",
    "fixes": "Lower the learning rate, clip gradients, guard log/sqrt/div with eps, check the "
             "input batch at that step, use bf16 or a GradScaler with fp16.",
}
# "<input>" is what the recorder names the model's input batch in its NaN tracing.
_INPUT_NAMES = ("<input>", "input", "inputs", "batch", "data")


def _first_steps(ctx: Context) -> dict[str, Any]:
    """First nonfinite step per source, computed in SQL over all ranks."""
    q = {}
    q["loss"] = ctx.rows("SELECT min(step) FROM steps WHERE loss IS NOT NULL "
                         "AND NOT isfinite(loss)")[0][0]
    q["grad_step"] = ctx.rows(
        "SELECT min(step) FROM steps WHERE nonfinite_grads > 0 OR (grad_norm IS NOT NULL "
        "AND NOT isfinite(grad_norm))")[0][0]
    # one scan of the big table for both (FILTER aggregates, no WHERE on the float column)
    q["grad"], q["activation"] = ctx.rows(
        "SELECT min(step) FILTER (WHERE kind = 'grad' AND bad), "
        "min(step) FILTER (WHERE kind IN ('activation', 'watch') AND bad) FROM ("
        "SELECT step, kind, NOT isfinite(norm) OR coalesce(nonfinite, 0) > 0 AS bad "
        "FROM tensor_stats)")[0]
    q["event"] = ctx.rows(
        "SELECT min(step) FROM events WHERE kind = 'nonfinite' AND step IS NOT NULL")[0][0]
    return q


def detect(ctx: Context, th: Thresholds) -> list[Finding]:
    q = _first_steps(ctx)
    candidates = [v for v in q.values() if v is not None]
    if not candidates:
        return []
    first = int(min(candidates))
    ev: dict[str, Any] = {k + "_first_step": (int(v) if v is not None else None)
                          for k, v in q.items()}
    subject = None
    where = ""
    # 1. a nonfinite input batch (event subject or watch/activation row named like the input)
    inp = ctx.rows(
        "SELECT min(step) FROM events WHERE kind = 'nonfinite' AND lower(subject) IN "
        f"{_INPUT_NAMES!r} UNION ALL SELECT min(step) FROM tensor_stats "
        f"WHERE kind IN ('watch', 'activation') AND lower(name) IN {_INPUT_NAMES!r} "
        "AND (NOT isfinite(norm) OR nonfinite > 0)")
    inp_steps = [s for (s,) in inp if s is not None]
    if inp_steps and min(inp_steps) <= first:
        subject, where = "input", "the input batch was already nonfinite"
    # 2. the module whose forward made it, as the recorder traced it (module inputs and
    #    outputs: a NaN made by plain code in a parent's forward is the parent's) ...
    if subject is None and q["activation"] is not None and q["activation"] <= first:
        row = ctx.rows(
            "SELECT subject FROM events WHERE kind = 'nonfinite' AND step = ? AND "
            "subject IS NOT NULL AND json_extract_string(details, '$.source') = 'activation' "
            "ORDER BY time LIMIT 1", [q["activation"]])
        if row and str(row[0][0]) not in _INPUT_NAMES:
            subject = str(row[0][0])
            where = f"the forward of module {subject} made it (its inputs were finite)"
            ev["direction"] = "forward"
    # 2b. ... or, its forward finite, the module whose backward turned finite gradients
    #     nonfinite (the recorder's backward probes: gradient of sqrt/log at 0, a custom
    #     autograd.Function, the norm of a zero vector, a loss with a NaN gradient)
    if subject is None:
        row = ctx.rows(
            "SELECT subject, step, message FROM events WHERE kind = 'nonfinite' AND "
            "subject IS NOT NULL AND json_extract_string(details, '$.source') = 'backward' "
            "ORDER BY step, time LIMIT 1")
        if row and row[0][1] is not None and int(row[0][1]) <= first and (
                q["activation"] is None or q["activation"] > int(row[0][1])):
            subject, first = str(row[0][0]), int(row[0][1])
            # (said in so many words: with the debug preset's zero_nonfinite_grads the NaN
            # is not applied, no later step repeats it, and no anomaly traceback says it)
            where = (str(row[0][2]).split(": ", 1)[-1]
                     + ", in the backward pass (the forward was finite)")
            ev["direction"] = "backward"
    # ... else the first module (post-order seq) whose output went nonfinite at that step
    if subject is None and q["activation"] is not None and q["activation"] <= first:
        row = ctx.rows(
            "SELECT name, rank, seq FROM tensor_stats WHERE step = ? AND kind = 'activation' "
            "AND (NOT isfinite(norm) OR nonfinite > 0) ORDER BY rank, seq NULLS LAST LIMIT 1",
            [q["activation"]])
        if row:
            subject = str(row[0][0])
            ev["module_seq"] = row[0][2]
            where = f"the output of module {subject} went nonfinite first"
            ev["direction"] = "forward"
    # 3. an event that names its subject (recorder's nonfinite event)
    #    (the recorder's own gradient events are step 4's, when gradient rows exist)
    if subject is None and q["event"] is not None and q["event"] <= first:
        row = ctx.rows("SELECT subject FROM events WHERE kind = 'nonfinite' AND step = ? "
                       "AND subject IS NOT NULL AND (? OR coalesce(json_extract_string("
                       "details, '$.source'), '') <> 'gradient') ORDER BY time LIMIT 1",
                       [q["event"], q["grad"] is None])
        if row:
            subject = str(row[0][0])
            where = f"a nonfinite event names {subject}"
    # 4. the first parameter in model order whose gradient went nonfinite
    if subject is None and q["grad"] is not None:
        bad = {str(n) for (n,) in ctx.rows(
            "SELECT DISTINCT name FROM tensor_stats WHERE step = ? AND kind = 'grad' AND "
            "(NOT isfinite(norm) OR nonfinite > 0)", [q["grad"]])}
        order = [n for n in _data.model_order(ctx, "grad") if n in bad] or sorted(bad)
        subject = order[0]
        ev["nonfinite_params_at_first_step"] = len(bad)
        where = f"the gradient of {subject} went nonfinite first"
        first = min(first, int(q["grad"]))
        if q["loss"] is None or int(q["loss"]) > first:
            # the loss was finite at that step: the forward was, the backward made it (in
            # the module holding the parameter, whose input gradients stayed finite)
            ev["direction"], ev["parameters"] = "backward", order[:20]
            module = _structure.module_of(subject)
            if module:
                subject = module
                where = (f"the backward of module {module} made its parameters' gradients "
                         f"nonfinite ({', '.join(order[:3])}) while the loss was finite")
    if subject is None:
        subject = "loss" if q["loss"] is not None and q["loss"] <= first else "grad_norm"
        where = f"the {subject} went nonfinite"
    if q["activation"] is None:
        untraced = ctx.rows("SELECT message FROM events WHERE kind = "
                            "'activation_tracing_unavailable' ORDER BY time LIMIT 1")
        if untraced:
            where += (" (module-level NaN tracing could not run: "
                      f"{str(untraced[0][0]).split(':')[0]})")
            ev["activation_tracing"] = str(untraced[0][0])

    # AMP: nonfinite grads on steps the GradScaler skipped, with a finite loss, are expected
    amp = ctx.rows(_AMP_SKIPS)[0]
    if q["loss"] is None and amp[1] and q["activation"] is None:
        # the scaler's own dynamics skip on purpose: it starts high and halves on each
        # overflow until the scale fits (the run of skips before its first applied step),
        # and after each growth it probes a doubled scale that may overflow once. Only the
        # skips beyond those say the gradients themselves overflow.
        skip_frac = amp[2] / max(amp[1], 1)
        ev["amp_skipped_steps"] = int(amp[0])
        ev["amp_calibration_skips"] = int(amp[0] - amp[2])
        if skip_frac <= th.amp_skip_frac:
            return [Finding(
                id=ID, severity="info", subject=subject, first_step=first,
                title="Gradient overflows skipped by the GradScaler",
                message=(f"{amp[0]} step(s) had nonfinite gradients and were skipped by the "
                         f"loss scaler, first at step {first} ({amp[0] - amp[2]} while it "
                         "calibrated its scale, or probed a grown one); the loss stayed "
                         "finite. This is normal with fp16 mixed precision."),
                advice="Nothing to do unless it becomes frequent.", evidence=ev)]
        sev = "warning"
    else:
        sev = "critical" if q["loss"] is not None else "error"
    ids = _data.sample_ids(ctx, [first])
    if ids:  # the batch the NaN came with (a bad sample, or just the step it surfaced at)
        ev = {**ev, "sample_ids": {str(k): v for k, v in ids.items()}}
    caught = _anomaly(ctx, first)
    if caught:
        ev = {**ev, "anomaly": caught}
    return [Finding(
        id=ID, severity=sev, subject=subject, first_step=first,
        title=f"NaN/Inf first appeared at step {first} in {subject}",
        message=(f"Nonfinite values appeared at step {first}: {where}."
                 + (f" The loss went nonfinite at step {q['loss']}."
                    if q["loss"] is not None else "")
                 + (_lr_context(ctx, first) if subject not in _INPUT_NAMES else "")
                 + (_anomaly_text(caught) if caught else "")),
        advice=DOC["fixes"], evidence=ev, chart=anchors.GRAD_HEATMAP)]


def _anomaly(ctx: Context, first: int) -> dict[str, Any] | None:
    """The first backward that autograd's anomaly detection caught (an ``anomaly`` event
    of anomaly_mode): the op, the user's line, at which step; None if none.

    ``downstream``: the loss was nonfinite on every recorded step after the first NaN
    (``first``) up to the one caught: the forward itself was NaN throughout, i.e. the
    weights already were when the window opened (a NaN gradient applied), so the op
    caught only meets the NaN, it does not make it."""
    row = ctx.rows(
        "SELECT step, subject, json_extract_string(details, '$.op'), "
        "json_extract_string(details, '$.user_frame'), "
        "json_extract_string(details, '$.stack_of') FROM events WHERE kind = 'anomaly' "
        "ORDER BY step NULLS LAST, time LIMIT 1")
    if not row:
        return None
    step, subject, op, frame, stack_of = row[0]
    out: dict[str, Any] = {"step": None if step is None else int(step), "op": op or subject,
                           "user_frame": frame, "stack_of": stack_of}
    if step is not None and int(step) > first:
        n, finite = ctx.rows("SELECT count(*), count(*) FILTER (WHERE isfinite(loss)) "
                             "FROM steps WHERE step > ? AND step <= ? AND loss IS NOT NULL",
                             [first, int(step)])[0]
        if n and not finite:
            knobs = ctx.run.meta.get("knobs")
            out["downstream"] = True
            out["since"] = first
            out["guarded"] = bool(isinstance(knobs, dict) and knobs.get("zero_nonfinite_grads"))
    return out


def _anomaly_text(a: dict[str, Any]) -> str:
    where = f" at step {a['step']}" if a["step"] is not None else ""
    text = f" Autograd's anomaly detection caught it in {a['op'] or 'an op'}{where}"
    if a["user_frame"]:
        made = "made by the forward call at" if a["stack_of"] == "forward" else "backward from"
        text += f", {made} {a['user_frame']}"
    if a.get("downstream"):
        text += (f", but the loss had been nonfinite on every step since step {a['since']}: "
                 "the weights were already nonfinite when the window opened, so that op is "
                 "downstream of the NaN, not its origin")
        if not a.get("guarded"):
            text += (" (record with zero_nonfinite_grads=True, on in the debug preset: a "
                     "step's nonfinite gradients are then never applied, the weights stay "
                     "finite, and the op that makes the next NaN is the one caught)")
    return text + "."


def _lr_context(ctx: Context, first: int) -> str:
    """A learning rate rising into the NaN (a ramp, an endless warm-up) is named as its
    likely cause; else the early-LR note."""
    cause = _changes.within(ctx, first - 10, first)
    if cause is not None and cause["kind"] == "lr_ramp":
        return f" It came as {cause['text']}."
    if cause is not None:
        return (f" It came {first - cause['step']} step(s) after {cause['text']}."
                if first > cause["step"] else f" It came as {cause['text']}.")
    return _changes.early_lr_note(ctx, first)
