"""Session-based next-item recommender (GRU) whose item-embedding table grows with the
catalogue: 30,000 items at launch, and three catalogue launches of 30,000 items each at steps
60, 130 and 210 bring it to its cap of 120,000 rows (the code launches nothing past the cap).
The table is kept as shards of 30,000 rows and each launch appends a shard, which Adam gets
as a new parameter group, so host memory steps up three times (the shard, its dense
gradient, Adam's two moments for it: 4 x 7.3 MiB = 29.3 MiB) and is flat in between and
after step 210. HEALTHY (growth by design up to a cap, not a leak).

What it does: items belong to 100 genres (item i: genre i % 100); a session is 9 items of one
genre, each drawn from that genre's live items with Zipf(1.05) popularity over a fixed random
ranking of the genre's 1,200 items (popularity does not depend on when an item launches).
Input: the first 8 items; target: the 9th. Model: item embeddings (the shards concatenated,
rows x 64) -> GRU(64 -> 128) -> Linear(128 -> 64); score = dot product with item embeddings;
sampled softmax over the target and 512 negatives drawn uniformly from the live catalogue
(shared by the batch). Batches of 96, Adam(2e-3) on all parameters (the item table's
gradient is dense: 7.3 MiB per 30,000 rows), 400 steps. The first rows start as N(0, 0.05);
a launched item's row starts at its genre's centroid plus N(0, 0.01) noise (cold start).

What is TRUE of the run (measured; heap = glibc mallinfo2 uordblks + hblkhd, RSS from psutil,
both right after rec.step):
- The heap is flat between launches and steps up by 29.3 MiB at each: 157.1-157.3 MiB over
  steps 0-59, 186.6 over 60-129, 215.9-216.2 over 130-209, 245.5 from 210 to 399 (slope
  0.000 MiB/step over 210-399).
- RSS is noisy from step to step once the table is 60,000 rows or more: the step's
  concatenated table and its dense gradient (15-29 MiB blocks) are given back to the OS and
  taken again, so it moves by 15-95 MiB between consecutive steps. Ranges per 40-step window:
  445-477 MiB (steps 0-39), 502-612 (80-119), 531-664 (160-199), 560-772 (240-399); 632.9
  at step 399; no trend after the last launch (slopes +0.06 MiB/step over 210-399, -0.18
  over 300-399).
- Training is fine: loss 6.24 at step 0 (ln 513 = 6.24), 5.16 at step 59; each launch brings
  untrained items and lifts it by about 0.5 (5.16 -> 5.68 at step 60, 5.25 -> 5.86 at 130,
  5.10 -> 5.61 at 210), after which it falls again; means per 40-step window 5.98, 5.57,
  5.54, 5.37, 5.26, 5.34, 5.26, 5.06, 4.74, 4.87; finite throughout. About 40 s.
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, DIM, HIDDEN, GENRES, SESSION, NEGATIVES = 400, 96, 64, 128, 100, 9, 512
LAUNCH_ROWS, LAUNCHES, CAP = 30_000, (60, 130, 210), 120_000

class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, live malloc heap) in MiB: psutil's RSS and glibc's mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MALLINFO2 is not None:
        mi = _MALLINFO2()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(part, i):
    """Least-squares slope of column i of part (MiB per step)."""
    if len(part) < 2:
        return 0.0
    xm = (len(part) - 1) / 2
    den = sum((x - xm) ** 2 for x in range(len(part)))
    return sum((x - xm) * p[i] for x, p in enumerate(part)) / den


def report(trace, marks, segments):
    """Print the measured truths from trace, a list of (loss, RSS MiB, heap MiB) per step."""
    n = len(trace)
    for s in marks:
        loss, rss, heap = trace[s]
        print(f"[mem] step {s}: loss {loss:.4f} rss {rss:.1f} MiB heap {heap:.1f} MiB")
    w = max(n // 10, 1)
    for a in range(0, n, w):
        part = trace[a:a + w]
        print(f"[win] steps {a}-{a + len(part) - 1}: loss mean "
              f"{sum(p[0] for p in part) / len(part):.4f}"
              f" rss {min(p[1] for p in part):.1f}-{max(p[1] for p in part):.1f}"
              f" heap {min(p[2] for p in part):.1f}-{max(p[2] for p in part):.1f}")
    for a, b in segments:
        part = trace[a:b + 1]
        print(f"[slope] steps {a}-{b}: rss {slope(part, 1):+.3f} MiB/step, "
              f"heap {slope(part, 2):+.3f} MiB/step")
    jumps = [(s, trace[s][1] - trace[s - 1][1], trace[s][2] - trace[s - 1][2])
             for s in range(1, n) if abs(trace[s][1] - trace[s - 1][1]) >= 8
             or abs(trace[s][2] - trace[s - 1][2]) >= 4]
    print("[jumps] RSS moves of 8 MiB or heap moves of 4 MiB or more (step:rss/heap): "
          + ", ".join(f"{s}:{d:+.0f}/{h:+.1f}" for s, d, h in jumps[:40]))


def popularity(g):
    """(GENRES, CAP // GENRES) Zipf(1.05) weights: each genre's items (slot k is item
    k * GENRES + genre) ranked in a random order that ignores when they launch."""
    per_genre = CAP // GENRES
    zipf = 1.0 / torch.arange(1, per_genre + 1, dtype=torch.float64) ** 1.05
    ranks = torch.stack([torch.randperm(per_genre, generator=g) for _ in range(GENRES)])
    return zipf[ranks].float()


def sample_sessions(weights, live, g):
    """(BATCH, SESSION) item ids: one genre per session, items of that genre among the first
    `live` items, drawn by popularity."""
    genre = torch.randint(0, GENRES, (BATCH,), generator=g)
    slot = torch.multinomial(weights[genre, :live // GENRES], SESSION, replacement=True,
                             generator=g)
    return slot * GENRES + genre[:, None]


class ItemTable(nn.Module):
    """Item embeddings kept as shards of LAUNCH_ROWS rows; a launch appends a shard."""

    def __init__(self):
        super().__init__()
        self.shards = nn.ModuleList()
        self.add_shard()

    def add_shard(self):
        shard = nn.Embedding(LAUNCH_ROWS, DIM)
        nn.init.normal_(shard.weight, std=0.05)
        self.shards.append(shard)
        return shard

    def forward(self, ids):
        table = torch.cat([s.weight for s in self.shards])
        return F.embedding(ids, table)


class SessionGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.items = ItemTable()
        self.gru = nn.GRU(DIM, HIDDEN, batch_first=True)
        self.proj = nn.Linear(HIDDEN, DIM)

    def forward(self, history):
        _, h = self.gru(self.items(history))
        return self.proj(h[-1])


def grow(model, opt, g):
    """A catalogue launch: a new shard of rows, each started at its genre's centroid (cold
    start), given to Adam as a new parameter group (its moments are created at its first
    step)."""
    with torch.no_grad():
        table = torch.cat([s.weight for s in model.items.shards])
        centroid = table.reshape(-1, GENRES, DIM).mean(0)          # item i: genre i % GENRES
        shard = model.items.add_shard()
        shard.weight.copy_(centroid.repeat(LAUNCH_ROWS // GENRES, 1)
                           + 0.01 * torch.randn(LAUNCH_ROWS, DIM, generator=g))
    opt.add_param_group({"params": list(shard.parameters())})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(6)
    weights = popularity(g)
    model = SessionGRU()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    live, trace = LAUNCH_ROWS, []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            if step in LAUNCHES and live < CAP:
                grow(model, opt, g)
                live += LAUNCH_ROWS
                print(f"step {step}: catalogue launch, {live:,} items", flush=True)
            sessions = sample_sessions(weights, live, g)
            history, target = sessions[:, :-1], sessions[:, -1]
            negatives = torch.randint(0, live, (NEGATIVES,), generator=g)
            user = model(history)
            pos = (user * model.items(target)).sum(1, keepdim=True)
            neg = user @ model.items(negatives).T
            logits = torch.cat([pos, neg], 1)
            loss = F.cross_entropy(logits, torch.zeros(BATCH, dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
            hit = (logits.argmax(1) == 0).float().mean()
            rec.step(loss=loss, hit_at_1=hit, catalogue=live)
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if step % 25 == 0 or step - 1 in LAUNCHES or step + 1 in LAUNCHES \
                    or step == STEPS - 1:
                print(f"step {step} items {live} loss {loss.item():.4f} hit@1 {hit.item():.3f} "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    report(trace, marks=(0, 59, 60, 129, 130, 209, 210, 250, 300, 350, 399),
           segments=((0, 59), (60, 129), (130, 209), (210, 399), (300, 399)))


if __name__ == "__main__":
    main()
