"""Finding the runs under fleet roots, and what identifies each one's state.

A root is a directory, a shell-style glob of directories, or an object-store prefix. A run
is a directory (prefix) holding ``run.json``, at any depth; the search does not enter a run
(its sub-folders are its tables), follows no symlink, and skips ``_tracealyze`` (where the
index lives) and hidden folders.

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


def _local_run_files(run: str) -> list[tuple[str, int, int]]:
    """The run files of the local run ``run`` with their size and mtime (no link followed;
    a file merged away while listed is simply not there)."""
    out = []
    stack = [("", run)]
    while stack:
        rel_dir, path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for e in entries:
            rel = f"{rel_dir}{e.name}"
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append((rel + "/", e.path))
                elif e.is_file(follow_symlinks=False) and storage.run_file(rel) is not None:
                    st = e.stat(follow_symlinks=False)
                    out.append((rel, st.st_size, st.st_mtime_ns))
            except OSError:
                continue
    return out


def _local_runs(root: str) -> list[RunRef]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if "run.json" in filenames:
            dirnames[:] = []  # a run's folders are its tables, never another run
            found.append(RunRef(dirpath, fingerprint(_local_run_files(dirpath))))
            continue
        dirnames[:] = sorted(d for d in dirnames if d != INDEX_DIR and not d.startswith(".")
                             and not os.path.islink(os.path.join(dirpath, d)))
    return found


def _store_runs(url: str) -> list[RunRef]:
    try:
        runs = storage.runs_under(url)
    except (OSError, ValueError) as e:
        raise RunDirError(f"cannot list {url}: {' '.join(str(e).split())[:300]}") from None
    return [RunRef(u, fingerprint((f.rel, f.size, f.mtime_ns) for f in files))
            for u, files in runs.items()]


def discover(roots: Sequence[str | Path]) -> list[RunRef]:
    """Every run under ``roots``, each once, sorted by path. RunDirError for a root that
    does not exist or cannot be listed (a root with no run in it is not an error)."""
    refs: dict[str, RunRef] = {}
    for root in roots:
        text = str(root)
        if storage.is_url(text):
            patterns = storage.expand(text) if any(c in text for c in "*?[") else [text]
            for u in patterns:
                for ref in _store_runs(u):
                    refs.setdefault(ref.path, ref)
            continue
        matches = sorted(glob.glob(text)) if _wild(text) else [text]
        if not matches or not any(os.path.isdir(m) for m in matches):
            raise RunDirError(f"no such directory: {text}")
        for m in matches:
            if os.path.isdir(m):
                for ref in _local_runs(os.path.abspath(m)):
                    refs.setdefault(ref.path, ref)
    return [refs[p] for p in sorted(refs)]


def _wild(text: str) -> bool:
    return any(c in text for c in "*?[")


def _fixed(text: str) -> str:
    """The part of a root before its first wildcard's segment (the root itself if none)."""
    if not _wild(text):
        return text.rstrip("/")
    cut = min(i for i in (text.find(c) for c in "*?[") if i >= 0)
    return text[:cut].rsplit("/", 1)[0]


def under(path: str, roots: Sequence[str | Path]) -> bool:
    """Whether the run ``path`` lies under one of ``roots`` (an index row of a run no longer
    found there is dropped; rows of runs under other roots are kept)."""
    for root in roots:
        text = str(root)
        if storage.is_url(text) != storage.is_url(path):
            continue
        base = _fixed(text) if storage.is_url(text) else os.path.abspath(_fixed(text) or ".")
        if path == base or path.startswith(base.rstrip("/") + "/"):
            return True
    return False
