"""Recording straight to object storage (``Recorder("s3://...")``), against a real S3 API
server (moto's server mode, the ``endpoint``/``s3`` fixtures of the root conftest): the run
is written to a local spool and uploaded by a background thread; training never waits for
the store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rec_helpers import record_small_run as _train
from rec_helpers import sgd_step as _step
from torch import nn
from tracealyze.analyzer.cli import main
from tracealyze.format import storage
from tracealyze.recorder import Recorder


def _summary(target: str) -> dict:
    res = CliRunner().invoke(main, ["summary", target, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_a_run_recorded_to_a_bucket_reads_as_the_same_run_recorded_locally(
        s3: str, tmp_path: Path) -> None:
    url = f"s3://{s3}/runs/exp1"
    spool = tmp_path / "spool"
    _train(url, 60, spool_dir=str(spool))
    _train(tmp_path / "local", 60)
    remote, local = _summary(url), _summary(str(tmp_path / "local"))
    assert remote["run"]["steps"] == local["run"]["steps"] == 60
    assert remote["run"]["status"] == "completed"
    # read from the bucket, the run gives the findings of its own files read from disk (the
    # run recorded locally had other step times, so timing findings may differ from it)
    loc = storage.locate(url)
    for f in storage.list_run(loc):
        storage.fetch(loc, f, tmp_path / "copy")
    copied = _summary(str(tmp_path / "copy"))
    assert remote["findings"] == copied["findings"]
    sql = "SELECT sum(loss) FROM steps"
    got = [CliRunner().invoke(main, ["query", d, sql, "--format", "csv"]).output
           for d in (url, str(tmp_path / "local"))]
    assert got[0] == got[1]  # the same losses, bit for bit
    assert not any(spool.iterdir())  # uploaded, then the spool is gone
    parts = [f.rel for f in storage.list_run(loc) if f.rel.startswith("steps/")]
    assert len(parts) == 1  # compacted on close, covered parts deleted from the store


def test_the_store_down_mid_run_stalls_nothing_and_loses_nothing(
        s3_server: object, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store goes away for 20 s in the middle of training (connections refused and
    dropped) and comes back: steps go on at their pace, every step reaches the store, and
    the outage is reported."""
    import threading

    from tests.conftest import Outage

    relay = Outage(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    url = f"s3://{s3}/runs/outage"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    durations, steps, cut_at = [], 0, None
    with Recorder(url, model=model, optimizer=opt, flush_interval_s=0.2, system_interval_s=0,
                  profile_start=0, spool_dir=str(tmp_path / "spool")) as rec:
        while cut_at is None or time.monotonic() < cut_at + 22.0:
            t = time.perf_counter()
            if steps == 40:
                relay.cut()
                cut_at = time.monotonic()
                threading.Timer(20.0, relay.restore).start()
            _step(model, opt, rec, torch.randn(16, 8))
            time.sleep(0.005)
            steps += 1
            durations.append(time.perf_counter() - t)
    assert max(durations[41:]) < 1.0  # no step waited for the store
    assert _summary(url)["run"]["steps"] == steps
    res = CliRunner().invoke(main, ["query", url, "SELECT max(CAST(json_extract("
                                    "details, '$.delay_s') AS DOUBLE)) FROM events WHERE "
                                    "kind = 'storage_delayed'", "--format", "csv"])
    assert float(res.output.split()[-1]) >= 19.0, res.output  # the outage, reported


def test_a_bucket_that_does_not_exist_is_refused_at_construction(s3: str) -> None:
    with pytest.raises(ValueError, match="no such bucket"):
        Recorder("s3://no-such-bucket-xyz/run", model=nn.Linear(2, 2))


def test_a_url_holding_a_run_is_not_overwritten(s3: str, tmp_path: Path) -> None:
    url = f"s3://{s3}/runs/once"
    _train(url, 5, spool_dir=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="already holds a run"):
        Recorder(url, model=nn.Linear(2, 2), spool_dir=str(tmp_path / "b"))


CHILD = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
import torch
from torch import nn
from tracealyze.recorder import Recorder
model = nn.Linear(2, 2)
rec = Recorder({url!r}, model=model, spool_dir={spool!r}, flush_interval_s=0.1,
               system_interval_s=0, profile_start=0)
for i in range(30):
    rec.step(loss=float(i))
time.sleep(0.6)  # the writer flushed every step to the spool
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_spool_left_by_kill_9_is_uploaded_by_the_cli(s3: str, tmp_path: Path) -> None:
    """After kill -9, ``tracealyze upload SPOOL`` brings the store up to date: every step
    once, whatever the uploader had sent before the process died."""
    import os
    import subprocess
    import sys

    from tracealyze.format.spool import spool_for

    url = f"s3://{s3}/runs/killed"
    root = str(Path(__file__).resolve().parents[2])
    code = CHILD.format(root=root, url=url, spool=str(tmp_path / "spool"))
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    spool = spool_for(url, str(tmp_path / "spool"))
    assert (spool / "steps").is_dir()
    res = CliRunner().invoke(main, ["upload", str(spool)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("uploaded ") and url in res.output
    assert not spool.exists()
    got = CliRunner().invoke(main, ["query", url, "SELECT count(*), count(DISTINCT step) "
                                    "FROM steps", "--format", "csv"])
    assert got.output.splitlines()[-1] == "30,30"


def test_a_framework_callback_records_to_the_url_it_is_given(s3: str, tmp_path: Path) -> None:
    """The callbacks' shared session keeps a URL as a URL (``Path`` would fold ``s3://b``
    into a local folder ``s3:/b``)."""
    from tracealyze.recorder.integrations._session import Session

    url = f"s3://{s3}/runs/callback"
    session = Session(url, "standard", {"spool_dir": str(tmp_path / "spool"),
                                        "system_interval_s": 0, "profile_start": 0})
    model = nn.Linear(4, 1)
    rec = session.start(tmp_path / "unused", model=model, capture_loss=False)
    for i in range(5):
        rec.step(loss=float(i))
    session.close()
    assert not (tmp_path / "unused").exists() and not Path("s3:").exists()
    assert _summary(url)["run"]["steps"] == 5


STEPS = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from torch import nn
from tracealyze.recorder import Recorder
rec = Recorder({url!r}, model=nn.Linear(2, 2), spool_dir={spool!r}, flush_interval_s=0.1,
               system_interval_s=0, profile_start=0, resume={resume!r})
first = rec.current_step
for i in range({steps}):
    rec.step(loss=float(first + i))
if {kill!r}:
    time.sleep(0.6)
    os.kill(os.getpid(), signal.SIGKILL)
rec.close()
"""


def _child(url: str, spool: Path, steps: int, *, resume: bool = False, kill: bool = False,
           rank: int | None = None) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ)
    if rank is not None:
        env.update(RANK=str(rank), WORLD_SIZE="2")
    code = STEPS.format(root=str(Path(__file__).resolve().parents[2]), url=url,
                        spool=str(spool), steps=steps, resume=resume, kill=kill)
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=120,
                          capture_output=True, text=True)
    assert proc.returncode == (-9 if kill else 0), proc.stderr


def _steps(url: str) -> str:
    res = CliRunner().invoke(main, ["query", url, "SELECT rank, count(*), count(DISTINCT step),"
                                    " min(step), max(step), sum(loss = step) FROM steps "
                                    "GROUP BY rank ORDER BY rank", "--format", "csv"])
    assert res.exit_code == 0, res.output
    return "\n".join(res.output.splitlines()[1:])


@pytest.mark.parametrize("same_node", [True, False])
def test_a_run_killed_mid_upload_resumes_with_no_step_lost_or_counted_twice(
        s3: str, tmp_path: Path, same_node: bool) -> None:
    """kill -9, then ``Recorder(url, resume=True)``: on the same node (the spool is still
    there) or on a new one (an empty spool: the run comes back from the store)."""
    url = f"s3://{s3}/runs/resumed-{same_node}"
    _child(url, tmp_path / "spool", 25, kill=True)
    if not same_node:  # what the dead node had uploaded is all there is
        from tracealyze.format.spool import spool_for, upload_spool

        upload_spool(spool_for(url, str(tmp_path / "spool")), 60)
    spool = tmp_path / ("spool" if same_node else "fresh-node")
    _child(url, spool, 15, resume=True)
    assert _steps(url) == "0,40,40,0,39,40"  # every step once, numbering continued
    assert _summary(url)["run"]["status"] == "completed"


def test_two_ranks_record_one_run_to_the_store(s3: str, tmp_path: Path) -> None:
    """Two ranks of one job on one node share the spool; each uploads its own files."""
    import threading

    url = f"s3://{s3}/runs/ddp"
    threads = [threading.Thread(target=_child, args=(url, tmp_path / "spool", 30),
                                kwargs={"rank": r}) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _steps(url) == "0,30,30,0,29,30\n1,30,30,0,29,30"
    assert _summary(url)["run"]["ranks"] == [0, 1]
    assert not (tmp_path / "spool").exists() or not any((tmp_path / "spool").rglob("*.parquet"))


def test_a_store_down_for_long_bounds_the_spool_and_counts_what_it_drops(
        s3_server: object, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Uploads stuck behind ``max_spool_bytes``: the writer stops adding parts, rows wait in
    memory up to ``max_buffered_bytes``, the oldest are dropped and counted; the node's disk
    does not fill; what was kept reaches the store once it is back."""
    from tracealyze.format.spool import spool_for
    from tracealyze.format.storage import local_files

    from tests.conftest import Outage

    relay = Outage(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    url = f"s3://{s3}/runs/full"
    spool = spool_for(url, str(tmp_path / "spool"))
    seen: list[int] = []
    at_cut: list[int] = []

    def during() -> None:
        relay.cut()
        at_cut.append(sum(st[0] for st in local_files(spool).values()))

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(url, model=model, optimizer=opt, spool_dir=str(tmp_path / "spool"),
                  flush_interval_s=0.05,
                  system_interval_s=0, profile_start=0, max_spool_bytes=60_000,
                  max_buffered_bytes=40_000, merge_on_close=False,
                  upload_timeout_s=30.0) as rec:
        for i in range(400):
            if i == 5:
                time.sleep(0.5)  # the first parts are uploaded
                during()
            _step(model, opt, rec, torch.randn(8, 32))
            time.sleep(0.002)
            if i % 50 == 0:
                seen.append(sum(st[0] for st in local_files(spool).values()))
        relay.restore()
    # the spool stopped growing at the bound, while training went on. What it may hold
    # beyond what it held at the cut (uploaded parts stay in the spool until close; 12-47 KB
    # depending on how many flushes the machine's load let through): max_spool_bytes of
    # parts not uploaded, plus the flush that crossed it (at most max_buffered_bytes).
    assert seen[-1] == seen[-2] and max(seen) - at_cut[0] <= 60_000 + 40_000, (at_cut, seen)
    out = _summary(url)
    assert 0 < out["run"]["steps"] < 400
    assert "dropped_data" in [f["id"] for f in out["findings"]]


PLAIN = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for _ in range(12):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
raise SystemExit(3)
"""


def test_record_cli_records_an_unmodified_script_to_a_url(s3: str, tmp_path: Path) -> None:
    """``tracealyze record --run-dir s3://...``: no code change, the run lands in the bucket
    with the command's exit code; a URL that holds a run already is refused before the
    command starts."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    url = f"s3://{s3}/runs/cli"
    cli = [sys.executable, "-c", "from tracealyze.analyzer.cli import main; main()"]
    env = dict(os.environ)
    run = [*cli, "record", "--run-dir", url, "--set", "system_interval_s=0", "--set",
           f"spool_dir={tmp_path / 'spool'}", "--", sys.executable, str(script)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert f"recorded {url}" in out.stderr
    assert _summary(url)["run"]["steps"] == 12
    meta = json.loads(storage.read_bytes(storage.locate(url), "run.json"))
    assert meta["exit_code"] == 3 and meta["status"] == "crashed"  # as record marks a local run
    again = subprocess.run(run, capture_output=True, text=True, timeout=240, env=env,
                           cwd=tmp_path)
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert not Path(tmp_path / "s3:").exists()


def test_the_run_is_in_the_store_from_its_start(s3: str, tmp_path: Path) -> None:
    """run.json and the rank file are uploaded as training starts, not one flush interval
    later: a node lost before its first flush leaves a run the analyzer finds (running, then
    killed), not an empty prefix."""
    url = f"s3://{s3}/runs/early"
    loc = storage.locate(url)
    with Recorder(url, model=nn.Linear(2, 2), flush_interval_s=600, system_interval_s=0,
                  spool_dir=str(tmp_path / "spool")):
        deadline = time.monotonic() + 10
        while not storage.has_run(storage.list_run(loc)) and time.monotonic() < deadline:
            time.sleep(0.1)
        names = {f.rel for f in storage.list_run(loc)}
        assert {"run.json", "ranks/rank=0.json"} <= names
        assert json.loads(storage.read_bytes(loc, "run.json"))["status"] == "running"


def test_a_cuda_oom_snapshot_reaches_the_bucket_and_is_read_from_it(
        s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44 item 3: the allocator snapshot written at a CUDA OOM is uploaded like a part,
    and the analyzer reads it back from the URL (its mirror) into the cuda_oom finding."""
    from tracealyze.recorder.training import oom as oom_mod

    snap = {"segments": [{"address": 4096, "total_size": 3 << 30, "allocated_size": 3 << 30,
                          "blocks": [{"address": 4096, "size": 3 << 30, "state":
                                      "active_allocated", "frames": [
                                          {"filename": "train.py", "line": 7,
                                           "name": "step"}]}]}],
            "device_traces": [[]]}
    monkeypatch.setattr(oom_mod.torch.cuda.memory, "_snapshot", lambda device=None: snap)
    url = f"s3://{s3}/runs/oom"
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError), Recorder(url, model=model, optimizer=opt,
                                               spool_dir=str(tmp_path / "spool"),
                                               system_interval_s=0) as rec:
        rec._oom.cuda = True  # (the device would be CUDA)
        for _ in range(3):
            _step(model, opt, rec, torch.randn(8, 4))
        raise RuntimeError("CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a "
                           "total capacity of 8.00 GiB of which 1.00 GiB is free.")
    keys = [f.rel for f in storage.list_run(storage.locate(url))]
    assert "memory_snapshots/rank=0/oom-step000003.pickle" in keys
    f = next(x for x in _summary(url)["findings"] if x["id"] == "cuda_oom")
    assert f["evidence"]["snapshot"]["live_by_frame"][0]["frame"] == "train.py:7 in step"
