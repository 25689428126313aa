"""A run left uncompacted (thousands of small parts per table) is read once into memory per
command: the answers are those of the same run in one part per table."""

from __future__ import annotations

from pathlib import Path

from tracealyze.analyzer.diagnosis.summary import build_summary
from tracealyze.analyzer.run.catalog import open_run
from tracealyze.analyzer.run.held import HOLD_PARTS

from tests.runfactory import make_run


def test_an_uncompacted_run_reads_as_its_compacted_twin(tmp_path: Path) -> None:
    kw = dict(steps=600, tensors=3, metrics={"acc": 0.5}, grad_norm="default", seed=3)
    many = make_run(tmp_path, name="many", parts=HOLD_PARTS + 44, **kw)
    one = make_run(tmp_path, name="one", parts=1, **kw)
    assert len(list((many / "steps" / "rank=0").iterdir())) > HOLD_PARTS
    sqls = ["SELECT count(*), sum(step), sum(loss) FROM steps",
            "SELECT name, kind, count(*), sum(norm) FROM tensor_stats GROUP BY ALL ORDER BY ALL",
            "SELECT count(*), sum(value) FROM metrics",
            "SELECT count(*), max(rss_bytes) FROM memory"]
    with open_run(many) as a, open_run(one) as b:
        held = a.con.execute("SELECT count(*) FROM duckdb_tables() "
                             "WHERE table_name LIKE '\\_held\\_%' ESCAPE '\\'").fetchone()
        assert held[0] >= 3  # steps, tensor_stats, metrics, memory read once
        for sql in sqls:
            assert a.query(sql)[1] == b.query(sql)[1], sql
    fa = [(f["id"], f["subject"], f["first_step"]) for f in build_summary(many)["findings"]]
    fb = [(f["id"], f["subject"], f["first_step"]) for f in build_summary(one)["findings"]]
    assert fa == fb
