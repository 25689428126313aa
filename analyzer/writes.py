"""Every file the analyzer writes is created here, and nowhere else (a structure test says so).

The analyzer reads run directories and fleet roots that strangers made. A stranger can plant a
symbolic link at any name the analyzer might create (``.report.html.<pid>.tmp``, a
``_tracealyze`` folder, a ``.lock``) and wait for the analyzer to write through it. The rules
below make that impossible by construction rather than by checking names one by one:

- **Directories are opened, not named.** :class:`Dir` holds a descriptor opened with
  ``O_DIRECTORY | O_NOFOLLOW``; every file below it is reached relative to that descriptor
  (``dir_fd``), each sub-folder again with ``O_NOFOLLOW``. A folder swapped for a link after
  it was opened changes nothing: the descriptor still names the folder that was checked.
  The path the *user* typed (``-o out/report.html``, ``--index PATH``) is theirs: its
  folders are taken as they are, links included; what is created inside is guarded, and the
  file name itself is never a link.
- **Temporary files are new files.** ``O_CREAT | O_EXCL | O_NOFOLLOW`` with a random name
  (never a pid, which an attacker can guess): a planted name makes the create fail, never
  write elsewhere.
- **A destination is replaced atomically, and never through a link.** Data goes to the
  temporary file, is flushed to disk, then renamed over the destination; a destination that
  is a link (or a folder, or anything but a regular file) is refused.
- **Publishing without replacing.** :meth:`Dir.publish` puts a file under a name only if the
  name is free (``link(2)`` fails on an existing name): an ``import-trace`` part never lands
  on another part.
- **Locks** are opened with ``O_NOFOLLOW`` (a planted ``.lock`` link is refused).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import TracealyzeError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
"""How every folder the analyzer writes into is opened."""
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC | _BINARY
"""How every file the analyzer writes is created: a new file, never through a link."""


class OutputError(TracealyzeError):
    """The analyzer refused (or failed) to write where it was asked: one line for the CLI."""


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def tmp_name(name: str) -> str:
    """A fresh, unguessable temporary name beside ``name`` (hidden, so no reader lists it)."""
    return f".{name}.{secrets.token_hex(8)}.tmp"


def _check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name or \
            (os.altsep and os.altsep in name):
        raise OutputError(f"refusing to write a file named {name!r}")
    return name


class Dir:
    """A directory opened without following links; files below it are reached through its
    descriptor only. Use as a context manager (or call :meth:`close`)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, create: bool = False, follow: bool = True) -> Dir:
        """The folder ``path``, which the user named: taken as it is, links included (made
        with its parents when ``create``); with ``follow=False`` the folder itself must not
        be a link. What lies inside is reached only through :meth:`sub`, never followed."""
        path = Path(path)
        if create:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(path, 0o777)
            except FileExistsError:
                pass
            except OSError as e:
                raise OutputError(f"cannot create {path}: {_why(e)}") from None
        try:
            fd = os.open(path, DIR_FLAGS if not follow else DIR_FLAGS & ~_NOFOLLOW)
        except OSError as e:
            raise OutputError(f"cannot write into {path}: " + (
                "it is a symbolic link" if os.path.islink(path) else _why(e))) from None
        return cls(fd, path)

    def sub(self, name: str, *, create: bool = True, mode: int = 0o777) -> Dir:
        """The folder ``name`` inside this one (made when missing and ``create``); a link
        there is refused, never followed."""
        _check_name(name)
        if create:
            try:
                os.mkdir(name, mode, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as e:
                raise OutputError(f"cannot create {self.path / name}: {_why(e)}") from None
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError as e:
            # (O_DIRECTORY|O_NOFOLLOW on a link fails with ENOTDIR on Linux, ELOOP elsewhere)
            link = self.kind(name) == "link"
            raise OutputError(f"refusing to write into {self.path / name}: " + (
                "it is a symbolic link" if link else _why(e))) from None
        return Dir(fd, self.path / name)

    def walk(self, *names: str, create: bool = True) -> Dir:
        """``sub`` for each of ``names`` in turn (the intermediate folders are closed)."""
        d: Dir = self
        for name in names:
            nxt = d.sub(name, create=create)
            if d is not self:
                d.close()
            d = nxt
        return d if d is not self else Dir(os.dup(self.fd), self.path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading what we wrote -----------------------------------------------------------
    def kind(self, name: str) -> str | None:
        """``"file"``, ``"dir"``, ``"link"``, ``"other"`` or None (absent), never following."""
        try:
            st = os.stat(_check_name(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise OutputError(f"cannot read {self.path / name}: {_why(e)}") from None
        if stat.S_ISLNK(st.st_mode):
            return "link"
        return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) \
            else "other"

    def mtime(self, name: str) -> float | None:
        """The modification time of the regular file ``name``; None if it is not one."""
        try:
            st = os.stat(_check_name(name), dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return None
        return st.st_mtime if stat.S_ISREG(st.st_mode) else None

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """The regular file ``name`` (at most ``limit`` bytes, else None); None when absent,
        a link or not a regular file."""
        try:
            fd = os.open(_check_name(name), os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _BINARY,
                         dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = fh.read(limit + 1)
        return data if len(data) <= limit else None

    def files(self) -> list[tuple[str, int, float]]:
        """``(name, size, mtime)`` of the regular files in this folder (links and folders
        left out, never followed)."""
        out = []
        with os.scandir(self.fd) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        out.append((e.name, st.st_size, st.st_mtime))
                except OSError:
                    continue
        return out

    def mark_used(self, name: str) -> None:
        """Set the regular file ``name``'s modification time to now (a cache entry read
        again: the last to be evicted). Never through a link; absent is fine."""
        with contextlib.suppress(OSError):
            if self.kind(name) == "file":
                os.utime(name, dir_fd=self.fd, follow_symlinks=False)

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def new_file(self, name: str, mode: int = 0o644, *, durable: bool = True
                 ) -> Iterator[tuple[str, IO[bytes]]]:
        """A new temporary file beside ``name`` (``O_EXCL | O_NOFOLLOW``, random name):
        ``(its name, a binary file)``, flushed to disk at the end of the block when
        ``durable`` (a cache that can be fetched again need not be). Removed again if the
        block raises."""
        tmp = tmp_name(_check_name(name))
        try:
            fd = os.open(tmp, NEW_FILE_FLAGS, mode, dir_fd=self.fd)
        except OSError as e:
            raise OutputError(f"cannot write into {self.path}: {_why(e)}") from None
        try:
            with os.fdopen(fd, "wb") as fh:
                yield tmp, fh
                fh.flush()
                if durable:
                    os.fsync(fh.fileno())  # on disk before the rename makes it visible
        except BaseException as e:
            self._discard(tmp)
            if isinstance(e, OSError):  # (a full disk, a quota: one line, not a traceback)
                raise OutputError(f"cannot write {self.path / name}: {_why(e)}") from None
            raise

    def _discard(self, tmp: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=self.fd)

    def _refuse_unless_file(self, name: str) -> None:
        kind = self.kind(name)
        if kind not in (None, "file"):
            what = "a symbolic link" if kind == "link" else "a folder" if kind == "dir" \
                else "not a regular file"
            raise OutputError(f"refusing to write over {self.path / name}: it is {what}")

    def write_atomic(self, name: str, data: bytes | str, *, mode: int = 0o644,
                     durable: bool = True) -> Path:
        """Replace (or create) the regular file ``name`` with ``data``, atomically: a reader
        sees the old file or the new, never half of one. A link there is refused."""
        blob = data.encode("utf-8") if isinstance(data, str) else data
        self._refuse_unless_file(name)
        with self.new_file(name, mode, durable=durable) as (tmp, fh):
            fh.write(blob)
        self._rename(tmp, name)
        return self.path / name

    def _rename(self, tmp: str, name: str) -> None:
        try:
            # rename(2) replaces the name itself: it never writes through a link there (and
            # one planted since the check above is what gets replaced, not its target)
            self._refuse_unless_file(name)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException as e:
            self._discard(tmp)
            if isinstance(e, OSError):
                raise OutputError(f"cannot write {self.path / name}: {_why(e)}") from None
            raise

    def copy_atomic(self, name: str, src: str | Path, *, mode: int = 0o644) -> Path:
        """``write_atomic`` with the bytes of the local file ``src`` (streamed)."""
        self._refuse_unless_file(name)
        with self.new_file(name, mode) as (tmp, fh), open(src, "rb") as f:
            while chunk := f.read(1 << 20):
                fh.write(chunk)
        self._rename(tmp, name)
        return self.path / name

    def publish(self, name: str, src: str | Path) -> bool:
        """Put the complete local file ``src`` (one of our own, e.g. a staged part) under
        ``name`` only if no entry has that name: False when the name is taken. ``link(2)``
        makes it visible whole and fails with EEXIST where ``rename(2)`` would replace; a
        hard link of ``src`` itself when it is on the same file system, else a copy."""
        _check_name(name)
        try:
            os.link(src, name, dst_dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise OutputError(f"cannot write {self.path / name}: {_why(e)}") from None
        with self.new_file(name) as (tmp, fh), open(src, "rb") as f:
            while chunk := f.read(1 << 20):
                fh.write(chunk)
        try:
            os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
        except FileExistsError:
            return False
        except OSError as e:
            raise OutputError(f"cannot write {self.path / name}: {_why(e)}") from None
        finally:
            self._discard(tmp)
        return True

    def open_update(self, name: str, mode: int = 0o600) -> IO[bytes]:
        """The regular file ``name`` opened for reading and writing in place (made if
        missing, never truncated, never through a link): a cache filled piece by piece."""
        try:
            fd = os.open(_check_name(name), os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC
                         | _BINARY, mode, dir_fd=self.fd)
        except OSError as e:
            raise OutputError(f"cannot write {self.path / name}: {_why(e)}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(f"cannot write {self.path / name}: not a regular file")
        return os.fdopen(fd, "r+b")

    def remove(self, name: str) -> None:
        """Remove the regular file (or link) ``name`` inside this folder; absent is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_check_name(name), dir_fd=self.fd)

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Hold an exclusive lock on the file ``name`` (made if missing, never through a
        link) for the block."""
        import fcntl

        try:
            fd = os.open(_check_name(name), os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC,
                         0o600, dir_fd=self.fd)
        except OSError as e:
            raise OutputError(f"cannot lock {self.path / name}: " + (
                "it is a symbolic link" if e.errno in (errno.ELOOP, errno.EMLINK)
                else _why(e))) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OutputError(f"cannot lock {self.path / name}: not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes
            yield
        finally:
            os.close(fd)


def write_file(path: str | Path, data: bytes | str, *, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` (a file the user named) atomically: its folder is made if
    missing; the file itself must not be a link or a folder."""
    path = Path(path)
    _check_name(path.name)
    with Dir.open(path.parent, create=True) as d:
        d.write_atomic(path.name, data, mode=mode)
    return path


def open_path(base: str | Path, rel: str, *, create: bool = True) -> Dir:
    """The folder ``base/rel``: ``base`` (ours, or the user's) as it is, every folder of
    ``rel`` (``a/b/c``, names checked) opened without following links."""
    with Dir.open(base, create=create) as d:
        return d.walk(*[x for x in rel.split("/") if x], create=create)


def private_dir(parent: str | Path | None = None, prefix: str = "tracealyze-") -> Path:
    """A new folder of our own (mode 0700, random name; ``mkdtemp``'s guarantees)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix=prefix, dir=None if parent is None else str(parent)))


def remove_tree(path: str | Path) -> None:
    """Remove a folder this command made (``shutil.rmtree`` never follows links in it)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def stdout_to_devnull() -> None:
    """Point the process's stdout at the null device (``os.devnull``, opened write-only, no
    file created): after the reader of a pipe has gone, so that the interpreter's last
    flush does not fail again. Errors are ignored (stdout may already be closed)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


__all__: list[Any] = ["DIR_FLAGS", "NEW_FILE_FLAGS", "Dir", "OutputError", "open_path",
                      "private_dir", "remove_tree", "stdout_to_devnull", "tmp_name",
                      "write_file"]

