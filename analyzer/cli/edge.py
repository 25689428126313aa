"""The CLI's edge: library errors become one line and exit 2 here, and nowhere else; the
run-directory parameter type. Shared by every command module of the package."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from tracealyze.format.storage import is_url

F = TypeVar("F", bound=Callable[..., Any])

EXIT_FAIL_ON = 1
EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    """One line on stderr, exit 2 (DESIGN.md: usage error, bad input or SQL error)."""

    exit_code = EXIT_BAD_INPUT


def reader_gone() -> NoReturn:
    """The reader of stdout stopped reading (``tracealyze tables RUN | head``): exit 0,
    quietly, as a pager's or ``head``'s user expects. stdout is pointed at /dev/null first,
    so that the interpreter's own flush at exit does not fail a second time (the recipe of
    Python's ``signal`` documentation, without restoring SIGPIPE's default, which would kill
    the process in the middle of writing a file)."""
    from ..writes import stdout_to_devnull

    stdout_to_devnull()
    raise SystemExit(0)


def edge(fn: F) -> F:
    """Turn library errors into :class:`BadInput` (no traceback); a closed stdout pipe into
    a quiet exit 0 (:func:`reader_gone`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..errors import TracealyzeError

        try:
            out = fn(*args, **kwargs)
            sys.stdout.flush()  # (a closed pipe shows here, not at the interpreter's exit)
            return out
        except BrokenPipeError:
            reader_gone()
        except TracealyzeError as e:
            raise BadInput(" ".join(str(e).split())) from e
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"{type(e).__name__}: {e}") from e
        except Exception as e:
            # Data the run's files hold that DuckDB cannot convert: bad input, not a bug.
            if type(e).__module__.lstrip("_").startswith("duckdb") or type(e).__name__.endswith(
                    "ConversionException"):
                raise BadInput(f"cannot read the run's data: {' '.join(str(e).split())[:300]}"
                               ) from e
            raise

    return wrapper  # type: ignore[return-value]


class RunLocation(click.ParamType):
    """A run directory: a path, or a URL kept as text (``Path`` folds ``s3://b`` to ``s3:/b``)."""

    name = "RUN_DIR"

    def convert(self, value: Any, param: Any, ctx: Any) -> Path | str:
        return str(value) if is_url(value) else Path(value)


RUN_DIR = RunLocation()


class FailOn(click.ParamType):
    """``--fail-on``: a severity (warning, error, critical) or a finding id (a former id
    such as ``cuda_fragmentation`` is accepted for one release)."""

    name = "SEVERITY|FINDING"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from ..diagnosis.findings import FINDING_IDS, canonical_id

        text = str(value)
        if text in ("warning", "error", "critical"):
            return text
        fid = canonical_id(text)
        if fid is None:
            self.fail(f"{text!r} is neither a severity (warning, error, critical) nor a "
                      f"finding id ({', '.join(FINDING_IDS)})", param, ctx)
        return fid


FAIL_ON = FailOn()
