"""Every request to an object store ends within ``TRACEALYZE_STORE_TIMEOUT_S`` (default 20 s):
a store that accepts connections and never answers (a frozen server on 127.0.0.1, in the
test) is a one-line error within the bound, for the analyzer and for the recorder's first
check of its URL, on ``s3://``, ``gs://`` and ``az://`` alike. Before, S3 took ~100 s (pyarrow's
client as ``from_uri`` makes it: 31 tries of 3 s), GCS and Azure minutes."""

from __future__ import annotations

import gzip
import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracealyze.analyzer.cli import main
from tracealyze.format import spool, storage, storetime

from tests.runfactory import make_run

BOUND = 2.0
# Azurite's fixed development account key: published in its documentation, not a secret
AZ_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture()
def frozen() -> Iterator[str]:
    """``http://127.0.0.1:PORT``: accepts connections, reads nothing, never answers. Its
    thread looks for a stop every 0.1 s; every socket is closed at the end."""
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for s in [*held, server]:
            s.close()


@pytest.fixture()
def stores(frozen: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """A run URL per store kind, each store reached at the frozen server, as its users set
    it up (S3's AWS_* variables, a GCS emulator's host, an Azure connection string)."""
    for k, v in {"AWS_ENDPOINT_URL": frozen, "AWS_ACCESS_KEY_ID": "test",
                 "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                 "STORAGE_EMULATOR_HOST": frozen,
                 "AZURE_STORAGE_CONNECTION_STRING": (
                     f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                     f"AccountKey={AZ_KEY};BlobEndpoint={frozen}/devstoreaccount1;"),
                 storetime.ENV: f"{BOUND:g}",
                 "TRACEALYZE_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    return {"s3": "s3://bucket/run", "gs": "gs://bucket/run", "az": "az://container/run"}


@pytest.mark.parametrize("kind", ["s3", "gs", "az"])
def test_a_frozen_store_is_one_line_and_exit_2_within_the_bound(
        stores: dict[str, str], kind: str, tmp_path: Path) -> None:
    warm = CliRunner().invoke(main, ["summary", str(make_run(tmp_path))])  # (imports, once)
    assert warm.exit_code == 0, warm.output
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["summary", stores[kind]])
    took = time.monotonic() - t0
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert f"cannot read {stores[kind]}" in res.stderr
    assert "timeout" in res.stderr.lower() or f"did not answer within {BOUND:g} s" in res.stderr
    assert took < 2 * BOUND, f"{took:.1f} s"


@pytest.mark.parametrize("kind", ["s3", "gs", "az"])
def test_the_recorder_is_told_of_a_frozen_store_within_the_bound(
        stores: dict[str, str], kind: str, tmp_path: Path) -> None:
    """Recorder(url) checks its URL at construction (spool.open_store): a ValueError within
    the bound, not a training that hangs before its first step."""
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=f"cannot record to {stores[kind]}"):
        spool.open_store(stores[kind], False, tmp_path / "spool")
    assert time.monotonic() - t0 < 2 * BOUND


def test_the_uploader_gives_up_a_try_within_the_bound_and_keeps_the_run(
        stores: dict[str, str], tmp_path: Path) -> None:
    """The recorder's uploads are retried in the background as before; a frozen store now
    costs one bounded try each time, and the run stays in the spool."""
    folder = make_run(tmp_path, name="spool")
    events: list[str] = []
    t0 = time.monotonic()
    up = spool.Uploader(folder, storage.locate(stores["s3"]), interval_s=3600.0,
                        on_event=lambda kind, *_: events.append(kind))
    while not events and time.monotonic() - t0 < 4 * BOUND:
        time.sleep(0.05)
    assert events == ["storage_unavailable"] and up.failures >= 1  # (said once)
    assert time.monotonic() - t0 < 2 * BOUND
    assert up.close(timeout_s=0.1) is False  # (one more bounded try, then the spool is kept)
    assert time.monotonic() - t0 < 4 * BOUND and (folder / "run.json").is_file()


