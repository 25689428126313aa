"""The figures `tracealyze compare` lines up: per-run samples read once from each run's views,
then one :class:`Metric` per figure with its direction and its significance
(:mod:`.stats`). Step-time figures use each run's steady state (after the first 10%
of its steps: compilation, warm-up, the first profiler window); training dynamics use the
steps both runs recorded (matched by step number)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..diagnosis.detectors.step_time_outlier import DEFAULTS as OUTLIER_DEFAULTS
from ..run.catalog import Run
from ..stats.robust import theil_sen
from ..stats.steptime import outliers
from .stats import ALPHA, MIN_EFFECT_BLOCKS, block_medians, shifted, two_proportion_p

WARMUP_FRAC = 0.1
TAIL_FRAC = 0.1          # loss_final: the last 10% of the matched steps
ORDERS = 1.0             # a layer's gradient norm moved by ≥ this many orders of magnitude
MIB = 1 << 20
LAYER_STEPS = 2000       # steps sampled for a layer's typical gradient norm


@dataclass
class Metric:
    """One compared figure (DESIGN.md, "Comparing runs")."""

    name: str
    base: float | None
    new: float | None
    better: str  # "lower" | "higher"
    significant: bool = False
    change_pct: float | None = None
    test: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.base is not None and self.new is not None and self.base != 0 \
                and math.isfinite(self.base) and math.isfinite(self.new):
            self.change_pct = 100.0 * (self.new - self.base) / abs(self.base)
        # (from 0, e.g. NaN steps 0 -> 3: no percentage; change_pct stays None)

    @property
    def worse(self) -> bool:
        if not self.significant or self.base is None or self.new is None:
            return False
        return self.new > self.base if self.better == "lower" else self.new < self.base

    @property
    def better_now(self) -> bool:
        return self.significant and not self.worse and self.base != self.new

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["evidence"]:
            del out["evidence"]
        return out


RATES = ("samples_per_s", "tokens_per_s", "mfu")
"""Per-step rates compared as step times are (medians of blocks of steps): higher is
better."""


@dataclass
class RunData:
    """What compare needs of one run, read once."""

    step: np.ndarray
    duration: np.ndarray
    wait: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    nonfinite: np.ndarray  # 1 where the loss or a gradient was NaN/Inf
    mem_step: np.ndarray
    rss: np.ndarray
    cuda: np.ndarray
    layers: dict[str, float]
    knobs: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, np.ndarray] = field(default_factory=dict)  # tokens_per_s, mfu, ...

    @classmethod
    def load(cls, run: Run) -> RunData:
        con = run.con
        (rank,) = con.execute("SELECT min(rank) FROM steps").fetchone()
        rank = 0 if rank is None else int(rank)
        rows = con.execute(
            "SELECT step, duration_s, data_wait_s, loss, grad_norm, "
            "CASE WHEN coalesce(nonfinite_grads, 0) > 0 OR (loss IS NOT NULL AND NOT "
            "isfinite(loss)) THEN 1 ELSE 0 END, " + ", ".join(RATES) +
            " FROM steps WHERE rank = ? ORDER BY step", [rank]).fetchall()
        cols = list(zip(*rows, strict=True)) if rows else [()] * (6 + len(RATES))
        f = [np.array([np.nan if v is None else v for v in c], dtype=np.float64) for c in cols]
        mem = con.execute(
            "SELECT step, rss_bytes, cuda_allocated_bytes FROM memory WHERE rank = ? "
            "AND step IS NOT NULL ORDER BY step", [rank]).fetchall()
        m = list(zip(*mem, strict=True)) if mem else [()] * 3
        mf = [np.array([np.nan if v is None else v for v in c], dtype=np.float64) for c in m]
        # A layer's typical gradient norm, from at most ~LAYER_STEPS evenly spaced steps:
        # an order-of-magnitude move shows as well, at a tenth of the scan on long runs.
        stride = max(1, len(rows) // LAYER_STEPS)
        layers = dict(con.execute(
            "SELECT name, median(norm) FROM tensor_stats WHERE kind = 'grad' AND rank = ? "
            "AND step % ? = 0 AND isfinite(norm) AND norm > 0 GROUP BY name",
            [rank, stride]).fetchall())
        if not layers and stride > 1:  # grad rows only at cadence steps off the stride
            layers = dict(con.execute(
                "SELECT name, median(norm) FROM tensor_stats WHERE kind = 'grad' AND "
                "rank = ? AND isfinite(norm) AND norm > 0 GROUP BY name", [rank]).fetchall())
        return cls(step=f[0].astype(np.int64) if len(f[0]) else np.zeros(0, np.int64),
                   duration=f[1], wait=f[2], loss=f[3], grad_norm=f[4], nonfinite=f[5],
                   mem_step=mf[0], rss=mf[1], cuda=mf[2], layers=layers,
                   knobs=dict(run.meta.get("knobs") or {}),
                   rates={c: f[6 + i] for i, c in enumerate(RATES)})

    def steady(self) -> np.ndarray:
        """Mask of the steps after the warm-up share."""
        n = len(self.step)
        return np.arange(n) >= int(n * WARMUP_FRAC)


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else None


def _sampled(name: str, a: np.ndarray, b: np.ndarray, better: str, value: Any = None,
             blocks: bool = False) -> Metric | None:
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 3 or len(b) < 3:
        return None
    fn = value or np.median
    sig, ev = (shifted(block_medians(a), block_medians(b), MIN_EFFECT_BLOCKS) if blocks
               else shifted(a, b))
    return Metric(name, float(fn(a)), float(fn(b)), better, sig, test="mann_whitney+effect",
                  evidence=ev)


def time_metrics(a: RunData, b: RunData) -> list[Metric]:
    sa, sb = a.steady(), b.steady()
    da, db = a.duration[sa], b.duration[sb]
    out = [
        _sampled("step_time_median_s", da, db, "lower", blocks=True),
        _sampled("step_time_p90_s", da, db, "lower", lambda x: np.percentile(x, 90),
                 blocks=True),
    ]
    med = out[0]
    if med is not None and med.base and med.new:
        out.append(Metric("throughput_steps_per_s", 1.0 / med.base, 1.0 / med.new, "higher",
                          med.significant, test=med.test, evidence=med.evidence))
    out.append(outlier_metric(a, b))
    for col in RATES:  # throughput and MFU (recorded from batch shapes and a FLOP count)
        ra, rb = a.rates.get(col), b.rates.get(col)
        if ra is not None and rb is not None:
            out.append(_rate(col, ra[sa], rb[sb]))
    wa, wb = a.wait[sa] / da, b.wait[sb] / db
    share = _sampled("data_wait_share", wa, wb, "lower", lambda x: float(np.mean(x)),
                     blocks=True)
    if share is not None:
        # (the share is judged on per-step shares; a shift of a share near 0 is noise)
        share.significant = share.significant and abs(share.new - share.base) >= 0.02
        out.append(share)
    return [m for m in out if m is not None]


def _rate(name: str, a: np.ndarray, b: np.ndarray) -> Metric | None:
    """A rate (tokens/s, MFU) judged on its logarithm, with the block medians of step
    times: a machine's drift moves a rate by a share of itself (±10% of 5,000 tokens/s is
    not ±10% of 500), so the σ it is measured against is relative too."""
    a, b = a[np.isfinite(a) & (a > 0)], b[np.isfinite(b) & (b > 0)]
    m = _sampled(name, np.log(a), np.log(b), "higher", blocks=True)
    if m is None:
        return None
    return Metric(name, float(np.median(a)), float(np.median(b)), "higher", m.significant,
                  test=m.test + " (on log values)", evidence=m.evidence)


def outlier_metric(a: RunData, b: RunData) -> Metric | None:
    """Share of steps that are outliers by the step_time_outlier detector's own rule (its
    default thresholds, each run's recorder knobs), judged by a two-proportion z-test."""
    rules = [outliers(r.step, r.duration, r.knobs, OUTLIER_DEFAULTS) for r in (a, b)]
    if rules[0] is None or rules[1] is None:
        return None
    (ka, na), (kb, nb) = ((int(r["mask"].sum()), int(r["sel"].sum())) for r in rules)
    p = two_proportion_p(ka, na, kb, nb)
    sig = p < ALPHA and abs(kb / nb - ka / na) >= 0.005
    return Metric("step_time_outlier_share", ka / na, kb / nb, "lower", sig,
                  test=f"two-proportion z-test p < {ALPHA} and |Δ| ≥ 0.5% of steps",
                  evidence={"p_value": p, "base_outliers": ka, "new_outliers": kb})


