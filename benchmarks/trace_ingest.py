"""Trace-ingest benchmark (issue 16): streaming ingest against Holistic Trace Analysis.

    python benchmarks/trace_ingest.py [--repeats 3] [--synthetic 1000000] [TRACE ...]

For every trace (default: the real traces in tests/data/traces, plus a synthetic trace of
``--synthetic`` events made by tiling the 68,692-event A100 trace with shifted times and step
numbers, written gzip'd without ever holding it), each in a fresh process:

* ours: ``tracealyze.analyzer.ingest.stream.ingest`` (what ``import-trace`` runs per trace:
  parse, steps, time order, Parquet);
* HTA: ``TraceAnalysis(trace_dir=...)`` of the same file (parse into its DataFrames), when
  HolisticTraceAnalysis is installed (``pip install HolisticTraceAnalysis``);

both timed from before their imports (what a command pays) to the end, and the process's peak
RSS (VmHWM).

Reports medians over ``--repeats`` (spread min–max), events/s, the ratio of throughputs and
peak RSS as a multiple of the uncompressed JSON size. Targets: ≥ 3× HTA's throughput; peak RSS
≤ 1× the JSON size and flat with trace size.
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


def synthetic(out: Path, events: int) -> Path:
    """``events`` events (approximately: whole tiles) of the A100 trace, repeated with the
    times shifted past the previous copy and ProfilerStep numbers and correlations renumbered,
    streamed to a .json.gz."""
    import orjson

    doc = json.loads(gzip.decompress(TILE.read_bytes()))
    evs = doc.pop("traceEvents")
    ts = [e["ts"] for e in evs if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000.0
    steps = sorted({int(e["name"].split("#")[1]) for e in evs
                    if str(e.get("name", "")).startswith("ProfilerStep#")})
    tiles = max(1, round(events / len(evs)))
    with gzip.open(out, "wb", compresslevel=1) as f:
        head = orjson.dumps(doc)[:-1]
        f.write(head + b', "traceEvents": [\n')
        for k in range(tiles):
            chunk = []
            for e in evs:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                name = str(e2.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + k * len(steps)}"
                args = e2.get("args")
                if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                    e2["args"] = {**args, "correlation": args["correlation"] + k * 10**8}
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
    out = subprocess.run([sys.executable, "-c", code, *args], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[-3]), int(out[-2]), int(out[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", type=int, nargs="*", default=[1_000_000],
                    help="sizes (events) of synthetic traces; none: skip")
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
        for n in a.synthetic or []:
            traces.append(synthetic(work / f"synthetic-{n}.pt.trace.json.gz", n))
        print(f"{'trace':42} {'events':>9} {'JSON MB':>8} {'ours s':>18} {'HTA s':>18} "
              f"{'speed-up':>8} {'ours RSS':>14} {'HTA RSS':>14}")
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
            print(f"{t.name[:42]:42} {events:>9,} {size / 1e6:>8.1f} {ot:>18} {ht:>18} "
                  f"{speed:>8} {orss / 2**20:>8,.0f} MB {orss / size:>4.1f}x {hrss:>9}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
