"""Finding the runs under fleet roots, and what identifies each one's state.

A root is a directory, a shell-style glob of directories, or an object-store prefix. A run
is a directory (prefix) holding ``run.json``, at any depth (up to MAX_DEPTH); the search
does not enter a run (its sub-folders are its tables), follows no symlink, and skips
``_tracealyze`` (where the index lives) and hidden folders. A root is a stranger's data: an
entry the search cannot list or a run that cannot be read is one :class:`Skipped` line,
never an error that stops the others.

A run's **fingerprint** is a hash of its run files' names, sizes and modification times
(``run.json``, rank files, parts, traces: the format's names only). A flush adds a part, a
compaction replaces parts, a heartbeat rewrites a rank file, a status change rewrites
run.json: each changes the fingerprint, and nothing else is read to tell a run changed.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracealyze.format import storage

from ..errors import RunDirError
from .trust import base_of, link_below, under, utf8, wild

__all__ = ["INDEX_DIR", "MAX_DEPTH", "RunRef", "Skipped", "discover", "fingerprint", "shown",
           "under"]

INDEX_DIR = "_tracealyze"


@dataclass(frozen=True)
class RunRef:
    """One run found under a root: where it is, and its fingerprint."""

    path: str
    """The run directory (absolute local path) or its URL."""
    fingerprint: str


def fingerprint(files: Iterable[tuple[str, int, int | None]]) -> str:
    """Hash of ``(rel, size, mtime_ns)`` of a run's files, in name order."""
    h = hashlib.sha1(usedforsecurity=False)
    for rel, size, mtime in sorted(files):
        h.update(f"{rel}\t{size}\t{mtime}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


MAX_DEPTH = 64
"""Folders more than this many levels below a root are not searched (each such folder is
said, once, as skipped). Real layouts (team/user/project/date/run) are under 10 levels deep;
64 leaves ample room, and bounds what a planted chain of folders thousands deep costs."""
RUN_FILE_DEPTH = 3
"""Run files lie at most this many names deep in a run (``table/rank=N/part-....parquet``):
the fingerprint's walk goes no deeper, whatever a stranger nests inside a run."""


@dataclass(frozen=True)
class Skipped:
    """An entry under a root that is not analysed, and why (one line each)."""

    name: str
    """The entry's path, printable on one line (see :func:`shown`)."""
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.name, "reason": self.reason}


def shown(path: str | bytes) -> str:
    """``path`` as one printable line: bytes that are not UTF-8 as ``\\xNN`` and control
    characters as their escapes (a name may hold a newline, or bytes of another encoding)."""
    raw = path if isinstance(path, bytes) else os.fsencode(path)
    text = raw.decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _local_run_files(run: str) -> list[tuple[str, int, int]]:
    """The run files of the local run ``run`` with their size and mtime (no link followed;
    a file merged away while listed is simply not there)."""
    out = []
    stack = [("", run, 1)]
    while stack:
        rel_dir, path, depth = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            rel = f"{rel_dir}{e.name}"
            try:
                if e.is_dir(follow_symlinks=False):
                    if depth < RUN_FILE_DEPTH:
                        stack.append((rel + "/", e.path, depth + 1))
                elif e.is_file(follow_symlinks=False) and storage.run_file(rel) is not None:
                    st = e.stat(follow_symlinks=False)
                    out.append((rel, st.st_size, st.st_mtime_ns))
            except OSError:
                continue
    return out


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _local_runs(root: str, skipped: list[Skipped]) -> list[RunRef]:
    """The runs under the local folder ``root``: a walk with its own stack (no recursion: a
    folder tree thousands deep is data, not a crash), entering no link, no hidden folder and
    no index, at most MAX_DEPTH levels down. What cannot be searched or read is said in
    ``skipped``, and the walk goes on."""
    found = []
    stack = [(root, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError as e:
            skipped.append(Skipped(shown(path), f"cannot list it ({_why(e)})"))
            continue
        meta = next((e for e in entries if e.name == "run.json"), None)
        if meta is not None and not meta.is_dir(follow_symlinks=False):
            # a run's folders are its tables, never another run
            if meta.is_symlink() or not meta.is_file(follow_symlinks=False):
                skipped.append(Skipped(shown(path), "its run.json is not a regular file "
                                                    "(a link is never followed)"))
            elif not utf8(path):
                skipped.append(Skipped(shown(path), "its path is not valid UTF-8, which "
                                                    "DuckDB cannot read; rename it"))
            else:
                found.append(RunRef(path, fingerprint(_local_run_files(path))))
            continue
        subs = []
        for e in entries:
            if e.name == INDEX_DIR or e.name.startswith("."):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    subs.append(e.path)
            except OSError:
                continue
        if subs and depth >= MAX_DEPTH:
            skipped.append(Skipped(shown(path), f"more than {MAX_DEPTH} folders below the "
                                                "root: its sub-folders are not searched"))
            continue
        stack.extend((p, depth + 1) for p in sorted(subs, reverse=True))
    return found


def _store_runs(url: str) -> list[RunRef]:
    try:
        runs = storage.runs_under(url)
    except (OSError, ValueError) as e:
        raise RunDirError(f"cannot list {url}: {' '.join(str(e).split())[:300]}") from None
    return [RunRef(u, fingerprint((f.rel, f.size, f.mtime_ns) for f in files))
            for u, files in runs.items()]


def discover(roots: Sequence[str | Path], skipped: list[Skipped] | None = None
             ) -> list[RunRef]:
    """Every run under ``roots``, each once, sorted by path. RunDirError for a root that
    does not exist or cannot be listed (a root with no run in it is not an error). Entries
    that cannot be searched or analysed are appended to ``skipped`` (never an error)."""
    skipped = [] if skipped is None else skipped
    refs: dict[str, RunRef] = {}
    for root in roots:
        text = str(root)
        if storage.is_url(text):
            patterns = storage.expand(text) if any(c in text for c in "*?[") else [text]
            for u in patterns:
                for ref in _store_runs(u):
                    refs.setdefault(ref.path, ref)
            continue
        matches = sorted(glob.glob(text)) if wild(text) else [text]
        if not matches or not any(os.path.isdir(m) for m in matches):
            raise RunDirError(f"no such directory: {text}")
        base = base_of(text)
        for m in matches:
            if not os.path.isdir(m):
                continue
            if wild(text) and link_below(base, os.path.abspath(m)):
                # the pattern is the user's, what it matched a stranger's: no link followed
                skipped.append(Skipped(shown(m), "a symbolic link (never followed)"))
                continue
            for ref in _local_runs(os.path.abspath(m), skipped):
                refs.setdefault(ref.path, ref)
    return [refs[p] for p in sorted(refs)]
