"""Views of what a run's files describe rather than hold rows of: ``hparams`` (run.json's
hyperparameters) and ``histogram_bins`` (the fixed bins of the ``histograms`` table).
Registered as Arrow data, never written into SQL."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from tracealyze.format.histbins import NBINS, bin_edges
from tracealyze.format.hparams import rows

from ..sql.safe import execute_one


def hparams_view(con: Any, hparams: Any, q: str = "", schema: str | None = None) -> None:
    """The view ``hparams(key, value, type)``: run.json's hyperparameters, one row per key
    (format/hparams.py). Registered as data, never written into the SQL."""
    got = rows(hparams)
    table = pa.table({"key": pa.array([r[0] for r in got], pa.string()),
                      "value": pa.array([r[1] for r in got], pa.string()),
                      "type": pa.array([r[2] for r in got], pa.string())})
    name = f"_hparams{'_' + schema if schema else ''}"
    con.register(name, table)
    execute_one(con, f"CREATE VIEW {q}hparams AS SELECT key, value, type FROM {name}")


def bins_view(con: Any, q: str = "", schema: str | None = None) -> None:
    """The view ``histogram_bins(bin, lower, upper)``: join ``histograms`` with it after
    ``counts[bin + 1]`` (docs/ANALYZER.md has the query)."""
    edges = [bin_edges(b) for b in range(NBINS)]
    table = pa.table({"bin": pa.array(range(NBINS), pa.int32()),
                      "lower": pa.array([e[0] for e in edges], pa.float64()),
                      "upper": pa.array([e[1] for e in edges], pa.float64())})
    name = f"_histogram_bins{'_' + schema if schema else ''}"
    con.register(name, table)
    execute_one(con, f"CREATE VIEW {q}histogram_bins AS SELECT bin, lower, upper FROM {name}")
