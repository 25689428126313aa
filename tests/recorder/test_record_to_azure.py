"""Run directories on ``az://`` (``abfs://``): recorded and read back against a real Azure Blob
API server (Azurite, Microsoft's emulator, in a process of its own on 127.0.0.1 at a free
port), reached through ``AZURE_STORAGE_CONNECTION_STRING`` as Azure's own tools and fsspec's
adlfs are. Azurite is a Node program: ``.ci/run`` installs it with npm; without it (no
``azurite-blob`` on PATH) these tests skip."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from rec_helpers import check_store_run, cli_ok
from torch import nn
from tracealyze.analyzer.cli import main
from tracealyze.recorder import Recorder

from tests.conftest import server_process

CONTAINER = "ml-runs"
ACCOUNT = "devstoreaccount1"
# Azurite's fixed development account key: published in its documentation, not a secret
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.fixture(scope="module")
def azurite() -> Iterator[str]:
    exe = shutil.which("azurite-blob")
    if exe is None:
        pytest.skip("Azurite (azurite-blob) is not installed: npm install -g azurite")
    argv = [exe, "--inMemoryPersistence", "--blobHost", "127.0.0.1", "--skipApiVersionCheck",
            "--loose", "--disableTelemetry", "--blobPort"]
    with server_process(lambda port: [*argv, str(port)]) as port:
        from pyarrow import fs

        fs.AzureFileSystem(account_name=ACCOUNT, account_key=KEY,
                           blob_storage_authority=f"127.0.0.1:{port}",
                           blob_storage_scheme="http").create_dir(CONTAINER)
        yield (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
               f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")


@pytest.fixture()
def az(azurite: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    monkeypatch.setenv("TRACEALYZE_CACHE_DIR", str(tmp_path / "cache"))
    return f"az://{CONTAINER}/{tmp_path.name}"


def test_a_run_recorded_to_azure_reads_as_the_same_run_recorded_locally(
        az: str, tmp_path: Path) -> None:
    url = f"{az}/exp1"
    check_store_run(url, tmp_path)
    sql = "SELECT sum(loss), count(*) FROM steps"  # the same under the abfs:// spelling
    assert cli_ok("query", "abfs://" + url.split("://", 1)[1], sql, "--format", "csv") == \
        cli_ok("query", url, sql, "--format", "csv")


def test_a_container_that_does_not_exist_is_refused(az: str) -> None:
    with pytest.raises(ValueError):
        Recorder("az://no-such-container/run", model=nn.Linear(2, 2))
    res = CliRunner().invoke(main, ["summary", "az://no-such-container/run"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output


def test_no_account_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        Recorder("az://c/run", model=nn.Linear(2, 2))
    res = CliRunner().invoke(main, ["summary", "az://c/run"])
    assert res.exit_code == 2 and "AZURE_STORAGE_ACCOUNT_NAME" in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
