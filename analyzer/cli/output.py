"""One output flag for every command (issue 46): ``--format table|csv|json``, with ``--json``
kept as its alias, and the csv/json/table writers the commands share.

``table`` is each command's text for a person; ``json`` its whole result (the documented
JSON); ``csv`` the result's main list, one row per item (findings, tables' columns, compared
metrics, the fleet's runs), for a spreadsheet or ``csvkit``.
"""

from __future__ import annotations

import csv
import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from .edge import BadInput

F = TypeVar("F", bound=Callable[..., Any])
FORMATS = ("table", "csv", "json")


def format_options(rows: str) -> Callable[[F], F]:
    """``--format`` and ``--json`` (its alias) on a command, resolved into its ``fmt``
    argument; ``rows`` names what a csv row is, for the help."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, fmt: str | None, as_json: bool, **kwargs: Any) -> Any:
            if as_json and fmt not in (None, "json"):
                raise BadInput(f"--json and --format {fmt} disagree: give one")
            return fn(*args, fmt="json" if as_json else (fmt or "table"), **kwargs)

        wrapper = click.option("--json", "as_json", is_flag=True,
                               help="The same as --format json.")(wrapper)
        wrapper = click.option(
            "--format", "fmt", type=click.Choice(FORMATS), default=None,
            help=f"Output: table (text, the default), csv (one row per {rows}) or json "
                 "(the whole result).")(wrapper)
        return wrapper  # type: ignore[return-value]

    return deco


def write_rows(cols: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> None:
    """Rows to stdout as csv, json (a list of objects) or an aligned text table."""
    if fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        w.writerows([[_cell(v) for v in r] for r in rows])
    elif fmt == "json":
        from ..sql.render import json_value

        click.echo(json.dumps([{c: json_value(v) for c, v in zip(cols, r, strict=True)}
                               for r in rows], indent=1))
    else:
        from ..sql.render import render_table

        click.echo(render_table(list(cols), [tuple(r) for r in rows]))


def _cell(v: Any) -> Any:
    """A csv cell: nested values as compact JSON, None as empty."""
    if v is None:
        return ""
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, separators=(",", ":"), default=str)
    return v


def dict_rows(items: Sequence[dict[str, Any]], cols: Sequence[str]
              ) -> tuple[list[str], list[list[Any]]]:
    """(cols, rows) of a list of dicts, by the given keys (missing keys empty)."""
    return list(cols), [[it.get(c) for c in cols] for it in items]
