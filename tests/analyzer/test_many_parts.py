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


def _held_tables(run) -> list[str]:
    return [r[0] for r in run.con.execute(
        "SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]


def test_chunks_read_while_listing_keep_late_columns_and_skip_torn_parts(
        tmp_path: Path, monkeypatch) -> None:
    """The parts of an uncompacted table are read in chunks as their footers are checked: a
    column that first appears in a later chunk is in the view (null before), a torn part in
    the middle is skipped and named, and no chunk table is left behind."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tracealyze.analyzer.run import catalog

    monkeypatch.setattr(catalog, "CHUNK_PARTS", 40)  # several chunks, each read on its own
    run = make_run(tmp_path, steps=2 * (HOLD_PARTS + 10), parts=HOLD_PARTS + 10, seed=1)
    folder = run / "steps" / "rank=0"
    parts = sorted(folder.iterdir())
    late = parts[200:]  # from the sixth chunk on, a column the schema does not know
    for p in late:
        t = pq.read_table(p)
        pq.write_table(t.append_column("tokens", pa.array([7] * t.num_rows, pa.int64())), p)
    torn = parts[100]
    rows_torn = pq.read_metadata(torn).num_rows
    torn.write_bytes(b"PAR1 torn")
    with open_run(run) as r:
        assert any(p == torn for p, _ in r.skipped_parts)
        (n, tokens, nulls) = r.con.execute(
            "SELECT count(*), count(tokens), count(*) - count(tokens) FROM steps").fetchone()
        assert n == 2 * (HOLD_PARTS + 10) - rows_torn
        assert tokens == 2 * len(late) and nulls == n - tokens
        names = _held_tables(r)
        assert "_held_main_steps" in names
        assert not [t for t in names if "__" in t]  # chunks joined and dropped


def test_a_part_merged_away_while_listing_reads_the_table_again(
        tmp_path: Path, monkeypatch) -> None:
    """A part that vanishes while its chunk's footers are read (a live writer merging)
    voids the chunks already read: the table is listed again and counted once."""
    from tracealyze.analyzer.run import catalog, footers

    monkeypatch.setattr(catalog, "CHUNK_PARTS", 50)
    run = make_run(tmp_path, steps=HOLD_PARTS + 50, parts=HOLD_PARTS + 50, seed=2)
    victim = sorted((run / "steps" / "rank=0").iterdir())[120]
    real = footers._footer
    calls = {"n": 0}

    def flaky(f, schemas):
        if f == victim and calls["n"] == 0:
            calls["n"] += 1
            raise footers.Vanished(str(f))
        return real(f, schemas)

    monkeypatch.setattr(footers, "_footer", flaky)
    with open_run(run) as r:
        assert calls["n"] == 1
        assert r.query("SELECT count(*), count(DISTINCT step) FROM steps")[1] == [
            (HOLD_PARTS + 50, HOLD_PARTS + 50)]
        assert not [t for t in _held_tables(r) if "__" in t]
