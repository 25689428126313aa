"""The format contract between the two halves: the recorder's and the analyzer's schemas are
the format module's (one source), docs/FORMAT.md names the same tables, columns and types,
and a run the recorder really wrote opens in the analyzer with every row and the NaN/null
distinction intact."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from rec_helpers import DESIGN_MINIMUM, REPO, batches, loss_fn, part_files, tiny_model
from tracealyze.analyzer.sql import schema as analyzer_schema
from tracealyze.recorder import Recorder
from tracealyze.recorder.write import schema as recorder_schema

# Tables only the analyzer fills (from profiler traces); the recorder never writes them.
ANALYZER_ONLY = {"trace_events"}


def logical(t: pa.DataType) -> str:
    """Arrow type → the logical names analyzer/schema.py uses (dictionary<string> = string)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    names = {pa.int32(): "int32", pa.int64(): "int64", pa.float32(): "float32",
             pa.float64(): "float64", pa.string(): "string", pa.bool_(): "bool",
             pa.list_(pa.int64()): "int64[]"}
    return names.get(t, str(t))


def recorder_columns(table: str) -> list[tuple[str, str]]:
    """Columns of the recorder's files, with the ``rank`` partition (the folder) first."""
    return [("rank", "int32"), *((f.name, logical(f.type)) for f in recorder_schema.TABLES[table])]


def format_md_columns() -> dict[str, list[tuple[str, str]]]:
    """Column lists from the 'Tables' section of docs/FORMAT.md (both row styles: one column
    per row, or 'name type, name type' in one cell)."""
    text = (REPO / "docs" / "FORMAT.md").read_text()
    section = text.split("\n## Tables", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "table":  # the header row
            continue
        if cells[0]:
            current = cells[0]
            out[current] = [("rank", "int32")]  # "all have rank int32"
        if current is None:
            continue
        if cells[2]:  # "| | absmax, mean, std | float32 |": names share one type
            out[current] += [(n.strip(), cells[2]) for n in cells[1].split(",")]
        else:
            for item in re.sub(r"\([^)]*\)", "", cells[1]).split(","):  # drop '(nullable)'
                name, typ = item.split()[:2]
                out[current].append((name, typ))
    return out


def test_schema_versions_agree() -> None:
    from tracealyze.format import SCHEMA_VERSION

    assert recorder_schema.SCHEMA_VERSION == analyzer_schema.SCHEMA_VERSION == SCHEMA_VERSION
    assert SCHEMA_VERSION == 2  # files without a rank column (the folder is the partition)
    assert all("rank" not in s.names for s in recorder_schema.TABLES.values())


def test_recorder_and_analyzer_tables_agree() -> None:
    rec_tables = set(recorder_schema.TABLES)
    ana_tables = set(analyzer_schema.TABLES)
    assert rec_tables <= ana_tables
    assert ana_tables - rec_tables <= ANALYZER_ONLY
    for table in rec_tables:
        ana = [(n, t) for n, t in analyzer_schema.TABLES[table]]
        assert recorder_columns(table) == ana, table


@pytest.mark.parametrize("table", sorted(DESIGN_MINIMUM))
def test_design_minimum_columns_present(table: str) -> None:
    want = {"rank", *DESIGN_MINIMUM[table]}
    assert want <= {n for n, _ in analyzer_schema.TABLES[table]}
    if table not in ANALYZER_ONLY:
        assert want - {"rank"} <= set(recorder_schema.TABLES[table].names)


def test_format_md_matches_recorder_schema() -> None:
    doc = format_md_columns()
    assert set(doc) == set(analyzer_schema.TABLES)
    for table, cols in doc.items():
        assert cols == list(analyzer_schema.TABLES[table]), table
        if table in recorder_schema.TABLES:
            assert cols == recorder_columns(table), table


def test_recorded_run_opens_in_the_analyzer(tmp_path: Path) -> None:
    from tracealyze.analyzer.run.catalog import open_run

    run_dir = tmp_path / "run"
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Single parts kept (no merge) plus a merged range, so both kinds of file are read.
    with Recorder(run_dir, model=model, optimizer=opt, preset="debug", flush_rows=1,
                  system_interval_s=0.05, profile_start=0, profile_every=0,
                  flush_interval_s=0.05) as rec:
        for i, (x, y) in enumerate(batches(4)):
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.watch("w", torch.ones(3))
            rec.step(loss=[loss, float("nan"), None, loss][i], m=float(i))
        rec.event("note", "hello", severity="info")
    counts = {t: sum(pq.read_metadata(f).num_rows for f in part_files(run_dir, t))
              for t in recorder_schema.TABLES}
    assert all(counts[t] for t in ("steps", "tensor_stats", "metrics", "events", "memory"))
    with open_run(run_dir) as run:
        assert run.skipped_parts == []
        assert run.status == "completed" and run.ranks == [0]
        by_name = {name: (cols, n) for name, cols, n in run.tables()}
        for table in recorder_schema.TABLES:
            cols, n = by_name[table]
            assert [c for c, _ in cols] == ["rank", *recorder_schema.TABLES[table].names]
            assert n == counts[table], table
        _, loss = run.query("SELECT step, loss FROM steps ORDER BY step")
        assert [s for s, _ in loss] == [0, 1, 2, 3]
        assert math.isnan(loss[1][1]) and loss[2][1] is None  # NaN is data, null is "not given"
        _, kinds = run.query("SELECT DISTINCT kind FROM tensor_stats ORDER BY kind")
        assert [k for (k,) in kinds] == ["activation", "grad", "param", "update", "watch"]


def test_format_parser_is_not_vacuous() -> None:
    doc = format_md_columns()
    assert len(doc["tensor_stats"]) == 16 and ("absmax", "float32") in doc["tensor_stats"]
    assert re.fullmatch(r"int\d\d", dict(doc["memory"])["cuda_ooms"])
