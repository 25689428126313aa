"""The fleet index read as what it is: files in a shared folder that anyone with write access
to the root may have planted or forged. Each table is read through a folder opened without
following links, refused (and then rebuilt) when it is larger than any real fleet's, and
checked against its schema before a row is decoded.

The bounds come from the size of a fleet, not from the machine: a team's fleet is thousands
of runs; the bounds leave room for fifty times that, and refuse what only a forgery holds.
Counting rows matters more than counting bytes: 1M identical forged rows compress to
117 KB, and decoding them into Python took 4.7 GB and 342 s (then a MemoryError). The row
count is in the Parquet footer, read before any row is.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import pyarrow as pa

from ..writes import Dir

MAX_RUNS = 200_000
"""Rows of ``runs``: one per run. A team's fleet is thousands of runs; 200,000 is fifty times
a large one, and its rows still read in a second or two."""
ROWS_PER_RUN = 50
"""``findings`` and ``ranks`` rows per run, on average over the index: a run has a handful of
findings (the detectors report each problem once) and one ranks row per rank."""
MIN_ROWS = 100_000
"""The findings/ranks bound of a small fleet: a few runs of thousands of ranks each hold a
ranks row per rank, more than ROWS_PER_RUN on average, and are real."""
MAX_TABLE_BYTES = 256 << 20
"""A table file's size on disk: 200,000 runs rows take about 20 MB (zstd), ten million
findings rows a few hundred MB at most (their text repeats across runs)."""
MAX_DECODED_BYTES = 2 << 30
"""The row groups' decoded size as the footer declares it: what reading the table costs in
memory. Ten million findings rows of ~200 bytes: 2 GiB, the most a fleet command may take."""
MAX_JSON_BYTES = 64 << 10
"""``index.json`` holds three numbers: anything larger is not ours."""
TABLE_FILE = "data.parquet"


def row_bound(table: str, runs_rows: int) -> int:
    """The most rows ``table`` may hold in an index of ``runs_rows`` runs."""
    if table == "runs":
        return MAX_RUNS
    return max(MIN_ROWS, ROWS_PER_RUN * runs_rows)


@dataclass
class Read:
    """What reading the index gave: the tables accepted, and one warning per refusal."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    refused: bool = False
    """A table was there but refused (or not a folder): the index is rebuilt."""
    present: bool = False
    """The whole index was there and accepted."""


def folder(parent: Dir, name: str, read: Read) -> Dir | None:
    """The folder ``name`` inside ``parent`` for reading; None when absent, or when it is a
    link or not a folder (said in ``read``: never followed)."""
    kind = parent.kind(name)
    if kind is None:
        return None
    if kind != "dir":
        read.refused = True
        read.warnings.append(f"the fleet index {parent.path / name} is not read: it is "
                             f"{'a symbolic link' if kind == 'link' else 'not a folder'}")
        return None
    return parent.sub(name, create=False)


def read_table(index: Dir, table: str, schema: pa.Schema, max_rows: int,
               read: Read) -> pa.Table | None:
    """``INDEX/table/data.parquet`` if it is a regular file within the bounds and of
    ``schema``; None otherwise (a refusal is said in ``read``; another schema, an index of
    another version, is silently rebuilt)."""
    import pyarrow.parquet as pq

    sub = folder(index, table, read)
    if sub is None:
        return None
    where = sub.path / TABLE_FILE

    def refuse(why: str) -> None:
        read.refused = True
        read.warnings.append(f"the fleet index table {where} is ignored and rebuilt: {why}")

    with sub:
        try:
            st = os.stat(TABLE_FILE, dir_fd=sub.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            refuse(e.strerror or type(e).__name__)
            return None
        if not stat.S_ISREG(st.st_mode):
            refuse("it is not a regular file")
            return None
        if st.st_size > MAX_TABLE_BYTES:
            refuse(f"{st.st_size:,} bytes, more than the {MAX_TABLE_BYTES:,} a fleet's takes")
            return None
        data = sub.read_bytes(TABLE_FILE, MAX_TABLE_BYTES)
    if data is None:
        refuse("it changed while it was read")
        return None
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        md = pf.metadata
        rows = max(md.num_rows, sum(md.row_group(i).num_rows
                                    for i in range(md.num_row_groups)))
        if rows > max_rows:
            refuse(f"{rows:,} rows, more than the {max_rows:,} a fleet of its size holds")
            return None
        decoded = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        if decoded > MAX_DECODED_BYTES:
            refuse(f"{decoded:,} bytes of rows, more than {MAX_DECODED_BYTES:,}")
            return None
        if not pf.schema_arrow.equals(schema):
            return None  # written by another version of the index: rebuilt
        t = pf.read()
    except (pa.ArrowException, OSError, ValueError, IndexError) as e:
        refuse(f"not a readable Parquet file ({' '.join(str(e).split())[:200]})")
        return None
    if t.num_rows > max_rows:  # (the footer said otherwise)
        refuse(f"{t.num_rows:,} rows, more than {max_rows:,}")
        return None
    return t
