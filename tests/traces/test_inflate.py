"""The background reader (:mod:`.ingest.inflate`) hands out exactly the bytes and SHA-1 that
``gzip`` gives, for single and multi-member files, zero padding and plain files; a broken
stream is one TraceError line; the thread stops when the reader is closed early; and the
ingest path does not import pandas (pyarrow does, from a few of its calls)."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracealyze.analyzer.errors import TraceError
from tracealyze.analyzer.ingest import inflate
from tracealyze.analyzer.ingest.reader import GuardedReader, Limits


def _read_all(path: Path, size: int = 1 << 20) -> tuple[bytes, str]:
    r = GuardedReader(path, Limits(max_ratio=None))
    try:
        out = []
        while data := r.read(size):
            out.append(data)
        return b"".join(out), r.sha.hexdigest()
    finally:
        r.close()


@settings(max_examples=30, deadline=None)
@given(members=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
       pad=st.sampled_from([0, 1, 512]), read=st.sampled_from([1, 7, 4096, 1 << 20]))
def test_gzip_members_and_padding_read_as_gzip_reads_them(members: list[bytes], pad: int,
                                                          read: int, tmp_path_factory) -> None:
    p = tmp_path_factory.mktemp("gz") / "t.json.gz"
    p.write_bytes(b"".join(gzip.compress(m) for m in members) + b"\0" * pad)
    data, sha = _read_all(p, read)
    assert data == gzip.decompress(p.read_bytes()) == b"".join(members)
    assert sha == hashlib.sha1(data).hexdigest()


def test_large_and_plain_files_in_pieces(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(inflate, "OUT_CHUNK", 1 << 16)  # many pieces per input block
    monkeypatch.setattr(inflate, "IN_CHUNK", 1 << 14)
    body = os.urandom(1 << 18) + b"{}" * (1 << 20)  # incompressible, then 1000x
    gz = tmp_path / "t.gz"
    gz.write_bytes(gzip.compress(body, 1))
    plain = tmp_path / "t.json"
    plain.write_bytes(body)
    for p in (gz, plain):
        data, sha = _read_all(p, 50_000)
        assert data == body and sha == hashlib.sha1(body).hexdigest()


@pytest.mark.parametrize("damage", ["truncated", "crc", "garbage after"])
def test_a_broken_gzip_stream_is_one_trace_error(damage: str, tmp_path: Path) -> None:
    good = gzip.compress(b'{"traceEvents": []}' * 1000)
    bad = {"truncated": good[:-12], "crc": good[:-8] + b"\0\0\0\0" + good[-4:],
           "garbage after": good + b"not gzip"}[damage]
    p = tmp_path / "t.json.gz"
    p.write_bytes(bad)
    with pytest.raises(TraceError, match="truncated or corrupt gzip") as e:
        _read_all(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises((OSError, EOFError, zlib.error)):
        gzip.decompress(bad)  # (what gzip itself says of the same bytes)


def test_closing_early_stops_the_thread(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(inflate, "OUT_CHUNK", 1 << 12)
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(os.urandom(1 << 20)))
    before = {t for t in threading.enumerate() if t.name == "tracealyze-inflate"}
    r = GuardedReader(p, Limits(max_ratio=None))
    r.read(10)  # the thread is now blocked on a full queue
    r.close()
    left = {t for t in threading.enumerate() if t.name == "tracealyze-inflate"} - before
    assert not left


def test_ingest_does_not_import_pandas_nor_pyarrow_compute(tmp_path: Path) -> None:
    trace = Path(__file__).parents[1] / "data" / "traces" / "gpu_sampled_rank0.json.gz"
    code = ("import sys; from pathlib import Path; "
            "from tracealyze.analyzer.ingest.stream import ingest; "
            f"ingest(Path({str(trace)!r}), Path({str(tmp_path / 'o.parquet')!r})); "
            "print('pandas' in sys.modules, 'pyarrow.compute' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    # pandas: 0.2-0.3 s of every import-trace when it is installed; pyarrow.compute: 30 ms
    # of wrappers and docstrings built for ~300 functions
    assert out == "False False"
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "o.parquet").num_rows > 0
