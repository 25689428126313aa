"""Every table directory a recorder writes is readable, with the right ``rank``, by the
Parquet readers users reach for: pandas, pyarrow datasets, polars, DuckDB and Apache Spark.
(schema_version 1 put a ``rank int32`` column inside the files beside the ``rank=<r>``
folder, and pandas/pyarrow refused it: "Unable to merge: Field rank has incompatible types".)
A schema_version 1 run is still read by the analyzer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from rec_helpers import FAST, REPO, batches, tiny_model, train
from tracealyze.recorder import Recorder

TABLES = ("steps", "tensor_stats", "metrics", "events", "memory")
STEPS = {0: 6, 1: 4}  # recorded steps per rank


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-rank run: each rank records into the same directory, as torchrun would."""
    run_dir = tmp_path_factory.mktemp("readers") / "run"
    mp = pytest.MonkeyPatch()
    try:
        for rank, n in STEPS.items():
            mp.setenv("RANK", str(rank))
            mp.setenv("WORLD_SIZE", "2")
            model = tiny_model(seed=rank)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            with Recorder(run_dir, model=model, optimizer=opt, **FAST) as rec:
                train(rec, model, opt, batches(n), acc=1.0)
                rec.event("note", f"rank {rank}", severity="info")
    finally:
        mp.undo()
    return run_dir


def _per_rank(ranks: list) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in ranks:
        out[int(r)] = out.get(int(r), 0) + 1
    return out


@pytest.mark.parametrize("table", TABLES)
def test_pandas_read_parquet(run: Path, table: str) -> None:
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(run / table)
    assert set(df["rank"].astype(int)) == {0, 1}
    if table == "steps":
        assert _per_rank(df["rank"].tolist()) == STEPS
        assert sorted(df[df["rank"].astype(int) == 1]["step"]) == list(range(STEPS[1]))


@pytest.mark.parametrize("table", TABLES)
def test_pyarrow_dataset_hive(run: Path, table: str) -> None:
    import pyarrow.dataset as ds

    t = ds.dataset(run / table, partitioning="hive").to_table()
    assert set(t.column("rank").to_pylist()) == {0, 1}
    if table == "steps":
        assert _per_rank(t.column("rank").to_pylist()) == STEPS


def test_pyarrow_read_table(run: Path) -> None:
    import pyarrow.parquet as pq

    t = pq.read_table(run / "steps")
    assert _per_rank(t.column("rank").to_pylist()) == STEPS


@pytest.mark.parametrize("table", TABLES)
def test_polars_scan_parquet_hive(run: Path, table: str) -> None:
    pl = pytest.importorskip("polars")
    df = pl.scan_parquet(str(run / table) + "/**/*.parquet", hive_partitioning=True).collect()
    assert set(df["rank"].to_list()) == {0, 1}
    if table == "steps":
        assert _per_rank(df["rank"].to_list()) == STEPS


@pytest.mark.parametrize("table", TABLES)
def test_duckdb_hive_partitioning(run: Path, table: str) -> None:
    import duckdb

    rows = duckdb.sql(f"SELECT rank, count(*) FROM read_parquet('{run / table}/*/*.parquet', "
                      "hive_partitioning=true) GROUP BY rank ORDER BY rank").fetchall()
    assert [int(r) for r, _ in rows] == [0, 1]
    if table == "steps":
        assert dict((int(r), n) for r, n in rows) == STEPS


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("tracealyze-format")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.slow
def test_spark_read_parquet(run: Path, spark) -> None:
    for table in TABLES:
        df = spark.read.parquet(str(run / table))
        got = {int(r["rank"]): r["count"] for r in df.groupBy("rank").count().collect()}
        assert set(got) == {0, 1}, table
        if table == "steps":
            assert got == STEPS


def test_analyzer_reads_the_folders_rank(run: Path) -> None:
    from tracealyze.analyzer.run.catalog import open_run

    with open_run(run) as r:
        assert r.ranks == [0, 1]
        _, rows = r.query("SELECT rank, count(*) FROM steps GROUP BY rank ORDER BY rank")
        assert dict(rows) == STEPS


def test_schema_version_1_run_is_still_read(tmp_path: Path) -> None:
    """A version-1 run (rank inside the files too) opens and analyses as before."""
    from tracealyze.analyzer.diagnosis.summary import build_summary
    from tracealyze.analyzer.run.catalog import open_run

    v1 = REPO / "tests" / "data" / "v1_run"
    with open_run(v1) as r:
        assert r.meta["schema_version"] == 1 and r.ranks == [0]
        _, rows = r.query("SELECT min(rank), max(rank), count(*) FROM steps")
        assert rows == [(0, 0, 300)]
    s = build_summary(v1)
    assert s["run"]["steps"] == 300
    assert not [f for f in s["findings"] if "detector_error" in f["evidence"]]


SAMPLES = sorted(p for p in (REPO / "sample_traces").iterdir() if (p / "run.json").is_file())
SAMPLE_TABLES = [(s, t) for s in SAMPLES
                 for t in ("steps", "tensor_stats", "metrics", "events", "memory", "system",
                           "trace_events") if (s / t).is_dir()]


def _analyzer_counts(sample: Path, table: str) -> dict[int, int]:
    from tracealyze.analyzer.run.catalog import open_run

    with open_run(sample) as r:
        # the files themselves (the view adds raw traces, and shards are combined)
        n = {rank: 0 for rank in r.table_ranks(table)}
        for f in r.files[table]:
            import pyarrow.parquet as pq

            n[int(f.parent.name.split("=")[1])] += pq.read_metadata(f).num_rows
        return n


def test_every_shipped_sample_is_schema_version_2() -> None:
    import json

    assert SAMPLES
    for s in SAMPLES:
        assert json.loads((s / "run.json").read_text())["schema_version"] == 2, s.name


@pytest.mark.parametrize("sample, table", SAMPLE_TABLES,
                         ids=[f"{s.name}-{t}" for s, t in SAMPLE_TABLES])
def test_every_reader_reads_every_shipped_sample(sample: Path, table: str) -> None:
    """pandas, pyarrow datasets, polars and DuckDB read each table of each run we ship, with
    the folder's rank (version 1 samples failed in pandas and pyarrow)."""
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow.dataset as ds

    want = _analyzer_counts(sample, table)
    d = sample / table
    got_pd = pd.read_parquet(d)["rank"].astype(int).value_counts().to_dict()
    t = ds.dataset(d, partitioning="hive").to_table(columns=["rank"])
    got_ds = _per_rank(t.column("rank").to_pylist())
    got_pl = _per_rank(pl.scan_parquet(str(d) + "/**/*.parquet", hive_partitioning=True)
                       .select("rank").collect()["rank"].to_list())
    got_db = dict(duckdb.sql(f"SELECT rank, count(*) FROM read_parquet('{d}/*/*.parquet', "
                             "hive_partitioning=true) GROUP BY rank").fetchall())
    for got in (got_pd, got_ds, got_pl, got_db):
        assert {int(k): v for k, v in got.items()} == want


@pytest.mark.slow
def test_spark_reads_every_shipped_sample(spark) -> None:
    for sample, table in SAMPLE_TABLES:
        df = spark.read.parquet(str(sample / table))
        got = {int(r["rank"]): r["count"] for r in df.groupBy("rank").count().collect()}
        assert got == _analyzer_counts(sample, table), (sample.name, table)
