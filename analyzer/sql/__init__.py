"""How every query is made safe: quoted identifiers and literals, one statement per call,
and connections sandboxed to the run directories of the command."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ident": ".safe",
    "literal": ".safe",
    "execute_one": ".safe",
    "sandbox": ".safe",
    "lock": ".safe",
    "check_user_sql": ".safe",
    "read_query": ".safe",
}
"""Public name -> the module that defines it, imported on first use: importing a package
never pulls in more than it needs (the CLI's start-up stays fast)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
