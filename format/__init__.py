"""The run-directory format (docs/FORMAT.md): the one definition both halves import.

Table schemas (:mod:`.schema`), part files, sequence numbers, atomic writes and compaction
(:mod:`.parts`), run.json and the rule that says whether a run is still alive
(:mod:`.runmeta`). Importing this package imports neither torch nor duckdb; pyarrow is
imported only by the functions that read or write Parquet.
"""

from .schema import SCHEMA_VERSION, TABLE_NAMES, TABLES

__all__ = ["SCHEMA_VERSION", "TABLES", "TABLE_NAMES"]
