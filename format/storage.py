"""Run directories in object storage: ``s3://``, ``gs://`` (``gcs://``), ``az://``/``abfs://``
and ``file://`` URLs, through pyarrow's own filesystems.

pyarrow is already what reads and writes every part, and its filesystems (S3, GCS, Azure)
take credentials from each store's standard chain (environment, config files, instance
roles), the endpoint of an S3-compatible store (MinIO) from ``AWS_ENDPOINT_URL`` and a Cloud
Storage emulator's from ``STORAGE_EMULATOR_HOST`` (as Google's own client libraries): no
second client library, and no DuckDB extension downloaded at run time (machines may be
offline). Every request to a store ends within ``TRACEALYZE_STORE_TIMEOUT_S`` seconds
(default 20; :mod:`.storetime`): a frozen store is a one-line error, not a hang.

A run directory in a store is a prefix. What of it is run data is decided by the format's
names alone (:func:`run_file`): ``run.json``, ``ranks/rank=<r>.json``,
``<table>/rank=<r>/part-*.parquet`` and ``traces/rank=<r>/*.json[.gz]``. Any other key
under the prefix is ignored, and a key is never taken outside it: a listing comes from the
store (a stranger's), so each key is checked to lie under the prefix and to name one of those
files, segment by segment (no ``..``, no empty or absolute segment, no backslash).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .parts import PART_RE, RANK_DIR_RE, RANK_FILE_RE, SNAPSHOT_DIR, SNAPSHOT_RE
from .schema import TABLES

SCHEMES: dict[str, str] = {"s3": "s3", "gs": "gs", "gcs": "gs", "az": "abfs", "abfs": "abfs",
                           "abfss": "abfs", "file": "file"}
"""URL scheme -> the pyarrow filesystem that serves it."""

_URL_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_TRACE_RE = re.compile(r"^[^/\\]{1,255}\.json(\.gz)?$")


def is_url(text: object) -> bool:
    """Whether ``text`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(text, str) and _URL_RE.match(text) is not None


@dataclass(frozen=True)
class Location:
    """A run directory in a store: its URL, the filesystem and the root path in it."""

    url: str
    fs: Any  # pyarrow.fs.FileSystem
    root: str
    """The run's prefix in ``fs`` (``bucket/runs/x``), no trailing slash."""

    def path(self, rel: str) -> str:
        """The filesystem path of ``rel`` (a :func:`run_file` name) under the root."""
        if run_file(rel) is None and rel != "report.html":
            raise ValueError(f"not a run file: {rel!r}")
        return f"{self.root}/{rel}"


@dataclass(frozen=True)
class StoredFile:
    rel: str
    """The path under the run's prefix (checked by :func:`run_file`)."""
    size: int
    mtime_ns: int | None


def locate(url: str) -> Location:
    """The filesystem and root of ``url``, every request through it bounded
    (:mod:`.storetime`). ValueError for a URL this cannot serve (an unknown scheme, no
    bucket, a path with ``..``) or a bad ``TRACEALYZE_STORE_TIMEOUT_S``; OSError when the
    store refuses (TimeoutError when it does not answer)."""
    m = _URL_RE.match(url)
    if m is None:
        raise ValueError(f"not a URL: {url!r}")
    scheme = m.group(1).lower()
    if scheme not in SCHEMES:
        raise ValueError(f"unsupported storage URL scheme {scheme!r} in {url!r}; use one of "
                         f"{', '.join(s + '://' for s in SCHEMES)}")
    parts = urlsplit(url)
    if scheme != "file" and not parts.netloc:
        raise ValueError(f"no bucket in {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"a run URL takes no query or fragment: {url!r}")
    if any(seg in (".", "..") for seg in parts.path.split("/")):
        raise ValueError(f"'.' or '..' in the run URL {url!r}")
    from pyarrow import fs as pafs

    from . import storetime

    kind = SCHEMES[scheme]
    bound = storetime.timeout_s() if kind != "file" else 0.0
    try:
        special = (_gcs_emulator(kind, parts.netloc, parts.path, bound)
                   or _azure(kind, parts.netloc, parts.path))
        if special:
            filesystem, root = special
        elif kind == "s3":
            # in a worker thread: with no endpoint set, from_uri asks AWS for the bucket's
            # region on a client of its own, which takes no timeouts. (The error line comes
            # within the bound; the exit may still wait for that request: pyarrow's S3
            # shutdown waits for requests in flight.)
            filesystem, root = storetime.call(lambda: pafs.FileSystem.from_uri(url), bound,
                                              f"finding the region of {parts.netloc}")
        elif kind == "gs":
            filesystem, root = pafs.FileSystem.from_uri(
                f"{url}?retry_limit_seconds={storetime.gcs_retry_s(bound)}")
        else:
            filesystem, root = pafs.FileSystem.from_uri(url)
    except (ValueError, TypeError) as e:  # pyarrow: ArrowInvalid is a ValueError
        raise ValueError(f"cannot use {url!r}: {e}") from None
    if kind == "s3":
        filesystem = storetime.bounded_s3(filesystem, bound)
    elif kind in ("gs", "abfs"):
        filesystem = storetime.bounded(filesystem, bound, f"{scheme}://")
    return Location(url=url.rstrip("/"), fs=filesystem, root=root.rstrip("/"))


def _gcs_emulator(kind: str, bucket: str, path: str, bound: float
                  ) -> tuple[Any, str] | None:
    """A ``gs://`` URL served by a Cloud Storage emulator: Google's client libraries take its
    address from ``STORAGE_EMULATOR_HOST`` (``http://host:port`` or ``host:port``), with no
    credentials. None for any other URL or when the variable is unset."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if kind != "gs" or not host:
        return None
    from pyarrow import fs as pafs

    scheme, _, rest = host.rpartition("://")
    from .storetime import gcs_retry

    return (pafs.GcsFileSystem(endpoint_override=rest.rstrip("/"), scheme=scheme or "http",
                               anonymous=True, retry_time_limit=gcs_retry(bound)),
            f"{bucket}{path}")


def _azure(kind: str, netloc: str, path: str) -> tuple[Any, str] | None:
    """An ``az://`` or ``abfs[s]://`` URL: ``container@account.dfs.core.windows.net`` names
    the account; a bare ``container`` takes it from the environment, as Azure's own tools
    and fsspec's adlfs do: ``AZURE_STORAGE_CONNECTION_STRING`` (its AccountName, AccountKey
    and BlobEndpoint: an emulator such as Azurite), else ``AZURE_STORAGE_ACCOUNT_NAME`` and
    ``AZURE_STORAGE_ACCOUNT_KEY``. Without a key, pyarrow's default Azure credential chain
    (environment, managed identity, Azure CLI). None for any other URL."""
    if kind != "abfs":
        return None
    from pyarrow import fs as pafs

    if "@" in netloc:  # (pyarrow reads the account from the host; it knows abfs:// only)
        return pafs.FileSystem.from_uri(f"abfs://{netloc}{path}")
    conn = dict(kv.split("=", 1) for kv in os.environ.get(
        "AZURE_STORAGE_CONNECTION_STRING", "").split(";") if "=" in kv)
    account = conn.get("AccountName") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise ValueError("no Azure storage account: set AZURE_STORAGE_ACCOUNT_NAME (or "
                         "AZURE_STORAGE_CONNECTION_STRING), or name it in the URL "
                         "(abfs://container@account.dfs.core.windows.net/path)")
    kw: dict[str, str] = {"account_name": account}
    key = conn.get("AccountKey") or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    if key:
        kw["account_key"] = key
    endpoint = urlsplit(conn.get("BlobEndpoint", ""))
    if endpoint.netloc:
        kw |= {"blob_storage_authority": endpoint.netloc, "dfs_storage_authority":
               endpoint.netloc, "blob_storage_scheme": endpoint.scheme or "https",
               "dfs_storage_scheme": endpoint.scheme or "https"}
    return pafs.AzureFileSystem(**kw), f"{netloc}{path}"


def run_file(rel: str) -> str | None:
    """What kind of run file ``rel`` (a path under the run's prefix) is: ``meta``,
    ``rank_meta``, ``part``, ``trace`` or ``snapshot``; None for anything else (ignored)."""
    if not rel or "\\" in rel or "\x00" in rel or rel.startswith("/"):
        return None
    segs = rel.split("/")
    if any(s in ("", ".", "..") for s in segs):
        return None
    if segs == ["run.json"]:
        return "meta"
    if len(segs) == 2 and segs[0] == "ranks" and RANK_FILE_RE.match(segs[1]):
        return "rank_meta"
    if len(segs) == 3 and RANK_DIR_RE.match(segs[1]):
        if segs[0] in TABLES and PART_RE.match(segs[2]):
            return "part"
        if segs[0] == "traces" and _TRACE_RE.match(segs[2]):
            return "trace"
        if segs[0] == SNAPSHOT_DIR and SNAPSHOT_RE.match(segs[2]):
            return "snapshot"
    return None


def list_run(loc: Location) -> list[StoredFile]:
    """The run files under ``loc`` (one recursive listing), each checked by
    :func:`run_file`; keys that are not run files, or not under the prefix, are left out."""
    from pyarrow import fs as pafs

    prefix = loc.root + "/"
    out = []
    for info in loc.fs.get_file_info(pafs.FileSelector(loc.root, recursive=True,
                                                       allow_not_found=True)):
        if info.type != pafs.FileType.File or not info.path.startswith(prefix):
            continue
        rel = info.path[len(prefix):]
        if run_file(rel) is None:
            continue
        out.append(StoredFile(rel, int(info.size or 0), info.mtime_ns))
    if not out and "/" in loc.root and loc.url.split("://")[0] != "file":
        bucket = loc.root.split("/", 1)[0]  # an empty listing: is there a bucket at all?
        if loc.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"no such bucket: {bucket}")
    return sorted(out, key=lambda f: f.rel)


def has_run(files: list[StoredFile]) -> bool:
    """Whether a listing (:func:`list_run`) holds a run: its run.json."""
    return any(f.rel == "run.json" for f in files)


def fetch(loc: Location, f: StoredFile, dest: Any) -> None:
    """Object ``f`` into the local folder ``dest`` (a run directory), through a temporary
    name: a reader of ``dest`` never sees half a file. ``f.rel`` is a checked run-file name
    (:func:`run_file`: no ``..``, no absolute part), so the file stays under ``dest``."""
    import os
    from pathlib import Path

    target = Path(dest) / f.rel
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(read_bytes(loc, f.rel))
    os.replace(tmp, target)


def read_bytes(loc: Location, rel: str) -> bytes:
    """The whole object ``rel`` under ``loc``."""
    with loc.fs.open_input_stream(loc.path(rel)) as f:
        return bytes(f.read())


def write_bytes(loc: Location, rel: str, data: bytes) -> None:
    """Write ``data`` as the object ``rel`` under ``loc``: visible under its final name only
    once the upload completed (one PUT, or a completed multipart upload): the commit point
    of an object store, where there is no rename."""
    with loc.fs.open_output_stream(loc.path(rel)) as f:
        f.write(data)


def delete(loc: Location, rel: str) -> None:
    """Remove the object ``rel`` (a part merged away); gone already is fine."""
    try:
        loc.fs.delete_file(loc.path(rel))
    except FileNotFoundError:
        pass


def local_files(folder: Any) -> dict[str, tuple[int, int]]:
    """The run files of a local run directory (``rel -> (size, mtime_ns)``), by the same
    names as :func:`list_run`; links are not followed, temporary files not listed."""
    import os
    from pathlib import Path

    root = Path(folder)
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if run_file(rel) is None:
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # merged away while listed
                continue
            if not os.path.islink(path):
                out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def expand(pattern: str) -> list[str]:
    """The run URLs a wildcard URL names (``s3://bucket/sweep/lr-*``): every prefix that
    matches ``pattern`` segment by segment (``*``, ``?``, ``[...]``; never across ``/``)
    and holds a ``run.json``, sorted. One recursive listing from the last segment without a
    wildcard. A pattern without wildcards is returned as it is."""
    import fnmatch

    from pyarrow import fs as pafs

    if not any(ch in pattern for ch in "*?["):
        return [pattern]
    scheme, rest = pattern.split("://", 1)
    segs = rest.rstrip("/").split("/")
    fixed = next(i for i, seg in enumerate(segs) if any(ch in seg for ch in "*?["))
    if fixed == 0:
        raise ValueError(f"a wildcard in the bucket of {pattern!r}")
    loc = locate(f"{scheme}://{'/'.join(segs[:fixed])}")
    want = segs[fixed:]
    found = set()
    for info in loc.fs.get_file_info(pafs.FileSelector(loc.root, recursive=True,
                                                       allow_not_found=True)):
        rel = info.path[len(loc.root) + 1:].split("/")
        if rel[-1] == "run.json" and len(rel) == len(want) + 1 and all(
                fnmatch.fnmatchcase(a, b) for a, b in zip(rel[:-1], want, strict=True)):
            found.add(f"{loc.url}/{'/'.join(rel[:-1])}")
    return sorted(found)


def runs_under(url: str) -> dict[str, list[StoredFile]]:
    """Every run under the prefix ``url`` at any depth, from one recursive listing: the
    run's URL -> its run files (checked by :func:`run_file` against the run's own prefix).
    A run is a prefix holding ``run.json``; runs are not nested (a run's files are never
    searched for another run), and a folder named ``_tracealyze`` (an index) is skipped."""
    from pyarrow import fs as pafs

    loc = locate(url)
    prefix = loc.root + "/"
    listing = [(info.path[len(prefix):], info) for info in loc.fs.get_file_info(
        pafs.FileSelector(loc.root, recursive=True, allow_not_found=True))
        if info.type == pafs.FileType.File and info.path.startswith(prefix)]

    def owner(segs: list[str], kept: dict[str, list[StoredFile]]) -> str | None:
        """The shortest kept run prefix among ``segs``' ancestors (O(depth))."""
        return next((a for a in ("/".join(segs[:i]) for i in range(len(segs)))
                     if a in kept), None)

    runs: dict[str, list[StoredFile]] = {}
    for rel in sorted((rel for rel, _ in listing if rel.split("/")[-1] == "run.json"),
                      key=lambda r: r.count("/")):
        segs = rel.split("/")[:-1]
        if any(seg in ("", ".", "..") or "\\" in seg for seg in segs):
            continue  # a stranger's key that would climb or fold: never a run prefix
        if "_tracealyze" not in segs and owner(segs, runs) is None:
            runs["/".join(segs)] = []
    for rel, info in listing:
        segs = rel.split("/")
        r = owner(segs, runs)
        inner = rel[len(r) + 1:] if r else rel
        if r is not None and run_file(inner) is not None:
            runs[r].append(StoredFile(inner, int(info.size or 0), info.mtime_ns))
    base = loc.url.rstrip("/")
    return {(f"{base}/{r}" if r else base): sorted(fs_, key=lambda f: f.rel)
            for r, fs_ in runs.items()}
