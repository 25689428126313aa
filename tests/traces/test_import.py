"""import_traces: what `tracealyze import-trace` writes into a run directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from trace_helpers import CPU_ONLY, NCCL_NS, ROCM, SAMPLED, X, con_over, table_of
from tracealyze.analyzer.errors import TraceError
from tracealyze.analyzer.gpu.gputime import gpu_time_breakdown
from tracealyze.analyzer.ingest.importer import import_traces
from tracealyze.analyzer.ingest.read import TRACE_EVENTS_SCHEMA


def test_import_into_a_new_directory_makes_a_minimal_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (info,) = import_traces([SAMPLED], run)
    assert info == {"path": str(SAMPLED), "trace_id": table_of(SAMPLED)["trace_id"][0].as_py(),
                    "rank": 0, "events": 4810, "gpu_events": 1204, "steps": 2,
                    "skipped": False}
    meta = json.loads((run / "run.json").read_text())
    assert meta["schema_version"] == 2 and meta["status"] == "completed"
    assert meta["source"] == "import-trace" and len(meta["run_id"]) == 32
    part = run / "trace_events" / "rank=0" / "part-000001.parquet"
    t = pq.read_table(part)
    assert t.schema.remove_metadata() == TRACE_EVENTS_SCHEMA.remove(
        TRACE_EVENTS_SCHEMA.get_field_index("rank"))  # the rank is the folder (version 2)
    assert t.num_rows == 4810
    assert pq.ParquetFile(part).metadata.row_group(0).column(0).compression == "ZSTD"
    # the raw trace is kept only when asked (a choice, not a silent copy of gigabytes)
    assert not (run / "traces").exists()
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert not list(tmp_path.glob(".tracealyze-import-*"))  # the scratch folder is gone
    kept = tmp_path / "kept"
    import_traces([SAMPLED], kept, keep_raw=True)
    assert (kept / "traces" / "rank=0" / SAMPLED.name).read_bytes() == SAMPLED.read_bytes()


def test_a_run_of_imported_traces_says_what_it_could_not_check_without_everything(
        tmp_path: Path) -> None:
    """Its traces were checked (top ops, GPU idle): only the training's own signals were
    not, and recording the training is what would check them."""
    from tracealyze.analyzer.diagnosis.summary import build_summary, render_text

    import_traces([SAMPLED], tmp_path / "run")
    summary = build_summary(tmp_path / "run")
    (gap,) = summary["not_checked"]
    assert gap["check"] != "everything" and "loss" in gap["check"]
    assert "profiler traces" in gap["why"] and "recorder" in gap["how"]
    assert {"loss_divergence", "step_time_outlier", "memory_leak"} <= set(gap["detectors"])
    assert "top_ops" not in gap["detectors"]  # (checked: it reads the traces)
    text = render_text(summary)
    assert "Not checked: everything" not in text and "rec.step()" not in text


def test_reimport_is_skipped_and_new_traces_take_the_next_part(tmp_path: Path) -> None:
    run = tmp_path / "run"
    import_traces([ROCM], run)
    run_json = (run / "run.json").read_text()
    again, other = import_traces([ROCM, CPU_ONLY], run)
    assert again["skipped"] and not other["skipped"]
    assert other["rank"] == 34  # from the trace's distributedInfo
    assert sorted(p.name for p in (run / "trace_events" / "rank=0").iterdir()) == [
        "part-000001.parquet"]
    assert (run / "trace_events" / "rank=34" / "part-000001.parquet").exists()
    assert (run / "run.json").read_text() == run_json  # an existing run is not rewritten
    # A different trace under a taken file name keeps both raw files.
    clash = tmp_path / ROCM.name
    clash.write_text(json.dumps({"traceEvents": [X("cpu_op", "aten::add", 1.0, 1.0)]}))
    (info,) = import_traces([clash], run)
    assert not info["skipped"]
    assert (run / "trace_events" / "rank=0" / "part-000002.parquet").exists()
    kept = tmp_path / "kept"
    import_traces([ROCM, clash], kept, keep_raw=True)
    raws = sorted(p.name for p in (kept / "traces" / "rank=0").iterdir())
    assert len(raws) == 2 and ROCM.name in raws  # the second is '<stem>-<digest>.json.gz'


def test_a_bad_trace_imports_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(SAMPLED.read_bytes()[:5000])
    run = tmp_path / "run"
    with pytest.raises(TraceError, match=r"bad\.json\.gz"):
        import_traces([SAMPLED, bad], run)
    assert not run.exists()


def test_imported_run_opens_in_the_catalog_without_double_counting(tmp_path: Path) -> None:
    catalog = pytest.importorskip("tracealyze.analyzer.run.catalog")
    run = tmp_path / "run"
    shutil.copy(NCCL_NS, tmp_path / NCCL_NS.name)
    import_traces([tmp_path / NCCL_NS.name, SAMPLED], run)
    r = catalog.open_run(run)
    try:
        n = r.con.execute("SELECT count(*) FROM trace_events").fetchone()[0]
        # the raw copies under traces/ are already in the parquet parts: counted once
        assert n == table_of(NCCL_NS).num_rows + table_of(SAMPLED).num_rows
        (g,) = gpu_time_breakdown(r.con)
    finally:
        close = getattr(r, "close", None)
        if close:
            close()
    # both traces are rank 0: their breakdowns add up
    want = [0.0, 0.0]
    for p in (NCCL_NS, SAMPLED):
        (x,) = gpu_time_breakdown(con_over(table_of(p)))
        want[0] += x["total_us"]
        want[1] += x["idle_us"]
    assert g["total_us"] == pytest.approx(want[0]) and g["idle_us"] == pytest.approx(want[1])
