"""GIN graph-regression model whose loop pushes its loss to a metrics collector over a local
socket every 10 steps and waits for the acknowledgement; at step 210 the collector does not
answer and the push blocks for its full 5 s socket timeout (a real blocking ``recv`` that
times out, not a sleep), once. PATHOLOGICAL.

What it does: random "molecules": 10-24 atoms of 4 types, a random spanning tree plus ~20%
extra ring-closing bonds; the regression target is a fixed additive function of the graph
(per-atom-type contributions + per-bond-type contributions for the 10 unordered atom-type
pairs), divided by its std over 640 calibration graphs (not centred: a sum over atoms and
bonds has no offset), plus noise std 0.05. Batches of 32 graphs (disjoint union
with node offsets), fresh every step. Model: atom-type Embedding(4, 64); 3 GIN layers
(h' = MLP((1 + eps) h + sum of neighbours), MLP 64-64-64 with ReLU, learnable eps, LayerNorm);
sum-pool per graph; Linear(64, 1); MSE. Adam(2e-3), 400 steps. A collector thread answers
each push on a ``socket.socketpair()`` with an ack; the push at step 210 is the one it never
answers, so the training thread's ``recv`` (``settimeout(5.0)``) raises ``TimeoutError`` after
5 s, the loop logs it and goes on. The push happens after ``opt.step()`` and before
``rec.step()``, so the wait belongs to step 210.

Why ``step_time_outlier``: one step ~100x+ longer than the median, from a blocking call in the
training process itself, with no data wait and nothing periodic about it; dated at step 210.

What is TRUE of the run (measured twice on the shared 2-core machine, 18 s wall; figures
from the recorded ``steps`` table of the judged run, the second run in brackets):
- Step 210: 5.04 s [5.04 s], of which the push (the timed-out ``recv``) is 5.01-5.03 s and
  16.5 ms is CPU (the training thread is idle, blocked); ~345x the median [279x]. It is 43% of
  the 11.7 s of recorded step time.
- Every other step: median 14.6 ms (p10 12.7, p90 22, p99 29) [18.1 ms, p90 22.7]; the
  slowest are step 1 (140 ms, warm-up) and 52 (124 ms, the recorder's own profiler window),
  then nothing above ~31 ms (2.1x). The 39 other pushes (steps 0, 10, ..., 390) were
  acknowledged in <= 1-6 ms. No data loader; nothing periodic.
- Training is fine: the untrained sum-pooled output starts far off (loss 160, 70, 74, 27 at
  steps 0-3), then falls: 50-step means 9.61, 0.281, 0.157, 0.105, 0.090, 0.082, 0.083,
  0.071; 0.104 / 0.115 / 0.071 at steps 209-211 (the stall does not touch the numbers).
  Finite. RSS 390 -> 428 MB (414 by step 100, +14 MB at ~250, flat after).
"""

import argparse
import socket
import threading
import time

import torch
from torch import nn
from tracealyze.recorder import Recorder

HANG_STEP = 210

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "step_time_outlier", "first_step": 210, "tolerance": 1},
    ],
    "forbidden": ["dataloader_bottleneck", "memory_leak", "nonfinite", "gradient_explosion",
                  "loss_divergence", "straggler"],
}

STEPS, GRAPHS, ATOM_TYPES, DIM, PUSH_EVERY, TIMEOUT_S = 400, 32, 4, 64, 10, 5.0


