"""How every query is made safe: quoted identifiers and literals, one statement per call,
and connections sandboxed to the run directories of the command."""

from __future__ import annotations

from .. import lazy_exports

_EXPORTS = {
    "ident": ".safe",
    "literal": ".safe",
    "execute_one": ".safe",
    "sandbox": ".safe",
    "lock": ".safe",
    "check_user_sql": ".safe",
    "read_query": ".safe",
}
"""Public name -> the module that defines it (imported on first use)."""

__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)
