"""Exceptions of the analyzer: one base class, one subclass per area.

Library code raises these (chained with ``from`` where there is a cause); the CLI turns them
into one line on stderr and exit code 2. Nothing below the CLI prints or exits.
"""

from __future__ import annotations


class TracealyzeError(Exception):
    """Base class of every error the analyzer raises on purpose."""


class RunDirError(TracealyzeError):
    """The path is missing, is not a run directory, or its run.json is unreadable."""


class StoreError(RunDirError):
    """The object store holding a run did not answer a read (down, refusing): the command
    fails; the data is not at fault."""


class SchemaVersionError(RunDirError):
    """The run was written by a newer recorder than this analyzer understands."""


class QueryError(TracealyzeError):
    """A user SQL statement failed (syntax, unknown table or column, ...)."""


class ConfigError(TracealyzeError):
    """A threshold override or config file is invalid."""


class TraceError(TracealyzeError):
    """A profiler trace could not be read or is not a Chrome/Kineto trace."""


class ReportError(TracealyzeError):
    """The HTML report could not be produced."""


def one_line(e: BaseException) -> str:
    """DuckDB messages span lines (LINE 1: ... ^); keep the informative first line. An
    error raised in Python under DuckDB (a part read in place: run.inplace) comes as a
    traceback: its last line says what went wrong."""
    text = str(e).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    return lines[-1] if lines[0].startswith("Traceback (most recent call last)") else lines[0]
