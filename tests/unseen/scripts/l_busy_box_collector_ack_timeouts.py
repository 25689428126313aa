"""1-D CNN on a machine kept busy by two other processes; its own metrics push blocks 4 times.

What it does: a small 1-D CNN (conv 1->8 k7, conv 8->16 k5 stride 2, conv 16->16 k3,
global average pool, linear 16 -> 4, ReLU) learns to tell four frequencies of noisy, randomly
phased sine waves apart (length 128, 8192 synthetic in-memory samples, batch 64 cut by a plain
generator wrapped with ``rec.wrap_loader``); AdamW lr 2e-3, 250 optimizer steps. Before the
Recorder starts, the script launches two other Python processes that spin in a busy loop
(``subprocess.Popen([sys.executable, "-c", "while True: pass"])``) and keep both cores of the
machine busy for the WHOLE run; they are killed in a ``finally``. After ``opt.step()`` of every
step and before ``rec.step()``, the loop pushes the step's loss to a metrics collector over a
local socket (a ``socketpair``); at four irregular steps, 31, 112, 147 and 213 (gaps 81, 35,
66: no period), it waits for the collector's acknowledgement, which never comes, so the
blocking ``recv`` runs into its timeout (0.45, 0.55, 0.50 and 0.60 s) with the training thread
idle in the kernel. That is the training process's own blocking I/O, whatever the competitors
do.

What is TRUE of the run (measured three times, 2 shared CPU cores with the two spinners on
them, 10-14 s wall): ordinary steps take ~9-17 ms (median 8.7-16.8 ms, p90 15-30 ms), of which
~5-7 ms is the process's CPU time and ~4-10 ms the training thread waiting in the run queue for
a core the spinners hold (0.95-2.6 s of run-queue wait in all). Steps 31, 112, 147 and 213 take
0.455-0.46, 0.556-0.565, 0.507-0.519 and 0.613-0.627 s (27-71x the median) with only 4-9 ms of
CPU and 0-13 ms of run-queue wait each: the rest is the training thread idle in ``recv``. They
are 2.14-2.16 s of 4.5-6.7 s of recorded step time (32-48%). No other step exceeds ~4.7x the
median (warm-up steps 0-1 19-78 ms; 3-6 other steps above 2x, scattered). So: four one-off
stalls at irregular steps, first at step 31, from the training process's own blocking I/O (fix:
push metrics asynchronously, never wait for the collector on the training thread), on top of a
machine that is busy all the time (which only makes every step uniformly slower). Data wait is
near zero (0.04-0.05 s in all), RSS levels off (421 -> 430-432 MB, flat from step ~100) and
training is healthy: loss 1.37 -> 0.007.
"""

import argparse
import math
import signal
import socket
import subprocess
import sys
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 31, "tolerance": 1},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "loss_spike", "loss_divergence",
                  "gradient_explosion", "nonfinite"],
}

STEPS, BATCH, LENGTH = 250, 64, 128
ACK_WAITS = {31: 0.45, 112: 0.55, 147: 0.50, 213: 0.60}   # step -> recv timeout, seconds
SPIN = "while True: pass"


class WaveCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 8, 7, padding=3), nn.ReLU(),
            nn.Conv1d(8, 16, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(16, 16, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def make_waves(n, g):
    y = torch.randint(0, 4, (n,), generator=g)
    freq = (2.0 + 3.0 * y.float())[:, None]                     # 2, 5, 8, 11 cycles
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    t = torch.linspace(0, 1, LENGTH)[None, :]
    x = torch.sin(2 * math.pi * freq * t + phase) + 0.6 * torch.randn(n, LENGTH, generator=g)
    return x[:, None, :], y


def batches(x, y, g):
    while True:
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x) - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            yield x[idx], y[idx]


def push_metrics(sock, step, loss):
    """Sends one line to the collector; on the ACK_WAITS steps waits for an ack that never
    arrives (the collector is wedged), so recv blocks until its timeout."""
    sock.sendall(f"{step} {loss:.5f}\n".encode())
    if step not in ACK_WAITS:
        return 0.0
    sock.settimeout(ACK_WAITS[step])
    t0 = time.perf_counter()
    try:
        sock.recv(16)
    except TimeoutError:
        pass
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(5)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    x, y = make_waves(8192, g)

    model = WaveCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()

    ours, collector = socket.socketpair()
    collector.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    spinners = []
    try:
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
        time.sleep(0.5)                                  # the machine is busy before step 0
        with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
            for step, (xb, yb) in enumerate(rec.wrap_loader(batches(x, y, g))):
                if step >= STEPS:
                    break
                loss = loss_fn(model(xb), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                waited = push_metrics(ours, step, loss.item())
                collector.recv(1 << 16)                  # drain, so sendall never blocks
                if waited:
                    print(f"step {step}: collector ack timed out after {waited:.3f} s, "
                          f"loss {loss.item():.3f}")
                rec.step(loss=loss)
    finally:
        for p in spinners:
            p.send_signal(signal.SIGKILL)
        for p in spinners:
            p.wait()
        ours.close()
        collector.close()


if __name__ == "__main__":
    main()