def dynamics_metrics(a: RunData, b: RunData) -> list[Metric]:
    common, ia, ib = np.intersect1d(a.step, b.step, return_indices=True)
    if len(common) < 10:
        return []
    out: list[Metric] = []
    # The loss is compared up to the first step where either run went nonfinite: a run that
    # ended in NaN still has a loss to compare until then.
    bad = np.flatnonzero((a.nonfinite[ia] > 0) | (b.nonfinite[ib] > 0))
    upto = int(bad[0]) if len(bad) else len(common)
    tail = max(3, int(upto * TAIL_FRAC))
    la, lb = a.loss[ia][:upto][-tail:], b.loss[ib][:upto][-tail:]
    m = _sampled("loss_final", la, lb, "lower")
    if m is not None:
        if len(bad):
            m.evidence["up_to_step"] = int(common[upto - 1]) if upto else None
        out.append(m)
    keep = np.arange(len(common)) >= int(len(common) * WARMUP_FRAC)
    ga, gb = a.grad_norm[ia][keep], b.grad_norm[ib][keep]
    m = _sampled("grad_norm_median", ga, gb, "lower")
    if m is not None:
        out.append(m)
    bad_a, bad_b = int(np.sum(a.nonfinite[ia] > 0)), int(np.sum(b.nonfinite[ib] > 0))
    out.append(Metric("loss_nonfinite_steps", bad_a, bad_b, "lower", bad_a != bad_b,
                      test="count"))
    moved = {n: math.log10(b.layers[n] / a.layers[n]) for n in a.layers.keys() & b.layers.keys()
             if a.layers[n] > 0 and b.layers[n] > 0}
    far = {n: round(v, 2) for n, v in moved.items() if abs(v) >= ORDERS}
    if moved:
        out.append(Metric("grad_norm_layers_moved", 0, len(far), "lower", bool(far),
                          test=f"|log10(new/base)| ≥ {ORDERS:g} per layer",
                          evidence={"orders_of_magnitude": dict(sorted(
                              far.items(), key=lambda kv: -abs(kv[1]))[:20])}))
    return out


