"""Runs in object storage, measured against a local S3 API server (moto's server mode, in
its own process, as a remote store would be):

* ``overhead``: the recorder's step-time overhead recording to ``s3://`` against recording
  to local disk, by the accepted A/B harness (``../shared/bench/overhead_ab.py``, unchanged:
  its Recorder is pointed at the bucket), runs interleaved; median and spread of --repeats.
  Also the bytes uploaded per step.
* ``read``: ``summary`` of a 100,000-step run from the bucket (cold: empty cache; warm: the
  cache from the previous command) against the same run on local disk, fresh CLI processes;
  the requests the server answered per ``summary`` and the bytes of the parts it read; and
  a one-column ``query`` of tensor_stats (cold): its requests and the share of the table
  it read (the parts are read in place, analyzer/run/inplace.py).
* ``node-loss``: a training process recording to the bucket is killed (``kill -9``) at a
  random moment and its spool deleted, as when a preemptible node disappears with its disk;
  the training seconds the store lacks (steps done but never uploaded × step time) against
  the bound ``flush_interval_s`` + upload time.

    python benchmarks/storage_s3.py overhead --repeats 3
    python benchmarks/storage_s3.py read --repeats 3
    python benchmarks/storage_s3.py node-loss --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT.parent / "shared" / "bench" / "overhead_ab.py"
sys.path.insert(0, str(ROOT))


class Server:
    """moto's S3 server in a child process; counts the requests it logs."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = Path(tempfile.mkdtemp(prefix="moto-")) / "server.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "bench",
                    "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_EC2_METADATA_DISABLED": "true"}
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update(self.env)
        from pyarrow import fs

        fs.S3FileSystem(endpoint_override=self.url, allow_bucket_creation=True).create_dir(
            "bench")

    def requests(self) -> int:
        return sum(1 for line in self.log.read_text().splitlines()
                   if '" 20' in line or '" 30' in line or '" 40' in line)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


REDIRECT = """
import runpy, sys, uuid
import tracealyze.recorder as R
real = R.Recorder
uploaded = []
class ToStore(real):
    def __init__(self, run_dir, **kw):
        super().__init__("s3://bench/" + uuid.uuid4().hex, **kw)
    def close(self, *a, **k):
        super().close(*a, **k)
        up = self._spool and self._spool.uploader
        if up is not None:
            print("UPLOADED", up.bytes_uploaded, self._life.next_step, file=sys.stderr)
R.Recorder = ToStore
sys.argv = [{harness!r}] + {args!r}
runpy.run_path({harness!r}, run_name="__main__")
"""


def overhead(repeats: int) -> None:
    server = Server()
    args = ["standard", "--model", "mlp", "--steps", "200", "--warm", "150"]
    got: dict[str, list[float]] = {"local": [], "s3": []}
    per_step: list[float] = []
    try:
        for _ in range(repeats):
            for where in ("local", "s3"):
                cmd = [sys.executable, str(HARNESS), *args] if where == "local" else \
                    [sys.executable, "-c", REDIRECT.format(harness=str(HARNESS), args=args)]
                out = subprocess.run(cmd, cwd=ROOT, env=server.env, capture_output=True,
                                     text=True, check=True)
                line = json.loads(out.stdout.strip().splitlines()[-1])
                got[where].append(100 * max(line["wall_overhead"], line["cpu_overhead"]))
                for err in out.stderr.splitlines():
                    if err.startswith("UPLOADED"):
                        _, sent, steps = err.split()
                        per_step.append(int(sent) / max(1, int(steps)))
                print(where, f"{got[where][-1]:+.2f}%", flush=True)
    finally:
        server.stop()
    for where, xs in got.items():
        print(f"{where:6s} overhead {statistics.median(xs):+.2f}% "
              f"({min(xs):+.2f}..{max(xs):+.2f}), {len(xs)} runs")
    if per_step:
        print(f"uploaded {statistics.median(per_step):,.0f} bytes per step")


def _summary(target: str, env: dict[str, str], *cmd: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()",
                    *(cmd or ("summary", target, "--json"))], env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - t


def _fetched(cache: Path, table: str = "") -> int:
    """Bytes of parts (of ``table``) that the cache holds: what was read in place."""
    return sum(b - a for index in cache.rglob(f".ranges/{table or '*'}/rank=*/*.json")
               for a, b in json.loads(index.read_text()))


SELECTIVE = "SELECT max(step), count(DISTINCT name) FROM tensor_stats"


