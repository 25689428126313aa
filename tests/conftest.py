"""The suite's root. Imports need no sys.path edits: pyproject's ``pythonpath`` puts the repo
root (``tests.*``, ``tools``), ``tests/recorder`` (``rec_helpers``, ``reference``) and
``benchmarks`` (the workload builders some tests share with the benchmarks) on the path, under
``pytest`` and ``python -m pytest`` alike. Child processes that tests start are programs of
their own: they put the repo root on their path themselves."""

# A real S3 API server (moto's server mode on 127.0.0.1, a free port) for the tests of run
# directories in object storage, and the environment a user of an S3-compatible store sets.

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SLOW_PATHS = {
    # whole folders: each test trains a model or drives a framework in a process of its own
    "tests/scenarios/": "trains in-process scenarios end to end",
    "tests/integrations/": "runs transformers/Lightning/torchrun/record in subprocesses",
    "tests/matrix/": "records the matrix slice in subprocesses",
    # modules whose tests start servers or processes, or take seconds each
    "tests/recorder/test_record_to_store.py": "trains against an S3 server, outages included",
    "tests/recorder/test_record_to_azure.py": "trains against Azurite",
    "tests/recorder/test_record_to_gcs.py": "trains against the GCS emulator",
    "tests/recorder/test_one_writer.py": "two writer processes",
    "tests/recorder/test_heap_tuning.py": "training subprocesses",
    "tests/recorder/test_backward_nan.py": "trains until the NaN",
    "tests/recorder/test_recorder_crash.py": "kills training processes",
    "tests/recorder/test_recorder_distributed.py": "DDP processes",
    "tests/analyzer/test_inplace_reads.py": "an S3 server, many parts",
    "tests/analyzer/test_store_timeouts.py": "waits out frozen servers",
    "tests/analyzer/test_trust_property.py": "every command over generated hostile cases",
    "tests/analyzer/test_fleet_spark.py": "a Spark session",
    "tests/traces/test_hta_properties.py": "Holistic Trace Analysis live on generated jobs",
    "tests/traces/test_many_ranks.py": "64- and 1,024-rank jobs",
}
"""What ``-m "not slow"`` leaves out (CONTRIBUTING.md): the marker, given by place so that
a new test in such a module is slow too. The full suite still runs them."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parents[1]
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in SLOW_PATHS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The analyzer's caches (URL mirrors, parsed raw traces) go to the session's own folder,
    for every test and the processes they start: never the user's ~/.cache, and no test
    sees another session's entries."""
    import os

    old = os.environ.get("TRACEALYZE_CACHE_DIR")
    os.environ["TRACEALYZE_CACHE_DIR"] = str(tmp_path_factory.mktemp("tracealyze-cache"))
    yield
    if old is None:
        os.environ.pop("TRACEALYZE_CACHE_DIR", None)
    else:
        os.environ["TRACEALYZE_CACHE_DIR"] = old


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server_process(argv: Callable[[int], list[str]], timeout_s: float = 10.0
                   ) -> Iterator[int]:
    """A storage emulator in a process of its own (``argv(port)``) on 127.0.0.1 at a free
    port, yielded once the port accepts connections; killed after."""
    port = _free_port()
    proc = subprocess.Popen(argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    f"{argv(port)[0]} did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.kill()
        proc.wait()


class S3Server:
    """moto's S3 server on 127.0.0.1: ``url``, and ``stop()``/``start()`` on the same port
    (its buckets live in this process, so they outlive a restart)."""

    def __init__(self) -> None:
        self.moto = pytest.importorskip("moto.server")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: object = None

    def start(self) -> None:
        self._server = self.moto.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port,
                                                    verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


class Outage:
    """A TCP relay in front of the S3 server whose ``cut()`` refuses new connections and
    drops the open ones (a store that went away: a keep-alive connection to a stopped
    HTTP server would still be served), and ``restore()`` lets them through again."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.up = True
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.up = False
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
            self._conns.clear()

    def restore(self) -> None:
        self.up = True

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def endpoint(s3_server: S3Server) -> str:
    return s3_server.url


@pytest.fixture()
def s3(endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh bucket; the environment a user of an S3-compatible store sets."""
    for k, v in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
                 "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                 "TRACEALYZE_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    from pyarrow import fs

    bucket = f"runs-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    s3fs = fs.S3FileSystem(endpoint_override=endpoint, allow_bucket_creation=True)
    s3fs.create_dir(bucket)
    return bucket
