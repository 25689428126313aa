"""Our GPU time counts every kernel; HTA 0.5 leaves out those launched through the driver API
(issue 44: ``cuLaunchKernelEx``: cuBLASLt, flash attention, Triton; 134 of 1,154 kernels,
1,044 of 4,944 us in the real H200 trace of ``gpu_host_sync``). The cross-check against HTA
compares like with like: HTA's rows against ours with those kernels left out; and ours with
them is the whole GPU time (docs/TRACES.md, "Kernels launched through the driver API")."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from tracealyze.analyzer.gpu.gputime import gpu_time_breakdown
from tracealyze.analyzer.gpu.vocabulary import DRIVER, KERNEL_SQL, sql
from tracealyze.analyzer.ingest.read import read_trace

from tests.gpuruns import RUNS

DRIVER_SQL = sql(DRIVER)


def _trace(name: str) -> Path:
    return next((RUNS / name / "traces" / "rank=0").glob("*.json.gz"))


def _ours(path: Path, *, driver_launched: bool) -> tuple[dict, int, int]:
    """(our breakdown of rank 0, kernels kept, kernels launched through the driver)."""
    con = duckdb.connect()
    con.register("raw", read_trace(path, rank=0))
    driver = f"""(SELECT DISTINCT correlation FROM raw
                  WHERE cat = {DRIVER_SQL} AND correlation IS NOT NULL)"""
    n_driver = con.execute(f"SELECT count(*) FROM raw WHERE cat = {KERNEL_SQL} "
                           f"AND correlation IN {driver}").fetchone()[0]
    keep = "TRUE" if driver_launched else \
        f"NOT (cat = {KERNEL_SQL} AND coalesce(correlation IN {driver}, FALSE))"
    con.execute(f"CREATE VIEW trace_events AS SELECT * FROM raw WHERE {keep}")
    kept = con.execute(f"SELECT count(*) FROM trace_events WHERE cat = {KERNEL_SQL}"
                       ).fetchone()[0]
    return gpu_time_breakdown(con)[0], kept, n_driver


def test_ours_counts_the_driver_launched_kernels_and_hta_does_not(tmp_path: Path) -> None:
    pytest.importorskip("hta")
    from tests.traces.hta_live import hta_results

    path = _trace("gpu_host_sync")
    (tmp_path / "t").mkdir()
    shutil.copyfile(path, tmp_path / "t" / path.name)
    hta = hta_results(tmp_path / "t")["temporal"][0]
    like, _, n_driver = _ours(path, driver_launched=False)
    assert n_driver > 100  # cuBLASLt / flash attention / Triton launches in a real trace
    for key in ("total_us", "idle_us", "compute_us", "non_compute_us"):
        assert abs(like[key] - hta[key]) <= 0.01 * hta["total_us"], (key, like, hta)
    whole, _, _ = _ours(path, driver_launched=True)
    assert whole["compute_us"] - like["compute_us"] > 0.15 * whole["compute_us"]


def test_the_transformer_trace_hta_cannot_read_is_measured_whole() -> None:
    whole, kept, n_driver = _ours(_trace("gpu_transformer"), driver_launched=True)
    assert n_driver > 100 and kept > 1000
    assert 0 < whole["compute_us"] < whole["total_us"]
    assert whole["idle_us"] + whole["compute_us"] + whole["non_compute_us"] == \
        pytest.approx(whole["total_us"], abs=1.0)