def memory_metrics(a: RunData, b: RunData) -> list[Metric]:
    out: list[Metric] = []
    for name, xa, xb in (("memory_peak_rss_bytes", a.rss, b.rss),
                         ("memory_peak_cuda_allocated_bytes", a.cuda, b.cuda)):
        pa_, pb_ = xa[np.isfinite(xa)], xb[np.isfinite(xb)]
        if not len(pa_) or not len(pb_):
            continue
        base, new = float(pa_.max()), float(pb_.max())
        sig = abs(new - base) >= max(0.02 * base, 16 * MIB)
        out.append(Metric(name, base, new, "lower", sig,
                          test="|Δ| ≥ max(2%, 16 MiB)"))
    ka, kb = np.isfinite(a.rss), np.isfinite(b.rss)
    if ka.sum() >= 10 and kb.sum() >= 10:
        sa, sb = a.mem_step[ka], b.mem_step[kb]
        (sl_a, _), (sl_b, _) = theil_sen(sa, a.rss[ka]), theil_sen(sb, b.rss[kb])
        span = max(float(sa.max() - sa.min()), float(sb.max() - sb.min()), 1.0)
        out.append(Metric("memory_growth_rss_bytes_per_step", float(sl_a), float(sl_b),
                          "lower", abs(sl_b - sl_a) * span >= 64 * MIB,
                          test="|Δ slope| × steps ≥ 64 MiB (Theil-Sen)"))
    return out