def make_batch(gen, atom_w, bond_w, scale=(0.0, 1.0)):
    types, srcs, dsts, targets, owner, off = [], [], [], [], [], 0
    for g in range(GRAPHS):
        n = int(torch.randint(10, 25, (1,), generator=gen))
        t = torch.randint(0, ATOM_TYPES, (n,), generator=gen)
        parent = [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        src, dst = list(range(1, n)), parent
        for _ in range(max(1, n // 5)):
            a, b = torch.randint(0, n, (2,), generator=gen).tolist()
            if a != b:
                src.append(a)
                dst.append(b)
        s, d = torch.tensor(src), torch.tensor(dst)
        lo, hi = torch.minimum(t[s], t[d]), torch.maximum(t[s], t[d])
        pair = lo * ATOM_TYPES - lo * (lo - 1) // 2 + (hi - lo)
        y = atom_w[t].sum() + bond_w[pair].sum()
        types.append(t)
        srcs.append(torch.cat([s, d]) + off)
        dsts.append(torch.cat([d, s]) + off)
        targets.append(y)
        owner.append(torch.full((n,), g))
        off += n
    y = torch.stack(targets)
    y = (y - scale[0]) / scale[1] + 0.05 * torch.randn(GRAPHS, generator=gen)
    return (torch.cat(types), torch.stack([torch.cat(srcs), torch.cat(dsts)]),
            torch.cat(owner), y)


class GINLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.eps = nn.Parameter(torch.zeros(1))
        self.mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        self.norm = nn.LayerNorm(DIM)

    def forward(self, h, edges):
        agg = torch.zeros_like(h).index_add_(0, edges[1], h[edges[0]])
        return self.norm(h + self.mlp((1 + self.eps) * h + agg))


class GIN(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(ATOM_TYPES, DIM)
        self.layers = nn.ModuleList(GINLayer() for _ in range(3))
        self.head = nn.Linear(DIM, 1)

    def forward(self, types, edges, owner):
        h = self.emb(types)
        for layer in self.layers:
            h = layer(h, edges)
        pooled = torch.zeros(GRAPHS, DIM).index_add_(0, owner, h)
        return self.head(pooled).squeeze(1)


def collector(sock, hang_on):
    """Answers every push with b'ok', except the one for step ``hang_on`` (it hangs)."""
    buf = b""
    while True:
        data = sock.recv(4096)
        if not data:
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if int(line.split(b" ")[0]) != hang_on:
                sock.sendall(b"ok\n")


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(210)
    atom_w = torch.randn(ATOM_TYPES, generator=gen)
    bond_w = 0.5 * torch.randn(ATOM_TYPES * (ATOM_TYPES + 1) // 2, generator=gen)
    calib = torch.cat([make_batch(torch.Generator().manual_seed(9), atom_w, bond_w)[3]
                       for _ in range(20)])
    scale = (0.0, calib.std().item())   # a sum over atoms and bonds: no offset
    client, server = socket.socketpair()
    threading.Thread(target=collector, args=(server, HANG_STEP), daemon=True).start()
    client.settimeout(TIMEOUT_S)
    model = GIN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    losses, durs, pushes = [], [], {}
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        last = time.perf_counter()
        for step in range(STEPS):
            types, edges, owner, y = make_batch(gen, atom_w, bond_w, scale)
            loss = nn.functional.mse_loss(model(types, edges, owner), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % PUSH_EVERY == 0:
                t0 = time.perf_counter()
                client.sendall(f"{step} {loss.item():.5f}\n".encode())
                try:
                    client.recv(16)
                    outcome = "ok"
                except TimeoutError:
                    outcome = "timeout"
                    print(f"step {step}: metrics push timed out after {TIMEOUT_S} s")
                pushes[step] = (time.perf_counter() - t0, outcome)
            rec.step(loss=loss)
            now = time.perf_counter()
            durs.append(now - last)
            last = now
            losses.append(loss.item())
    client.close()
    other = [t for i, t in enumerate(durs) if i != HANG_STEP and i > 1]
    med = pct(other, 0.5)
    print(f"other steps: median {med * 1e3:.1f} ms, p90 {pct(other, 0.9) * 1e3:.1f}, p99 "
          f"{pct(other, 0.99) * 1e3:.1f}, max {max(other) * 1e3:.1f} at "
          f"{durs.index(max(other))}")
    print(f"step {HANG_STEP}: {durs[HANG_STEP]:.3f} s ({durs[HANG_STEP] / med:.0f}x median); "
          f"push {pushes[HANG_STEP]}")
    ok = [p for s, (p, o) in pushes.items() if o == "ok"]
    print(f"other pushes: {len(ok)}, max {max(ok) * 1e3:.2f} ms")
    total = sum(durs)
    print(f"total step time {total:.1f} s; step {HANG_STEP} is "
          f"{100 * durs[HANG_STEP] / total:.0f}% of it")
    top = sorted(range(len(durs)), key=lambda i: -durs[i])[:8]
    print("slowest steps", [(i, round(durs[i], 3)) for i in top])
    w = 50
    print("loss window means", [round(sum(losses[i:i + w]) / w, 4)
                                for i in range(0, len(losses), w)])


if __name__ == "__main__":
    main()
