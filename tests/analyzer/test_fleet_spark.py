"""tracealyze fleet --engine spark: the per-run analyses as Spark tasks (pyspark on
local[2], the analyzer's code shipped to the executors) give the rows the local engine
gives; Spark SQL reads the index and the run tables directly (Hive layout) and agrees
with query --fleet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.analyzer.fleet.fleet import run_fleet

from tests.fleetfactory import FleetSpec, make_fleet

pytestmark = pytest.mark.slow

VOLATILE = ("analysis_cpu_s", "analysed_at")


@pytest.fixture(scope="module")
def java() -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime")


def _rows(result) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in result.runs]


def test_spark_gives_the_rows_of_the_local_engine(java: None, tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    make_fleet(root, FleetSpec(runs=14, min_steps=60, max_steps=150, min_tensors=2,
                               max_tensors=4, tensor_every=20, rank_choices=(1, 2, 4),
                               rank_weights=(1, 1, 1), hosts=6, slow_hosts=("node-002",),
                               pathology_share=0.3, seed=5))
    local = run_fleet([root], engine="local", jobs=2, index=tmp_path / "local-index")
    spark = run_fleet([root], engine="spark", spark_master="local[2]",
                      index=tmp_path / "spark-index")
    assert spark.analysed == local.analysed == 14
    assert _rows(spark) == _rows(local)
    assert spark.fleet_findings == local.fleet_findings
    assert spark.findings == local.findings and spark.ranks == local.ranks


def test_spark_sql_reads_the_index_and_runs_as_query_fleet_does(java: None,
                                                                 tmp_path: Path) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    root = tmp_path / "fleet"
    make_fleet(root, FleetSpec(runs=8, min_steps=60, max_steps=150, min_tensors=2,
                               max_tensors=4, tensor_every=20, rank_choices=(1, 2),
                               rank_weights=(1, 1), hosts=4, pathology_share=0.5, seed=8))
    session = (SparkSession.builder.master("local[2]").appName("tracealyze-fleet-sql")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        # the active session is the one the engine uses (spark-submit, Databricks)
        result = run_fleet([root], engine="spark")
        assert len(result.runs) == 8
        assert not session.sparkContext._jsc.sc().isStopped()  # ours: left running
        index = result.index
        runs = session.read.parquet(str(index / "runs"))
        by_status = {r["status"]: r["n"] for r in
                     runs.groupBy("status").agg(F.count("*").alias("n")).collect()}
        steps_sum = runs.agg(F.sum("steps")).collect()[0][0]
        paths = [r["path"] for r in runs.select("path").collect()]
        # each run is its own Hive table (rank=<r> partitions): read each, union by name
        from functools import reduce

        steps = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True),
                       [session.read.parquet(f"{p}/steps").withColumn("run_path", F.lit(p))
                        for p in paths])
        per_run = {r["run_path"]: r["n"] for r in
                   steps.groupBy("run_path").agg(F.count("*").alias("n")).collect()}
    finally:
        session.stop()

    def q(sql: str) -> list[dict]:
        res = CliRunner().invoke(main, ["query", "--fleet", str(root), sql, "--format",
                                        "json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    assert {r["status"]: r["n"] for r in q("SELECT status, count(*) AS n FROM runs "
                                           "GROUP BY 1")} == by_status
    assert q("SELECT sum(steps) AS s FROM runs")[0]["s"] == steps_sum
    assert {r["run_path"]: r["n"] for r in q("SELECT run_path, count(*) AS n FROM steps "
                                             "GROUP BY 1")} == per_run
