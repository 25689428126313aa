"""tracealyze.recorder: low-overhead training telemetry written to Parquet.

Imports torch, pyarrow and psutil only — never duckdb, jinja2 or click.

The house, by role (CONTRIBUTING.md has the map): the facade (``recorder.Recorder``), its
configuration (``config``), the step it drives (``lifecycle``, ``stepstate``, ``capture``);
what is measured on tensors (``tensors/``) and of the training (``training/``); how it is
written (``write/``); how it lives in the process (``live/``); and the frameworks that drive
it (``integrations/``).
"""

try:  # torch is not a dependency of the package (the analyzer never needs it)
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tracealyze.recorder needs PyTorch, which tracealyze does not install by itself (the "
        "analyzer does not use it): install the torch build for your machine, or "
        "`pip install tracealyze[torch]`") from exc

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], Any], list[str]]:
    """A room's ``(__getattr__, __all__)`` for ``exports`` (public name -> the module,
    relative to ``package``, that defines it), each imported on first use. Defined before
    the facade is imported: the rooms' faces import it while this package is starting."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(import_module(exports[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__, sorted(exports)


from .config import PRESETS, RecorderConfig  # noqa: E402 (after lazy_exports: see there)
from .recorder import Recorder  # noqa: E402

__all__ = ["PRESETS", "Recorder", "RecorderConfig", "lazy_exports"]
