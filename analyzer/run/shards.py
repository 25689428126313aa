"""Sharded runs (FSDP2 ``fully_shard``): every rank records the statistics of its own shard
of each parameter and gradient (the recorder never starts a collective). Here the ranks'
rows are combined into the full tensors' values, so that every reader of the ``steps`` and
``tensor_stats`` views (detectors, report, ``query``) sees true norms:

* ``steps.grad_norm`` = sqrt(Σ over ranks of grad_norm²) at each step (NULL unless every
  rank read its norms that step); ``nonfinite_grads`` is summed;
* ``tensor_stats`` rows of kind ``grad`` and ``param``, per (step, name): ``norm`` =
  sqrt(Σ norm²), ``numel`` summed, ``absmax``/``max`` the largest, ``min`` the smallest,
  ``mean``, ``std`` (population) and ``zero_frac`` weighted by each shard's ``numel``,
  ``nonfinite`` summed; ``rank`` is the lowest rank.

The per-rank rows stay readable as ``steps_shards`` and ``tensor_stats_shards``. Other
kinds (activations, update ratios, watched tensors) are per rank as recorded.
"""

from __future__ import annotations

from typing import Any

from tracealyze.format.schema import columns


def is_sharded(meta: dict[str, Any]) -> bool:
    return bool((meta.get("model") or {}).get("sharded"))


def combine(con: Any, q: str = "") -> None:
    """Replace the ``steps`` and ``tensor_stats`` views (of schema ``q``, e.g. ``"r0."``)
    by their combined forms."""
    con.execute(f"ALTER VIEW {q}steps RENAME TO steps_shards")
    con.execute(f"ALTER VIEW {q}tensor_stats RENAME TO tensor_stats_shards")
    con.execute(f"""
        CREATE VIEW {q}steps AS
        SELECT s.* REPLACE (c.grad_norm AS grad_norm, c.nonfinite_grads AS nonfinite_grads)
        FROM {q}steps_shards s LEFT JOIN (
            SELECT step,
                   CASE WHEN count(grad_norm) = count(*)
                        THEN sqrt(sum(grad_norm * grad_norm)) END AS grad_norm,
                   CAST(sum(nonfinite_grads) AS INTEGER) AS nonfinite_grads
            FROM {q}steps_shards GROUP BY step) c ON s.step = c.step""")
    combined = {
        "rank": "min(rank)", "step": "step", "name": "name", "kind": "kind",
        "numel": "sum(numel)",
        "norm": "CAST(sqrt(sum(CAST(norm AS DOUBLE) * norm)) AS FLOAT)",
        "absmax": "max(absmax)", "max": "max(max)", "min": "min(min)",
        "mean": "CAST(sum(numel * CAST(mean AS DOUBLE)) / sum(numel) AS FLOAT)",
        "std": "CAST(sqrt(greatest(sum(numel * (CAST(std AS DOUBLE) * std + "
               "CAST(mean AS DOUBLE) * mean)) / sum(numel) - power(sum(numel * "
               "CAST(mean AS DOUBLE)) / sum(numel), 2), 0)) AS FLOAT)",
        "zero_frac": "CAST(sum(numel * CAST(zero_frac AS DOUBLE)) / sum(numel) AS FLOAT)",
        "nonfinite": "sum(nonfinite)", "ratio": "max(ratio)", "seq": "min(seq)",
        "sat_frac": "max(sat_frac)",  # (activations only: never on grad/param rows)
    }
    cols = columns("tensor_stats")
    agg = ", ".join(f"{combined[c]} AS {c}" for c in cols)
    plain = ", ".join(cols)
    con.execute(f"""
        CREATE VIEW {q}tensor_stats AS
        SELECT {agg} FROM {q}tensor_stats_shards WHERE kind IN ('grad', 'param')
        GROUP BY step, name, kind
        UNION ALL
        SELECT {plain} FROM {q}tensor_stats_shards WHERE kind NOT IN ('grad', 'param')""")
