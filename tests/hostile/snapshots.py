"""What a case folder holds, before and after a command, and which changes are allowed."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .cases import Case

# ------------------------------------------------------------------------- snapshots


Entry = tuple[int, int, bool, bool]
"""(size, mtime_ns, is_link, is_dir) of one entry, never following a link."""


def snapshot(base: Path) -> dict[str, Entry]:
    """Every entry under ``base`` by relative path (os.walk's listing, followlinks=False),
    walked through folder descriptors with a stack of our own: os.walk recurses on 3.11 (a
    DEPTH-deep chain raises), and a path rebuilt from ``base`` at each level costs DEPTH²
    name lookups."""
    out: dict[str, Entry] = {}
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    stack = [("", os.open(base, flags))]
    while stack:
        rel, fd = stack.pop()
        try:
            with os.scandir(fd) as it:
                for e in it:
                    r = f"{rel}/{e.name}" if rel else e.name
                    st = e.stat(follow_symlinks=False)
                    link, folder = stat.S_ISLNK(st.st_mode), stat.S_ISDIR(st.st_mode)
                    out[r] = (0 if folder else st.st_size, st.st_mtime_ns, link, folder)
                    if folder:
                        with contextlib.suppress(OSError):
                            stack.append((r, os.open(e.name, flags, dir_fd=fd)))
        finally:
            os.close(fd)
    return out


def allowed(rel: str, after: Entry | None, before: Entry | None,
            declared: tuple[str, ...]) -> bool:
    """Whether a change at ``rel`` is one of the command's declared outputs: a declared
    file, anything under a declared folder (``.../``), the caches, or a plain folder on the
    way to a declared output (made, or its mtime moved by the output's rename)."""
    for d in (*declared, "cache/"):
        if rel == d.rstrip("/") or (d.endswith("/") and rel.startswith(d)):
            return True
    on_the_way = any(d.startswith(rel + "/") for d in declared)
    plain_dir = [e is None or (e[3] and not e[2]) for e in (before, after)]
    return on_the_way and after is not None and all(plain_dir)


def changes(before: dict[str, Entry], after: dict[str, Entry],
            declared: tuple[str, ...]) -> list[str]:
    out = []
    for rel in sorted(set(before) | set(after)):
        b, a = before.get(rel), after.get(rel)
        if b != a and not allowed(rel, a, b, declared):
            what = "created" if b is None else "removed" if a is None else "changed"
            out.append(f"{what} {rel!a}")
    return out


def remove_tree(path: Path) -> None:
    """``rm -rf path`` without recursion and in linear time (shutil.rmtree recurses on 3.11:
    a DEPTH-deep chain raises RecursionError): one folder descriptor open at a time, going
    down by name and back up through ``..``."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd, names = os.open(path, flags), []
    while True:
        sub = None
        with os.scandir(fd) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    sub = e.name
                    break
                os.unlink(e.name, dir_fd=fd)
        if sub is not None:
            nxt = os.open(sub, flags, dir_fd=fd)
            names.append(sub)
        elif names:
            nxt = os.open("..", flags, dir_fd=fd)
            os.rmdir(names.pop(), dir_fd=nxt)
        else:
            os.close(fd)
            break
        os.close(fd)
        fd = nxt
    os.rmdir(path)


@contextlib.contextmanager
def environment(case: Case) -> Iterator[None]:
    """The case's HOME and caches set, and its ``here`` the working directory (for callers
    without pytest's monkeypatch)."""
    old_env = {k: os.environ.get(k) for k in case.env()}
    old_cwd = os.getcwd()
    os.environ.update(case.env())
    os.chdir(case.here)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


