"""Trace-ingest benchmark (issues 16, 31): streaming ingest against Holistic Trace Analysis.

    python benchmarks/trace_ingest.py [--repeats 3] [--synthetic 1000000] [--heavy 75000]
                                      [TRACE ...]

For every trace (default: the real traces in tests/data/traces; a synthetic trace of
``--heavy`` events, the A100 trace tiled with input shapes on every op, ~470 bytes an event
like a 75k-event, 35 MB trace; and one of ``--synthetic`` events, the A100 trace tiled with
shifted times and step numbers; both written gzip'd without ever holding them), each in a
fresh process:

* ours: ``tracealyze.analyzer.ingest.stream.ingest`` (what ``import-trace`` runs per trace:
  parse, steps, time order, Parquet);
* HTA: ``TraceAnalysis(trace_dir=...)`` of the same file (parse into its DataFrames), when
  HolisticTraceAnalysis is installed (``pip install HolisticTraceAnalysis``);

both timed from before the interpreter starts to its exit (process start, imports, work),
and the process's peak RSS (VmHWM).

Reports medians over ``--repeats`` (spread min–max), MB of JSON per second, the ratio of the
two times and peak RSS as a multiple of the uncompressed JSON size. Targets (issue 31): ≥ 5×
HTA and ≥ 100 MB/s on the large traces; peak RSS ≤ 1× the JSON from 500 MB up, ≤ 300 MB at
35 MB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"
TILE = DATA / "gpu_nccl_1rank_ns.pt.trace.json.gz"

# Both timed from before their imports (what a command pays), peak RSS from VmHWM (ru_maxrss
# would carry this parent's high-water mark across exec).
_HWM = """
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
"""

_OURS = _HWM + """
import sys, time
t = time.perf_counter()
from pathlib import Path
from tracealyze.analyzer.ingest.stream import ingest
info = ingest(Path(sys.argv[1]), Path(sys.argv[2]))
print(time.perf_counter() - t, hwm(), info.events)
"""

_HTA = _HWM + """
import logging, sys, time, warnings
t = time.perf_counter()
warnings.simplefilter("ignore"); logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
print(time.perf_counter() - t, hwm(), 0)
"""


_DIMS = [[32, 128, 768], [768, 768], [768], [], [32, 128, 1], [], [32, 12, 128, 64],
         [32, 12, 64, 128], [], [1]]
_STRIDES = [[98304, 768, 1], [768, 1], [1], [], [128, 1, 1], [], [98304, 8192, 64, 1],
            [98304, 8192, 1, 64], [], [1]]
HEAVY_ARGS = {"Input Dims": _DIMS * 2,
              "Input type": (["c10::BFloat16"] * 3 + ["Scalar", "float", "ScalarList"]
                             + ["c10::BFloat16"] * 2 + ["", "long int"]) * 2,
              "Input Strides": _STRIDES * 2,
              "Concrete Inputs": ["", "", "", "1", "", "[0, 1]", "", "", "None", ""] * 2,
              "Record function id": 0, "Fwd thread id": 0, "Sequence number": 123456}
"""What recent PyTorch records on every op with ``record_shapes=True``: the A100 trace tiled
with these on its cpu_ops is ~470 bytes an event, the shape of a 75k-event, 35 MB trace."""


def synthetic(out: Path, events: int, heavy: bool = False) -> Path:
    """``events`` events (approximately: whole tiles) of the A100 trace, repeated with the
    times shifted past the previous copy and ProfilerStep numbers and correlations renumbered,
    streamed to a .json.gz (``heavy``: with :data:`HEAVY_ARGS` on every cpu_op)."""
    import orjson

    doc = json.loads(gzip.decompress(TILE.read_bytes()))
    evs = doc.pop("traceEvents")
    ts = [e["ts"] for e in evs if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000.0
    steps = sorted({int(e["name"].split("#")[1]) for e in evs
                    if str(e.get("name", "")).startswith("ProfilerStep#")})
    tiles = max(1, -(-events // len(evs)))  # whole tiles, the last one cut at ``events``
    with gzip.open(out, "wb", compresslevel=1) as f:
        head = orjson.dumps(doc)[:-1]
        f.write(head + b', "traceEvents": [\n')
        for k in range(tiles):
            chunk = []
            for e in evs[:events - k * len(evs)]:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                name = str(e2.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * len(steps)}"
                args = e2.get("args")
                if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                    e2["args"] = {**args, "correlation": args["correlation"] + k * 10**8}
                if heavy and e2.get("cat") == "cpu_op":
                    e2["args"] = {**e2.get("args", {}), **HEAVY_ARGS}
                chunk.append(orjson.dumps(e2))
            f.write(b",\n".join(chunk) + (b",\n" if k < tiles - 1 else b"\n"))
        f.write(b"]}\n")
    return out


def json_size(path: Path) -> int:
    if path.read_bytes()[:2] != b"\x1f\x8b":
        return path.stat().st_size
    n = 0
    with gzip.open(path) as f:
        while chunk := f.read(1 << 24):
            n += len(chunk)
    return n


def run(code: str, *args: str) -> tuple[float, int, int]:
    """(seconds from before the interpreter starts to its exit, peak RSS, events)."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *args], check=True,
                         capture_output=True, text=True).stdout.split()
    return time.perf_counter() - t, int(out[-2]), int(out[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", type=int, nargs="*", default=[1_000_000],
                    help="sizes (events) of synthetic traces; none: skip")
    ap.add_argument("--heavy", type=int, nargs="*", default=[75_000],
                    help="sizes (events) of synthetic traces with input shapes on every op "
                         "(~470 bytes an event); none: skip")
    ap.add_argument("--no-hta", action="store_true")
    a = ap.parse_args()
    try:
        import hta  # noqa: F401
        have_hta = not a.no_hta
    except ImportError:
        have_hta = False
        print("HolisticTraceAnalysis not installed: our figures only")
    work = Path(tempfile.mkdtemp(prefix="tracealyze-ingest-bench-"))
    try:
        traces = list(a.traces) or sorted(DATA.glob("*.json.gz"))
        for n in a.heavy or []:
            traces.append(synthetic(work / f"shapes-{n}.pt.trace.json.gz", n, heavy=True))
        for n in a.synthetic or []:
            traces.append(synthetic(work / f"synthetic-{n}.pt.trace.json.gz", n))
        print(f"{'trace':42} {'events':>9} {'JSON MB':>8} {'ours s':>18} {'MB/s':>6} "
              f"{'HTA s':>18} {'speed-up':>8} {'ours RSS':>14} {'HTA RSS':>14}")
        for t in traces:
            size = json_size(t)
            ours, hta_ = [], []
            events = 0
            for _ in range(a.repeats):
                s, rss, events = run(_OURS, str(t), str(work / "out.parquet"))
                ours.append((s, rss))
                if have_hta:
                    d = work / "hta"
                    shutil.rmtree(d, ignore_errors=True)
                    d.mkdir()
                    (d / t.name).symlink_to(t.resolve())
                    try:
                        hta_.append(run(_HTA, str(d))[:2])
                    except subprocess.CalledProcessError:
                        hta_ = []
                        break
            om = statistics.median(x[0] for x in ours)
            orss = max(x[1] for x in ours)
            ot = f"{om:.3f} ({min(x[0] for x in ours):.3f}–{max(x[0] for x in ours):.3f})"
            if hta_:
                hm = statistics.median(x[0] for x in hta_)
                ht = f"{hm:.3f} ({min(x[0] for x in hta_):.3f}–{max(x[0] for x in hta_):.3f})"
                speed = f"{hm / om:.1f}x"
                hrss = f"{max(x[1] for x in hta_) / 2**20:,.0f} MB"
            else:
                ht, speed, hrss = "—", "—", "—"
            print(f"{t.name[:42]:42} {events:>9,} {size / 1e6:>8.1f} {ot:>18} "
                  f"{size / 1e6 / om:>6.1f} {ht:>18} "
                  f"{speed:>8} {orss / 2**20:>8,.0f} MB {orss / size:>4.1f}x {hrss:>9}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
