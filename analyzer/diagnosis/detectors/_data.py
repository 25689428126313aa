"""Shared, cached queries: detectors pull small series from here instead of each scanning.

Heavy aggregation stays in DuckDB: ``tensor_buckets`` scans tensor_stats once and reduces it
to ≤ ``MAX_POINTS`` step buckets per (name, kind); per-step tables (steps, memory) are small
enough to pull as numpy arrays.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ...stats.shift import objective_shift, one_factor
from ._structure import chance_level, structure
from ._workset import shape_windows
from .base import Context

MAX_POINTS = 1000
"""Step buckets per tensor series in ``tensor_buckets`` (bounds the rows pulled)."""


def steps(ctx: Context) -> dict[int, dict[str, np.ndarray]]:
    """rank → steps columns as float/int arrays, sorted by step (one row per step).

    NULLs become NaN; ``loss_given`` / ``grad_norm_given`` say where a value was recorded.
    """

    def load() -> dict[int, dict[str, np.ndarray]]:
        cols = ctx.arrays(
            "SELECT rank, step, time, duration_s, data_wait_s, loss, lr, grad_norm, "
            "nonfinite_grads, loss_scale, amp_skipped, grad_clip_max, compute_s, cpu_s, "
            "cpu_queue_s, tokens_per_s, new_shapes "
            "FROM steps ORDER BY rank, step")
        out: dict[int, dict[str, np.ndarray]] = {}
        if not len(cols["rank"]):
            return out
        for r, sel in rank_slices(cols["rank"]):
            d = {}
            for k, v in cols.items():
                v = v[sel]
                if k in ("rank", "step"):
                    d[k] = np.asarray(v, dtype=np.int64)
                elif k == "amp_skipped":
                    d[k] = np.asarray(np.ma.filled(v.astype(float), np.nan), dtype=np.float64)
                else:
                    d[k] = np.asarray(np.ma.filled(v.astype(np.float64), np.nan),
                                      dtype=np.float64)
                if k in ("loss", "grad_norm"):
                    # NULL (not recorded) and NaN (training produced NaN) differ: keep both
                    d[k + "_given"] = ~np.ma.getmaskarray(v)
            out[int(r)] = d
        shifts = ctx.cached("objective_shifts", dict)
        for r, d in out.items():
            # a rescaled objective (loss and every gradient ×k at one step: stats/shift.py)
            # is judged on its new scale: the steps after it are divided by k
            sh = objective_shift(d["step"], d["loss"], d["grad_norm"])
            # (not at the first batch of a new input shape: the data changed there, a
            # curriculum's longer sequences, not the loss code)
            # (and the loss alone, the value logged, not across a resume: a run resumed
            # without what it had learned loses it at once)
            if sh is not None and not _lr_moved(d, sh.index) and not _to_chance(ctx, d, sh) \
                    and int(d["step"][sh.index]) not in new_shape_steps(d) \
                    and not (sh.logged and _resumed_near(ctx, sh.step)) \
                    and _one_factor(ctx, sh):
                shifts[r] = sh
                d["loss"] = np.concatenate([d["loss"][:sh.index],
                                            d["loss"][sh.index:] / sh.factor])
                d["grad_norm"] = np.concatenate([d["grad_norm"][:sh.index],
                                                 d["grad_norm"][sh.index:] / sh.grad_factor])
        return out

    return ctx.cached("steps", load)


RARE_SHAPES = 0.02
"""New input shapes are rare when at most this share of the steps (after the first) saw one:
a jump that begins on such a step is then no accident of timing (a corrupt batch lands on one
by chance 2% of the time at most) but the data changing (a length curriculum's stages, a new
source's first batch). Loops whose batches vary in shape (dynamic padding; bucketed lengths,
each new early on) see new shapes too often to tell."""


def new_shape_steps(d: dict[str, np.ndarray] | None) -> set[int]:
    """The steps (after the first) whose batch had a new input shape (``steps.new_shapes``,
    counted by the recorder for most steps), when such steps are rare (RARE_SHAPES); else
    none."""
    got = shape_windows(d)
    if got is None:
        return set()
    s, n = got
    later = np.isfinite(n) & (s > s[0])  # (the first step's batch is always new)
    if not later.any() or float(np.mean(n[later] > 0)) > RARE_SHAPES:
        return set()
    return {int(x) for x in s[later & (n > 0)]}


CHANCE_BAND = (0.9, 1.25)
"""A settled loss within these multiples of ln C is a model guessing (_to_chance)."""


def _to_chance(ctx: Context, d: dict[str, np.ndarray], sh: Any) -> bool:
    """Was a classifier that had learned (its loss under half the chance level ln C) thrown
    back to guessing (the loss settled at ln C over the two windows after the first one
    past the jump), rather than its objective rescaled? A model knocked out by a bad batch
    or a blown-up update loses what it knew: confidently wrong at first, far above ln C, it
    recalibrates to the uniform guess within tens of steps and sits there; a rescale
    multiplies the level it had by a factor that has no reason to land on ln C (a ×4 of a
    ViT at 1.03 sits at 1.7 ln C). Settled: within CHANCE_BAND of ln C (a knocked ResNet's
    noisy recalibration, 1.19 ln C over its first window). C: the logits' width the
    recorder saw, else a small C the settled level matches (loss_plateau's chance rule)."""
    loss = d["loss"]
    i, w = sh.index, max(10, len(loss) // 20)
    before = float(np.nanmedian(loss[max(0, i - w):i])) if i > 0 else float("nan")
    settled = [float(np.nanmedian(loss[a:a + w])) for a in (i + w, i + 2 * w)
               if a + w <= len(loss)]
    if not np.isfinite(before) or len(settled) < 2 or not np.isfinite(settled).all():
        return False
    c = structure(ctx)["output_features"] or chance_level(ctx, settled[0])
    if c is None:
        return False
    lo, hi = CHANCE_BAND
    return before < 0.5 * math.log(c) and all(
        lo * math.log(c) <= v <= hi * math.log(c) for v in settled)


def _one_factor(ctx: Context, sh: Any) -> bool:
    """Did every recorded tensor's gradient change by one factor at the shift, as a rescaled
    objective's do (stats/shift.one_factor)? The per-tensor norms over the shift's windows,
    of the rank the per-layer detectors read (all-reduced gradients are every rank's); True
    (the loss and total norm decide) when they were not recorded there."""
    t = tensor_rank(ctx)
    cols = ctx.arrays("SELECT name, step, norm FROM tensor_stats WHERE rank = ? AND "
                      "kind = 'grad' AND step BETWEEN ? AND ? AND isfinite(norm) AND norm > 0 "
                      "ORDER BY name, step", [t, *sh.span]) if t is not None else {"name": []}
    names = np.asarray(cols["name"], dtype=object)
    if not len(names):
        return True
    step, norm = np.asarray(cols["step"]), np.asarray(cols["norm"], dtype=np.float64)
    cut = np.r_[0, np.flatnonzero(names[1:] != names[:-1]) + 1, len(names)]
    return one_factor([(norm[a:b][step[a:b] < sh.step], norm[a:b][step[a:b] >= sh.step])
                       for a, b in itertools.pairwise(cut)]) is not False


def _resumed_near(ctx: Context, step: int) -> bool:
    """A ``resumed`` event within 3 steps of ``step``."""
    return bool(ctx.rows("SELECT count(*) FROM events WHERE kind = 'resumed' AND step "
                         "BETWEEN ? AND ?", [step - 3, step + 3])[0][0])


def _lr_moved(d: dict[str, np.ndarray], i: int) -> bool:
    """Did the learning rate rise around position i (by RESCALE_LR_RISE within 3 steps: a
    jump), or was it still rising into it (above its level RESCALE_LR_LOOKBACK steps before)
    after rising by RESCALE_LR_RISE from its lowest level (a ramp)? Then the LR, not the
    objective, moved the loss and the gradients. An LR that fell there cannot have raised
    the loss: it is the loop compensating its rescale (``reduction="sum"`` with the LR
    divided by the batch size, a loss x8 with the LR / 8), which leaves the updates as they
    were."""
    lr = d["lr"]

    def ok(a: np.ndarray) -> np.ndarray:
        return a[np.isfinite(a) & (a > 0)]

    near, before = ok(lr[max(0, i - 3):i + 4]), ok(lr[:i + 4])
    if len(near) >= 2 and float(np.max(near / np.minimum.accumulate(near))) >= RESCALE_LR_RISE:
        return True
    back = ok(lr[max(0, i - RESCALE_LR_LOOKBACK):max(1, i - RESCALE_LR_LOOKBACK + 1)])
    rising = len(back) and len(near) and float(near[-1]) > 1.01 * float(back[0])
    return bool(rising and len(before) >= 2
                and float(near[-1] / before.min()) >= RESCALE_LR_RISE)


RESCALE_LR_LOOKBACK = 20
RESCALE_LR_RISE = 1.5
"""An LR that jumped this much around a loss rise, or rose this much into it and was still
rising, explains it: the rise is not read as a rescaled objective."""


def objective_shifts(ctx: Context) -> dict[int, Any]:
    """rank → the objective's rescale (stats.shift.Shift) the steps series were corrected for."""
    steps(ctx)
    return ctx.cached("objective_shifts", dict)


def rank_slices(rank: Any) -> list[tuple[int, slice]]:
    """(rank, slice of its rows) for an array ordered by rank: slices, not one boolean mask
    per rank (1,024 ranks × 300k rows)."""
    r = np.asarray(rank)
    if not len(r):
        return []
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    ends = np.r_[starts[1:], len(r)]
    return [(int(r[a]), slice(int(a), int(b))) for a, b in zip(starts, ends, strict=True)]


def step_range(ctx: Context) -> tuple[int | None, int | None]:
    """(first, last) recorded step over all ranks, from the small steps table."""

    def load() -> tuple[int | None, int | None]:
        lo, hi = ctx.rows("SELECT min(step), max(step) FROM steps")[0]
        return (None, None) if lo is None else (int(lo), int(hi))

    return ctx.cached("step_range", load)


SAMPLE_IDS_SHOWN = 64
"""Sample ids a finding lists per step (the step's row keeps up to 1,024)."""


def sample_ids(ctx: Context, steps: list[int], rank: int | None = None
               ) -> dict[int, list[int]]:
    """step -> the sample ids the recorder kept for it (``record_sample_ids``), on ``rank``
    (else the lowest that has them); steps without ids are left out."""
    if not steps:
        return {}
    want = ", ".join(str(int(s)) for s in steps[:100])
    where = f"rank = {int(rank)}" if rank is not None else \
        "rank = (SELECT min(rank) FROM steps WHERE sample_ids IS NOT NULL)"
    rows = ctx.rows(f"SELECT step, sample_ids[1:{SAMPLE_IDS_SHOWN}] FROM steps WHERE {where} "
                    f"AND step IN ({want}) AND sample_ids IS NOT NULL")
    return {int(s): [int(i) for i in ids] for s, ids in rows if ids}


def primary_rank(ctx: Context, column: str = "loss") -> int | None:
    """Lowest rank with any finite value in ``column`` of steps (loss is per-rank anyway)."""
    for r, d in sorted(steps(ctx).items()):
        if np.isfinite(d[column]).any():
            return r
    return None


def finite_series(ctx: Context, column: str, min_steps: int = 1
                  ) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(rank, steps, values) of the primary rank's finite values of a steps ``column``, or
    None when there are fewer than ``min_steps`` of them."""
    r = primary_rank(ctx, column)
    if r is None:
        return None
    d = steps(ctx)[r]
    ok = np.isfinite(d[column])
    if ok.sum() < max(1, min_steps):
        return None
    return r, d["step"][ok], d[column][ok]


def finite_loss(ctx: Context, min_steps: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """(rank, steps, losses) of the primary rank's finite losses, or None when there are
    fewer than ``min_steps`` of them."""
    return finite_series(ctx, "loss", min_steps)


def tensor_rank(ctx: Context) -> int | None:
    """The rank whose tensor statistics the per-layer detectors use (lowest present)."""
    ranks = ctx.run.table_ranks("tensor_stats")
    return ranks[0] if ranks else None


def tensor_buckets(ctx: Context) -> dict[str, Any]:
    """One scan of tensor_stats (one rank) → per (name, kind, bucket) aggregates.

    Columns: name, kind, bucket, step0 (first step in bucket), n, log_norm (ln of the mean
    of the finite positive norms), n_zero (norm == 0), n_nonfinite, first_nonfinite (step),
    log_ratio (mean ln ratio, ratio > 0), n_ratio_zero, zero_frac (mean). Plus ``bucket_size``.
    """

    def load() -> dict[str, Any]:
        r = tensor_rank(ctx)
        if r is None:
            return {"bucket_size": 1, "name": np.array([], dtype=object)}
        # the step range from the small steps table (a min/max over tensor_stats is a scan)
        lo, hi = step_range(ctx)
        if lo is None:
            lo, hi = ctx.rows("SELECT min(step), max(step) FROM tensor_stats")[0]
        span = int(hi - lo + 1) if lo is not None else 1
        size = max(1, -(-span // MAX_POINTS))
        nan = "'nan'::DOUBLE"
        # Grouping by the name string is the cost of this scan, every FILTER adds to it: a
        # cheap ungrouped pass first says whether the rare columns (nonfinite, zero norms)
        # are needed per bucket at all.
        bad, zero = ctx.rows(
            f"SELECT count(*) FILTER (WHERE NOT isfinite(norm) OR nonfinite > 0), "
            f"count(*) FILTER (WHERE norm = 0) FROM tensor_stats WHERE rank = {r}")[0]
        rare = []
        rare.append("count(*) FILTER (WHERE norm = 0)::DOUBLE" if zero else "0.0")
        rare.append("count(*) FILTER (WHERE NOT isfinite(norm) OR nonfinite > 0)::DOUBLE"
                    if bad else "0.0")
        rare.append(f"coalesce(min(step) FILTER (WHERE NOT isfinite(norm) OR nonfinite > 0)"
                    f"::DOUBLE, {nan})" if bad else nan)
        # the per-bucket level is the mean of the norms (a geometric mean needs a ln per row:
        # more cost, and within a bucket of ≤ 0.1% of the run they agree closely)
        cols = ctx.arrays(
            f"""
            SELECT name, kind, (step - {int(lo or 0)}) // {size} AS bucket,
                   min(step)::DOUBLE AS step0, count(*)::DOUBLE AS n,
                   coalesce(ln(avg(norm) FILTER (WHERE isfinite(norm) AND norm > 0)), {nan})
                       AS log_norm,
                   {rare[0]} AS n_zero, {rare[1]} AS n_nonfinite, {rare[2]} AS first_nonfinite,
                   coalesce(ln(avg(ratio) FILTER (WHERE isfinite(ratio) AND ratio > 0)),
                       {nan}) AS log_ratio,
                   count(*) FILTER (WHERE ratio = 0)::DOUBLE AS n_ratio_zero,
                   coalesce(avg(zero_frac), {nan}) AS zero_frac
            FROM tensor_stats WHERE rank = {r}
            GROUP BY ALL ORDER BY name, kind, bucket
            """)
        out: dict[str, Any] = {"bucket_size": size}
        for k, v in cols.items():
            if k in ("name", "kind"):
                out[k] = np.asarray(v, dtype=object)
            else:
                out[k] = np.asarray(v, dtype=np.float64)
        return out

    return ctx.cached("tensor_buckets", load)


def series_of(ctx: Context, kind: str) -> dict[str, dict[str, np.ndarray]]:
    """name → that kind's bucket columns (from :func:`tensor_buckets`), in bucket order."""

    def load() -> dict[str, dict[str, np.ndarray]]:
        tb = tensor_buckets(ctx)
        if not len(tb["name"]):
            return {}
        sel = tb["kind"] == kind
        names = tb["name"][sel]
        out: dict[str, dict[str, np.ndarray]] = {}
        if not len(names):
            return out
        # rows are ordered by name, kind, bucket: split where the name changes
        cut = np.flatnonzero(names[1:] != names[:-1]) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [len(names)]])
        idx = np.flatnonzero(sel)
        for a, b in zip(starts, ends, strict=True):
            rows = idx[a:b]
            out[str(names[a])] = {k: v[rows] for k, v in tb.items()
                                  if k not in ("name", "kind", "bucket_size")}
        # a rescaled objective scaled every gradient at its step: the per-tensor gradient
        # norms are judged on the new scale too, as the total norm is (steps())
        sh = objective_shifts(ctx).get(tensor_rank(ctx)) if kind == "grad" else None
        if sh is not None:
            for col in out.values():
                col["log_norm"] = np.where(col["step0"] >= sh.step,
                                           col["log_norm"] - math.log(sh.grad_factor),
                                           col["log_norm"])
        return out

    return ctx.cached(f"series:{kind}", load)


def model_order(ctx: Context, kind: str = "grad") -> list[str]:
    """Tensor names of ``kind`` in order of first appearance in tensor_stats (model order)."""

    def load() -> list[str]:
        r = tensor_rank(ctx)
        if r is None:
            return []
        rows = ctx.rows(
            "SELECT name, min(step) AS s, min(file_row_number) AS fr FROM ("
            "  SELECT name, step, row_number() OVER () AS file_row_number FROM tensor_stats"
            "  WHERE rank = ? AND kind = ? AND step <= (SELECT min(step) + 1 FROM tensor_stats"
            "  WHERE rank = ? AND kind = ?)) GROUP BY name ORDER BY s, fr", [r, kind, r, kind])
        seen = [str(n) for n, _, _ in rows]
        rest = sorted(set(series_of(ctx, kind)) - set(seen))
        return seen + rest

    return ctx.cached(f"order:{kind}", load)
