"""tracealyze.recorder: low-overhead training telemetry written to Parquet.

Imports torch, pyarrow and psutil only — never duckdb, jinja2 or click.
"""

from .config import PRESETS, RecorderConfig
from .recorder import Recorder

__all__ = ["PRESETS", "Recorder", "RecorderConfig"]
