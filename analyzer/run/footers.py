"""Which listed part files are data: their Parquet footers read and their columns' types
checked once per distinct schema.

A run left uncompacted (``merge_on_close=False``, or written by an older version) can hold
tens of thousands of small parts: checking every column of every file cost 0.8 s at 16,000
parts, though nearly all of them share one schema. Footers are read with pyarrow's reader
directly (``pq.read_metadata`` resolves a file system per call: 30% slower); a thread pool
was slower still on two cores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StoreError, one_line
from ..sql.schema import TABLES
from .inplace import open_part
from .view_sql import arrow_to_logical


class Vanished(Exception):
    """A listed part is gone: the writer merged it (a live run)."""


class _Schemas:
    """Arrow schemas of Parquet schemas, converted once per distinct schema: the conversion
    is half the cost of reading a footer (35 of 70 µs), and the parts of one run nearly
    always share one schema (compared with the last one seen first). The Arrow schema also
    depends on the footer's stored ``ARROW:schema`` (dictionary columns): compared too."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, bytes | None, Any]] = []

    def arrow(self, md: Any) -> Any:
        pq_schema, kv = md.schema, (md.metadata or {}).get(b"ARROW:schema")
        for known, known_kv, arrow in reversed(self.seen):
            if kv == known_kv and pq_schema.equals(known):
                return arrow
        arrow = pq_schema.to_arrow_schema()
        self.seen.append((pq_schema, kv, arrow))
        return arrow


def _footer(f: Path, schemas: _Schemas) -> tuple[Any, int] | str:
    """(arrow schema, rows) of ``f``, or why it is not data; Vanished if it is gone."""
    import pyarrow._parquet as _pq

    try:
        with open_part(f) as fh:
            reader = _pq.ParquetReader()
            reader.open(fh)
            md = reader.metadata
        return schemas.arrow(md), md.num_rows
    except FileNotFoundError:
        raise Vanished(str(f)) from None
    except StoreError:  # the store did not answer: the command fails, the part is not bad
        raise
    except Exception as e:  # any unreadable footer means: not usable data
        return f"unreadable Parquet footer ({type(e).__name__}: {one_line(e)[:160]})"


def _castable(got: str | None, want: str) -> bool:
    """Whether the view can cast a column of logical type ``got`` to ``want``: scalars to
    scalars (widening, narrowing, bool, string), a list only to a list."""
    return got is not None and got.endswith("[]") == want.endswith("[]")


def validate(files: list[Path], skipped: list[tuple[Path, str]], table: str | None = None,
             rows: dict[Path, int] | None = None, *, relist: bool = True
             ) -> list[tuple[Path, Any]] | None:
    """(path, arrow schema) of the parts whose footer reads and whose known columns have a
    type the view can cast (a ``list<int64>`` step is not data); others go to ``skipped``;
    each good part's row count goes to ``rows``. When a part vanished since it was listed (a
    merge of a live run): None, to list again, or with ``relist=False`` it is left out."""
    want = dict(TABLES[table]) if table else {}
    footers: list[tuple[Any, int] | str | None] = []
    schemas = _Schemas()
    for f in files:
        try:
            footers.append(_footer(f, schemas))
        except Vanished:
            if relist:
                return None
            footers.append(None)
    verdicts: dict[Any, str | None] = {}  # per distinct schema: why not (None: fine)
    good = []
    for f, got in zip(files, footers, strict=True):
        if got is None:
            continue
        if isinstance(got, str):
            skipped.append((f, got))
            continue
        schema, n = got
        if schema not in verdicts:
            bad = [(fld.name, str(fld.type)) for fld in schema
                   if fld.name in want and not _castable(arrow_to_logical(fld.type),
                                                        want[fld.name])]
            verdicts[schema] = (f"column {bad[0][0]} has type {bad[0][1]}, expected "
                                f"{want[bad[0][0]]}") if bad else None
        if verdicts[schema] is not None:
            skipped.append((f, verdicts[schema]))
            continue
        good.append((f, schema))
        if rows is not None:
            rows[f] = n
    return good
