"""Generated Kineto traces for property tests against Holistic Trace Analysis.

A strategy draws a whole job: one to three ranks, each a Chrome trace as ``torch.profiler``
writes it, built the way a real one comes about rather than event by event. A host thread
runs ``ProfilerStep#N`` windows (none, one or several, with gaps between them) and calls
the runtime (``cudaLaunchKernel``, ``cudaLaunchKernelExC``, ``cudaMemcpyAsync``,
``cudaMemsetAsync``, ``cudaEventSynchronize``); each call queues a GPU event on one of up to
six streams, which starts when both the call has returned (plus a launch latency) and the
stream is free (plus a gap). On top of that, what real traces have and the shipped ones
barely do:

* streams that are idle for most of the trace (a few events far apart);
* activity launched before the first or after the last ProfilerStep, and launched before
  profiling started (the GPU event is there, its runtime call is not);
* NCCL kernels on their own stream, overlapping compute on the others;
* memcpy and memset, zero-duration events, an event nested inside the one before it on
  the same stream (clock skew between host and device);
* ``cuda_sync`` events (``Event Sync`` on a stream, ``Context Sync`` device-wide) and
  ``gpu_user_annotation`` spans, which are not GPU activity;
* runtime calls slower than 50 us and launch delays over 100 us (launch statistics).

Times are whole microseconds (integers), so HTA's rounding of ns-resolution timestamps
never applies and the comparison can be exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

COMPUTE = ("volta_sgemm_128x64_nn", "void at::native::elementwise_kernel<128, 4>",
           "ampere_bf16_s16816gemm_relu", "triton_poi_fused_add_0")
NCCL = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL")
MEMCPY = ("Memcpy HtoD (Pageable -> Device)", "Memcpy DtoD (Device -> Device)",
          "Memcpy DtoH (Device -> Pinned)")
MEMSET = ("Memset (Device)",)

HOST_PID, HOST_TID, BWD_TID = 1, 1, 2
DEVICE_PID = 0


@st.composite
def launches(draw: Any, n_streams: int) -> list[dict[str, Any]]:
    """What the host asks of the GPU, in call order: one dict per runtime call."""
    # stream 0 of the list is the busy compute stream; the last one, when there are
    # several, is the NCCL stream; the rest are side streams, some almost never used
    weights = [draw(st.sampled_from([1, 1, 2, 20])) for _ in range(n_streams)]
    weights[0] = 30
    n = draw(st.integers(1, 70))
    out = []
    for _ in range(n):
        si = draw(st.sampled_from([i for i, w in enumerate(weights) for _ in range(w)]))
        nccl = n_streams > 1 and si == n_streams - 1
        kind = "nccl" if nccl else draw(st.sampled_from(
            ["kernel"] * 6 + ["memcpy", "memset", "sync", "kernel_ex"]))
        out.append({
            "kind": kind,
            "stream": si,
            "host_gap": draw(st.sampled_from([0, 1, 3, 10, 40, 200, 1500])),
            "call_dur": draw(st.sampled_from([2, 4, 8, 30, 60, 120])),
            "latency": draw(st.sampled_from([1, 3, 5, 20, 150])),
            "queue_gap": draw(st.sampled_from([0, 0, 1, 2, 10, 29, 30, 31, 80, 500])),
            "dur": draw(st.sampled_from([0, 1, 2, 5, 17, 60, 250, 900])),
            "nested": draw(st.integers(0, 30)) == 0,
            "unlaunched": draw(st.integers(0, 25)) == 0,  # runtime call not in the trace
            "name": draw(st.integers(0, 5)),
        })
    return out


@st.composite
def rank_trace(draw: Any, rank: int, world: int, n_windows: int = 2, first_step: int = 1,
               ns: bool = False) -> dict[str, Any]:
    """One rank's trace (the JSON object): ``n_windows`` ProfilerStep spans numbered from
    ``first_step``; ``ns``: timestamps with a fractional part (ns resolution), as recent
    PyTorch writes them."""
    n_streams = draw(st.integers(1, 6))
    streams = sorted(draw(st.lists(st.sampled_from([7, 13, 20, 21, 24, 28, 35, 61]),
                                   min_size=n_streams, max_size=n_streams, unique=True)))
    calls = draw(launches(n_streams))
    t0 = 1_700_000_000_000 + draw(st.integers(0, 5000))
    events: list[dict[str, Any]] = []
    corr = 100 * (rank + 1)
    host = t0 + draw(st.integers(0, 300))  # the host's clock: when the next call starts
    free = {s: t0 for s in streams}  # when each stream's queue is empty
    last_end: dict[int, int] = {}
    starts: dict[int, set[int]] = {}
    for c in calls:
        host += c["host_gap"]
        s = streams[c["stream"]]
        corr += 1
        call = {"kernel": "cudaLaunchKernel", "kernel_ex": "cudaLaunchKernelExC",
                "nccl": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync",
                "memset": "cudaMemsetAsync", "sync": "cudaStreamWaitEvent"}[c["kind"]]
        if not c["unlaunched"]:
            events.append(_x("cuda_runtime", call, host, c["call_dur"], HOST_PID, HOST_TID,
                             correlation=corr, **{"External id": corr + 50_000}))
        ready = host + c["call_dur"] + c["latency"]
        if c["nested"] and s in last_end:  # inside the previous event of the stream
            start = max(t0, last_end[s] - max(c["dur"], 1) - 1)
        else:
            start = max(ready, free[s] + c["queue_gap"])
        # No two events of a stream start together: HTA orders a stream by start with
        # numpy's unstable sort, so the order of a tie (and the gaps it gives) is not
        # defined there
        while start in starts.setdefault(s, set()):
            start += 1
        starts[s].add(start)
        cat, name = {
            "kernel": ("kernel", COMPUTE[c["name"] % len(COMPUTE)]),
            "kernel_ex": ("kernel", COMPUTE[c["name"] % len(COMPUTE)]),
            "nccl": ("kernel", NCCL[c["name"] % len(NCCL)]),
            "memcpy": ("gpu_memcpy", MEMCPY[c["name"] % len(MEMCPY)]),
            "memset": ("gpu_memset", MEMSET[0]),
            "sync": ("cuda_sync", "Stream Wait Event"),
        }[c["kind"]]
        args = {"device": 0, "stream": s, "correlation": corr,
                "External id": corr + 50_000}
        events.append(_x(cat, name, start, c["dur"], DEVICE_PID, s, **args))
        end = start + c["dur"]
        free[s] = max(free[s], end)
        last_end[s] = end
        host += c["call_dur"]
    t_end = max([host, *free.values()]) + draw(st.integers(0, 300))
    # a device-wide synchronize at the end (Kineto's "no stream": 0xFFFFFFFF)
    if draw(st.booleans()):
        corr += 1
        events.append(_x("cuda_runtime", "cudaDeviceSynchronize", host, 5, HOST_PID, HOST_TID,
                         correlation=corr))
        events.append(_x("cuda_sync", "Context Sync", host, max(1, t_end - host),
                         DEVICE_PID, 0, device=0, stream=0xFFFFFFFF, correlation=corr))
    events += _windows(draw, n_windows, first_step, t0, t_end)
    # a GPU-side copy of a user annotation: on a stream's row, not activity
    if draw(st.booleans()) and events:
        events.append(_x("gpu_user_annotation", "## forward ##", t0 + 5, (t_end - t0) // 3,
                         DEVICE_PID, streams[0], **{"External id": 7}))
    # the file's first event, at the trace's start, as Kineto writes it (HTA takes its time
    # as the launch time of a GPU event whose launch is not in the trace: docs/TRACES.md)
    events.append(_x("cpu_op", "aten::mm", t0, 3, HOST_PID, BWD_TID,
                     **{"External id": 9, "Sequence number": 3}))
    events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)",
                   "pid": "Spans", "tid": "PyTorch Profiler", "ts": t0, "dur": t_end - t0})
    if ns:  # fractions of a microsecond on every start and duration
        for e in events:
            if e["cat"] != "Trace":
                e["ts"] += draw(st.integers(0, 999)) / 1000
                e["dur"] += draw(st.integers(0, 999)) / 1000
    # Kineto's order: host events by start, then the device's
    events.sort(key=lambda e: (e["pid"] == DEVICE_PID, str(e["pid"]), e["ts"],
                               e["name"] != "aten::mm"))
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }


def _windows(draw: Any, n: int, first: int, t0: int, t_end: int) -> list[dict[str, Any]]:
    """``n`` ProfilerStep spans over [t0, t_end], some starting late or ending early (so
    that activity falls before the first and after the last), with gaps between them."""
    if n == 0:
        return []
    # distinct instants: a profiler's steps never overlap (two steps starting together
    # would leave which one holds an event undefined)
    cuts = sorted(draw(st.lists(st.integers(t0, t_end + 2 * n), min_size=2 * n,
                                max_size=2 * n, unique=True)))
    cat = draw(st.sampled_from(["user_annotation", "cpu_op"]))
    out = []
    for i in range(n):
        s, e = cuts[2 * i], cuts[2 * i + 1]
        out.append(_x(cat, f"ProfilerStep#{first + i}", s, max(e - s, 1), HOST_PID, HOST_TID,
                      **{"External id": 1 + i}))
    return out


def _x(cat: str, name: str, ts: int, dur: int, pid: Any, tid: Any, **args: Any) -> dict:
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


@st.composite
def jobs(draw: Any, max_ranks: int = 3, ns: bool | None = None) -> list[dict[str, Any]]:
    """A job's traces, one per rank, profiled over the same steps (``ns``: None draws it)."""
    world = draw(st.integers(1, max_ranks))
    n_windows = draw(st.sampled_from([0, 1, 2, 2, 3, 4]))
    first = draw(st.integers(1, 40))
    ns = draw(st.booleans()) if ns is None else ns
    return [draw(rank_trace(r, world, n_windows, first, ns)) for r in range(world)]


def write_job(traces: list[dict[str, Any]], folder: Path) -> list[Path]:
    """One ``rank<r>.json`` per trace (HTA reads every trace file in a folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in traces:
        p = folder / f"rank{t['distributedInfo']['rank']}.json"
        p.write_text(json.dumps(t))
        paths.append(p)
    return paths
