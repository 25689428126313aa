"""Arrow schemas of the tables the recorder writes: the run-directory format's own
(``tracealyze.format.schema``; docs/FORMAT.md), as Parquet files hold them (no ``rank``
column: it is the ``rank=<r>`` folder)."""

from __future__ import annotations

import pyarrow as pa
from tracealyze.format.schema import RECORDER_TABLES, SCHEMA_VERSION, STAT_COLUMNS, arrow_schema

TABLES: dict[str, pa.Schema] = {t: arrow_schema(t) for t in RECORDER_TABLES}

__all__ = ["SCHEMA_VERSION", "STAT_COLUMNS", "TABLES"]
