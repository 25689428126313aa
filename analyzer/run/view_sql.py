"""The SELECT behind each table's view: a table's columns in schema order and type over an
explicit list of Parquet parts, with the rank taken from each part's ``rank=<r>`` folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracealyze.format.parts import rank_of

from ..sql.safe import ident, literal
from ..sql.schema import DUCKDB_TYPES, TABLES
from .held import MANY_RANKS
from .inplace import sql_path

_RANK = object()
"""Stands for the rank expression in a select list until the scan is known."""


def arrow_to_logical(t: Any) -> str | None:
    """Logical type name (schema.py) of an Arrow type; dictionary<string> counts as string."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_list(t) and pa.types.is_int64(t.value_type):
        return "int64[]"
    for name, pred in (("int32", pa.types.is_int32), ("int64", pa.types.is_int64),
                       ("float32", pa.types.is_float32), ("float64", pa.types.is_float64),
                       ("bool", pa.types.is_boolean)):
        if pred(t):
            return name
    return None


def view_sql(table: str, parts: list[tuple[Path, Any]]) -> str:
    """SELECT of ``table``'s columns (in schema order, typed) over ``parts``.

    The rank of a part is its folder's (``rank=<r>``), whatever a file holds: schema_version
    2 files have no rank column, version 1 files repeat the folder's. One scan per rank with
    the rank as a constant: no per-row expression on the file name (20.6M rows: 3.4 s
    against 4.3 s)."""
    spec = TABLES[table]
    if not parts:
        cols = ", ".join(f"CAST(NULL AS {DUCKDB_TYPES[t]}) AS {c}" for c, t in spec)
        return f"SELECT {cols} WHERE false"
    present: dict[str, set[str | None]] = {}
    extra: list[str] = []
    schemas = list(dict.fromkeys(s for _, s in parts))  # distinct, in order (16,000 parts:
    for schema in schemas:                               # usually one schema)
        for field in schema:
            present.setdefault(field.name, set()).add(arrow_to_logical(field.type))
            if field.name not in dict(spec) and field.name not in extra:
                extra.append(field.name)
    # Every name from a footer is a quoted identifier (sqlsafe.ident), and the select list
    # is joined, never formatted: a column called `{rank}` or `a"; COPY ...` stays a name.
    exprs: list[object] = []
    for c, t in spec:
        if c == "rank":
            exprs.append(_RANK)
        elif c not in present:
            exprs.append(f"CAST(NULL AS {DUCKDB_TYPES[t]}) AS {c}")
        elif present[c] == {t}:
            exprs.append(ident(c))  # already the right type: no cast, keeps filter pushdown
        else:
            exprs.append(f"CAST({ident(c)} AS {DUCKDB_TYPES[t]}) AS {c}")
    exprs += [ident(c) for c in extra]

    def select(rank: str) -> str:
        return ", ".join(f"{rank} AS rank" if e is _RANK else str(e) for e in exprs)
    same = len({s.remove_metadata() for s in schemas}) == 1
    opts = "hive_partitioning=false" + ("" if same else ", union_by_name=true")
    by_rank: dict[int, list[Path]] = {}
    for p, _ in parts:
        by_rank.setdefault(rank_of(p.parent.name) or 0, []).append(p)
    if len(by_rank) > MANY_RANKS:
        # one scan of every file, the rank read from the file's folder: a UNION of 1,024
        # scans costs seconds per query just to plan and schedule (5.3 s against 0.2 s), and
        # a join with a (file, rank) table misleads DuckDB's join order (a 575M-row product)
        paths = ", ".join(literal(sql_path(p)) for fs in by_rank.values() for p in fs)
        rank = r"CAST(regexp_extract(filename, 'rank=(\d+)[/\\][^/\\]*$', 1) AS INTEGER)"
        return (f"SELECT {select(rank)} FROM read_parquet([{paths}], {opts}, "
                "filename=true)")
    return " UNION ALL ".join(
        f"SELECT {select(f'CAST({int(r)} AS INTEGER)')} FROM read_parquet("
        f"[{', '.join(literal(sql_path(p)) for p in files)}], {opts})"
        for r, files in sorted(by_rank.items()))