def read(repeats: int, steps: int) -> None:
    from tracealyze.format import storage

    from tests.runfactory import make_run

    server = Server()
    try:
        with tempfile.TemporaryDirectory() as td:
            run = make_run(Path(td), steps=steps, tensors=8, metrics={"acc": 0.5})
            url = "s3://bench/runs/big"
            loc = storage.locate(url)
            for f in sorted(run.rglob("*")):
                if f.is_file():
                    storage.write_bytes(loc, f.relative_to(run).as_posix(), f.read_bytes())
            size = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
            files = len(storage.list_run(loc))
            cache = Path(td) / "cache"
            env = {**server.env, "TRACEALYZE_CACHE_DIR": str(cache)}
            table = sum(f.stat().st_size for f in (run / "tensor_stats").rglob("*.parquet"))
            parts = sum(f.stat().st_size for f in run.rglob("*.parquet"))
            local, cold, warm, reqs, got, sel, sel_got, sel_reqs = ([] for _ in range(8))
            for _ in range(repeats):
                local.append(_summary(str(run), env))
                shutil.rmtree(cache, ignore_errors=True)
                before = server.requests()
                cold.append(_summary(url, env))
                reqs.append(server.requests() - before)
                got.append(_fetched(cache))
                warm.append(_summary(url, env))
                shutil.rmtree(cache, ignore_errors=True)
                before = server.requests()
                sel.append(_summary(url, env, "query", url, SELECTIVE))
                sel_reqs.append(server.requests() - before)
                sel_got.append(_fetched(cache, "tensor_stats"))
    finally:
        server.stop()

    def fmt(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"
    base = statistics.median(local)
    print(f"{steps:,}-step run, {size / 2**20:.1f} MiB in {files} files")
    print(f"summary local      {fmt(local)}")
    print(f"summary s3 (cold)  {fmt(cold)}  ratio {statistics.median(cold) / base:.2f}x, "
          f"{statistics.median(reqs):.0f} requests")
    print(f"summary s3 (warm)  {fmt(warm)}  ratio {statistics.median(warm) / base:.2f}x")
    print(f"summary s3 (cold) read {statistics.median(got) / 2**20:.1f} MiB of the parts' "
          f"{parts / 2**20:.1f} MiB")
    print(f"query {SELECTIVE!r} (cold) {fmt(sel)}, {statistics.median(sel_reqs):.0f} "
          f"requests, read {statistics.median(sel_got) / 2**20:.2f} MiB of tensor_stats' "
          f"{table / 2**20:.1f} MiB ({100 * statistics.median(sel_got) / table:.0f}%)")


TRAIN = """
import sys, time, torch
from torch import nn
from tracealyze.recorder import Recorder
url, spool, flush = sys.argv[1], sys.argv[2], float(sys.argv[3])
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with Recorder(url, model=model, optimizer=opt, spool_dir=spool, flush_interval_s=flush,
              system_interval_s=0) as rec:
    for step in range(10**9):
        loss = model(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        rec.step(loss=loss)
        time.sleep(0.009)
        print(step, time.monotonic(), flush=True)
"""


def node_loss(repeats: int, flush_s: float) -> None:
    import random
    import signal

    from tracealyze.analyzer.errors import RunDirError
    from tracealyze.analyzer.run.catalog import open_run

    server = Server()
    lost_s, lost_steps = [], []
    rng = random.Random(0)
    try:
        for i in range(repeats):
            with tempfile.TemporaryDirectory() as td:
                url, spool = f"s3://bench/nodeloss/{i}", Path(td) / "spool"
                proc = subprocess.Popen([sys.executable, "-c", TRAIN, url, str(spool),
                                         str(flush_s)], env=server.env, cwd=ROOT,
                                        stdout=subprocess.PIPE, text=True)
                time.sleep(4.0 + rng.uniform(0.0, 2 * flush_s))  # a random phase of the flushes
                os.kill(proc.pid, signal.SIGKILL)
                out = proc.communicate()[0].splitlines()
                shutil.rmtree(spool, ignore_errors=True)  # the node's disk is gone too
                done = [tuple(map(float, line.split())) for line in out if line.strip()]
                env_cache = Path(td) / "cache"
                os.environ["TRACEALYZE_CACHE_DIR"] = str(env_cache)
                try:
                    with open_run(url) as run:
                        stored = run.con.execute("SELECT max(step) FROM steps").fetchone()[0]
                except RunDirError:  # not even run.json reached the store
                    stored = None
                stored = -1 if stored is None else int(stored)
                last, t_last = int(done[-1][0]), done[-1][1]
                t_stored = next((t for s, t in done if int(s) == stored), done[0][1])
                lost_steps.append(last - stored)
                lost_s.append(max(0.0, t_last - t_stored))
                print(f"trial {i}: {last + 1} steps done, {stored + 1} in the store, "
                      f"{lost_s[-1]:.2f} s of training lost", flush=True)
    finally:
        server.stop()
    print(f"flush_interval_s={flush_s:g}: lost {statistics.median(lost_s):.2f} s "
          f"({min(lost_s):.2f}-{max(lost_s):.2f}) of training, "
          f"{statistics.median(lost_steps):.0f} steps ({min(lost_steps)}-{max(lost_steps)}), "
          f"{repeats} kills")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["overhead", "read", "node-loss"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100_000, help="read: steps of the run")
    ap.add_argument("--flush-interval-s", type=float, default=5.0,
                    help="node-loss: the recorder's flush_interval_s")
    a = ap.parse_args()
    if a.what == "overhead":
        overhead(a.repeats)
    elif a.what == "read":
        read(a.repeats, a.steps)
    else:
        node_loss(a.repeats, a.flush_interval_s)


if __name__ == "__main__":
    main()
