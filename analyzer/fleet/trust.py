"""Which run paths belong to a fleet's roots. The roots are the user's; what lies under them,
the index included, is strangers' data. A path an index row names is read only when it lies
under a root of the command, without a symbolic link between the root and the run (a link
would take the read to a run, or any folder, elsewhere: ``/etc``, another user's runs)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tracealyze.format import storage


def wild(text: str) -> bool:
    """Whether a root is a glob pattern."""
    return any(c in text for c in "*?[")


def fixed(text: str) -> str:
    """The part of a root before its first wildcard's segment (the root itself if none)."""
    if not wild(text):
        return text.rstrip("/")
    cut = min(i for i in (text.find(c) for c in "*?[") if i >= 0)
    return text[:cut].rsplit("/", 1)[0]


def base_of(root: str | Path) -> str:
    """The folder (or prefix) every run under ``root`` lies in, as text."""
    text = str(root)
    return fixed(text) if storage.is_url(text) else os.path.abspath(fixed(text) or ".")


def under(path: str, roots: Sequence[str | Path]) -> bool:
    """Whether the run ``path`` lies under one of ``roots``, by its text (an index row of a
    run no longer found there is dropped; rows of runs under other roots are kept)."""
    for root in roots:
        if storage.is_url(str(root)) != storage.is_url(path):
            continue
        base = base_of(root)
        if path == base or path.startswith(base.rstrip("/") + "/"):
            return True
    return False


def utf8(path: str) -> bool:
    """Whether ``path`` (as the OS gave it: surrogate escapes for undecodable bytes) is UTF-8
    text: DuckDB and Parquet take paths as UTF-8, so a run elsewhere cannot be read."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def link_below(base: str, path: str, real: str | None = None) -> bool:
    """Whether the local ``path`` (under ``base``) goes through a symbolic link below
    ``base``: its real path is not the base's real path (``real``, when known) followed by
    the same names. The base itself is the user's: a link there is theirs to make."""
    rel = os.path.relpath(path, base)
    real = os.path.realpath(base) if real is None else real
    want = real if rel == "." else os.path.join(real, rel)
    return os.path.realpath(path) != want


class Roots:
    """The roots of a command, to check the paths an index names against."""

    def __init__(self, roots: Sequence[str | Path]) -> None:
        self.roots = [str(r) for r in roots]
        self._real = {r: os.path.realpath(base_of(r)) for r in self.roots
                      if not storage.is_url(r)}

    def why_not(self, path: object) -> str | None:
        """None when ``path`` is a run path this command may read; else why not."""
        if not isinstance(path, str) or not path:
            return "no path"
        if "\0" in path or not utf8(path):
            return "not a path DuckDB can read (NUL, or not UTF-8)"
        url = storage.is_url(path)
        for root in self.roots:
            if storage.is_url(root) != url:
                continue
            base = base_of(root)
            if not (path == base or path.startswith(base.rstrip("/") + "/")):
                continue
            if url:
                segs = path[len(base):].split("/")[1:]
                if any(s in ("", ".", "..") or "\\" in s for s in segs):
                    return "a URL that climbs out of its root"
                return None
            if path != os.path.normpath(path) or not os.path.isabs(path):
                return "not a plain absolute path"
            if link_below(base, path, self._real[root]):
                return "it goes through a symbolic link"
            return None
        return "not under the roots"