@pytest.mark.parametrize("text", ["abc", "0", "-5", "1", "nan", "inf", "1e9", "20 s"])
def test_a_bad_bound_is_one_line(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(storetime.ENV, text)
    with pytest.raises(ValueError, match=storetime.ENV):
        storage.locate("s3://bucket/run")
    res = CliRunner().invoke(main, ["summary", "s3://bucket/run"])
    assert res.exit_code == 2 and storetime.ENV in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_bound_is_20_s_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(storetime.ENV, raising=False)
    assert storetime.timeout_s() == 20.0
    monkeypatch.setenv(storetime.ENV, " 7.5 ")
    assert storetime.timeout_s() == 7.5


@pytest.mark.parametrize("bound", [2, 2.5, 3, 5, 7.9, 10, 12.99, 20, 60, 3600])
def test_s3_tries_fit_in_the_bound(bound: float) -> None:
    """Tries × (connect + read timeout) + the standard strategy's back-offs (up to 1 s, then
    2 s) stay within the bound, each try with at least a second to connect and to answer;
    at the default, the AWS default of 3 tries, each with the SDK's own 3 s read timeout."""
    attempts, connect, read = storetime.s3_settings(bound)
    backoffs = 2 ** (attempts - 1) - 1
    assert attempts * (connect + read) + backoffs <= bound + 1e-9
    assert connect >= 1.0 and read >= 1.0 and 1 <= attempts <= 3
    if bound == 20:
        assert attempts == 3 and math.isclose(read, 3.0)


def test_the_bounded_wrapper_reads_and_writes_as_the_store_does(tmp_path: Path) -> None:
    """GCS and Azure are reached through the wrapper: a transfer of several chunks, ranged
    reads, listings, a missing file, and ``.gz`` compressed once (by the outer filesystem,
    as pyarrow does for the store's own filesystem), on a local filesystem wrapped alike."""
    from pyarrow import fs as pafs

    inner = pafs.LocalFileSystem()
    fs = storetime.bounded(inner, 5.0, "test://")
    data = bytes(range(256)) * (3 * storetime.CHUNK // 256 + 7)  # 3 chunks and a bit
    base = tmp_path.as_posix()
    with fs.open_output_stream(f"{base}/part.bin") as f:
        f.write(data)
    with fs.open_output_stream(f"{base}/t.json.gz") as f:
        f.write(b'{"traceEvents": []}')
    assert (tmp_path / "part.bin").read_bytes() == data
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == b'{"traceEvents": []}'
    with fs.open_input_stream(f"{base}/part.bin") as f:
        assert f.read() == data
    with fs.open_input_stream(f"{base}/t.json.gz") as f:
        assert f.read() == b'{"traceEvents": []}'
    with fs.open_input_file(f"{base}/part.bin") as f:
        assert f.size() == len(data)
        at = storetime.CHUNK - 5
        assert f.read_at(storetime.CHUNK + 10, at) == data[at:at + storetime.CHUNK + 10]
    listed = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    assert sorted(i.base_name for i in listed) == ["part.bin", "t.json.gz"]
    assert fs.get_file_info(f"{base}/nope").type == pafs.FileType.NotFound
    with pytest.raises(FileNotFoundError):
        fs.open_input_stream(f"{base}/nope")
    fs.delete_file(f"{base}/part.bin")
    assert not (tmp_path / "part.bin").exists()


def test_a_call_that_does_not_return_is_a_timeout_error() -> None:
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=f"within 0.2 s .*{storetime.ENV}"):
        storetime.call(lambda: release.wait(10), 0.2, "listing x")
    assert time.monotonic() - t0 < 1.0
    release.set()
    with pytest.raises(KeyError):  # the call's own error reaches the caller
        storetime.call(lambda: {}["x"], 1.0, "reading x")
