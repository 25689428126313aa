"""tracealyze.recorder: low-overhead training telemetry written to Parquet.

Imports torch, pyarrow and psutil only — never duckdb, jinja2 or click.
"""

try:  # torch is not a dependency of the package (the analyzer never needs it)
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tracealyze.recorder needs PyTorch, which tracealyze does not install by itself (the "
        "analyzer does not use it): install the torch build for your machine, or "
        "`pip install tracealyze[torch]`") from exc

from .config import PRESETS, RecorderConfig
from .recorder import Recorder

__all__ = ["PRESETS", "Recorder", "RecorderConfig"]
