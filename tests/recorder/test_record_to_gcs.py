"""Run directories on ``gs://``: recorded and read back against a real Cloud Storage API server
(gcp-storage-emulator, in a process of its own on 127.0.0.1 at a free port: pyarrow's GCS
client holds the GIL on some calls, so a server in the test's own process would never
answer), reached through ``STORAGE_EMULATOR_HOST`` as Google's client libraries are."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from rec_helpers import check_store_run
from torch import nn
from tracealyze.analyzer.cli import main
from tracealyze.recorder import Recorder

from tests.conftest import server_process

BUCKET = "ml-runs"
SERVER = """
import sys, time
from gcp_storage_emulator.server import create_server
create_server("127.0.0.1", int(sys.argv[1]), in_memory=True, default_bucket=sys.argv[2]).start()
while True:
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def gcs_host() -> Iterator[str]:
    pytest.importorskip("gcp_storage_emulator")
    with server_process(lambda port: [sys.executable, "-c", SERVER, str(port), BUCKET]) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture()
def gcs(gcs_host: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_host)
    monkeypatch.setenv("TRACEALYZE_CACHE_DIR", str(tmp_path / "cache"))
    return f"gs://{BUCKET}/{tmp_path.name}"


def test_a_run_recorded_to_gcs_reads_as_the_same_run_recorded_locally(
        gcs: str, tmp_path: Path) -> None:
    check_store_run(f"{gcs}/exp1", tmp_path)


def test_a_gcs_bucket_that_does_not_exist_is_refused(gcs: str) -> None:
    with pytest.raises(ValueError):
        Recorder("gs://no-such-bucket-xyz/run", model=nn.Linear(2, 2))
    res = CliRunner().invoke(main, ["summary", "gs://no-such-bucket-xyz/run"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
