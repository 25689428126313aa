"""Protein-family classifier (transformer encoder with ALiBi attention biases) on variable
length sequences, with a real leak from step 200: an embedding-drift logger stores the
final hidden states of two proteins of every batch in a dict keyed by step (2 x n x 64
floats, 512 n bytes: ~121 KiB a step) and never prunes it. Shapes vary all along: a
cropping curriculum lets the crop window grow from 64 to 320 residues over steps 0-380 and
batches are padded to their longest sequence (rounded up to 4), so new padded lengths keep
arriving; the model caches the ALiBi bias per length (4 x n x n floats: 256 KiB at n =
128, 1.6 MiB at n = 320), which is healthy per-shape growth. LEAK from step 200.

What it does: 6 families, each defined by three motifs (5-8 residues) planted at random
positions in random sequences (log-normal lengths around 150 residues, cropped to a random
window). Batches of 6, padded; key-padding mask, masked mean pooling. Model: embedding
21->64, 2 pre-LN blocks (4 heads, ALiBi slopes 2^-2 ... 2^-8, FFN 64->128->64), linear
64->6. AdamW(1e-3, wd 0.01), 420 steps, one thread; called directly on the tensors.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits, hidden states and loss are freed):
- Lengths: 65 distinct by step 381 (the last new one), first met 19 / 17 / 18 / 11 times
  in the four quarters; 30 new-length steps from step 200 on. ALiBi cache 42.2 MiB at the
  end; the drift log 220 entries, 26.0 MiB.
- Heap: 127.1 MiB at step 0, 129.6 at 70, 134.1 at 140, 142.4 at 210, 159.8 at 280, 181.9
  at 350, 200.0 at 419.
- Where it rises (floor): steps 1-104 +4.16 MiB at 18 new-length steps (236 KiB each) vs
  +0.31 MiB over 86 repeat steps (3.6 KiB each); 105-199 +8.05 at 16 (515 KiB) vs +0.08
  over 79 (1.1 KiB); 200-419 +37.71 at 30 new-length steps (1287 KiB each) and +22.25 MiB
  over 190 repeat steps (119.9 KiB each: the leak).
- Control (the same script with the dict disabled): steps 200-419 add +33.55 MiB at the 30
  new lengths (1145 KiB each) and +0.30 MiB over the 190 repeat steps (1.6 KiB each).
- RSS: 397 MiB at step 0, 464 at 140, 506 at 210, 560 at 280, 696 at 350, 785 at 419 (it
  also climbs in the control, +156 MiB over the repeat steps after 200 with the live heap
  flat: allocator retention of the n x n attention buffers; the heap is the measure).
- Training is slow but works: loss 1.76 at step 0 (chance 1.79), 42-step window means
  1.81, 1.72, 1.70, 1.62, 1.59, 1.54, 1.43, 1.44, 1.48, 1.39 (crops often cut motifs
  away); finite throughout. About 17 s on 2 cores.
"""

import argparse
import ctypes
import math
import random

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 200, "tolerance": 21}]}

STEPS, BATCH, FAMILIES, AA, PAD = 420, 6, 6, 21, 0
MULTIPLE = 4                                # batches are padded to their longest
                                            # sequence, rounded up to a multiple of 4
CROP_START, CROP_END, CROP_GROW_UNTIL = 64, 320, 380   # curriculum: proteins are cropped to
                                            # a window that grows from 64 to 320 residues
D, HEADS, LAYERS = 64, 4, 2
DRIFT_FROM = 200                            # embedding-drift logging is switched on here

# ---- memory measurement (measuring only; the recorder does not see any of this) ----------
class _MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]


try:
    _MI2 = ctypes.CDLL(None).mallinfo2
    _MI2.restype = _MallInfo2
except (OSError, AttributeError):     # not glibc: heap numbers read nan
    _MI2 = None
_ME = psutil.Process()


def heap_mib():
    """Live malloc heap (glibc mallinfo2: uordblks + hblkhd), MiB."""
    if _MI2 is None:
        return float("nan")
    m = _MI2()
    return (m.uordblks + m.hblkhd) / 2 ** 20


def rss_mib():
    return _ME.memory_info().rss / 2 ** 20


def tell(rows, cuts):
    """Print what the run did to memory. rows: one (new_shape, heap_at_step_end, rss, loss,
    heap_floor) per optimizer step; the heap rise is split into the spans between cuts and,
    in each, into steps that met a new shape and steps that only repeated known ones."""
    n = len(rows)
    first = [s for s, r in enumerate(rows) if r[0]]
    print(f"[shapes] {sum(int(r[0]) for r in rows)} distinct shapes; {len(first)} optimizer "
          f"steps met a new one, the last at step {first[-1]}; "
          "per quarter: " + ", ".join(str(sum(a <= s < a + (n + 3) // 4 for s in first))
                                     for a in range(0, n, (n + 3) // 4)))
    for s in sorted({0, n // 6, n // 3, n // 2, 2 * n // 3, 5 * n // 6, n - 1}):
        _, heap, rss, loss, floor = rows[s]
        print(f"[mem] step {s}: heap {heap:.2f} MiB (floor {floor:.2f}) rss {rss:.1f} MiB "
              f"loss {loss:.4f} new-shape steps so far {sum(x <= s for x in first)}")
    edges = sorted({1, *cuts, n})
    for i in range(len(edges) - 1):
        a, b = edges[i], edges[i + 1]
        out = [f"{sum(int(rows[s][0]) for s in range(a, b))} new shapes"]
        for col, name in ((4, "floor"), (1, "heap"), (2, "rss")):
            d_new = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if rows[s][0]]
            d_rep = [rows[s][col] - rows[s - 1][col] for s in range(a, b) if not rows[s][0]]
            out.append(f"{name} {sum(d_new):+.2f} MiB over {len(d_new)} new "
                       f"({1024 * sum(d_new) / max(len(d_new), 1):+.0f} KiB each) / "
                       f"{sum(d_rep):+.2f} over {len(d_rep)} repeat "
                       f"({1024 * sum(d_rep) / max(len(d_rep), 1):+.1f} KiB each)")
        print(f"[rise] steps {a}-{b - 1}: " + "; ".join(out))
    if first[-1] < n - 20:
        a = first[-1] + 10
        print(f"[after last new shape] floor {rows[a][4]:.2f} MiB at step {a} -> "
              f"{rows[-1][4]:.2f} at {n - 1} ({(rows[-1][4] - rows[a][4]) * 1024:+.0f} KiB)")
    w = max(n // 10, 1)
    print("[loss] window means: " + ", ".join(
        f"{sum(r[3] for r in rows[a:a + w]) / len(rows[a:a + w]):.3f}" for a in range(0, n, w)))


class Families:
    """FAMILIES protein families: each has three motifs (5-8 residues) that its members
    carry at random positions in an otherwise random sequence (residues 1-20; 0 pads)."""

    def __init__(self, r):
        self.r = r
        self.motifs = [[[r.randint(1, AA - 1) for _ in range(r.randint(5, 8))]
                        for _ in range(3)] for _ in range(FAMILIES)]

    def sequence(self, fam, n):
        r = self.r
        seq = [r.randint(1, AA - 1) for _ in range(n)]
        for m in self.motifs[fam]:
            if r.random() < 0.8:
                at = r.randint(0, n - len(m))
                seq[at:at + len(m)] = m
        return seq

    def batch(self, crop):
        """BATCH proteins (lengths log-normal around 150 residues), each cropped to a random
        window of at most `crop` residues, padded to the longest."""
        r = self.r
        fams = [r.randrange(FAMILIES) for _ in range(BATCH)]
        seqs = []
        for f in fams:
            s = self.sequence(f, min(600, max(40, int(r.lognormvariate(math.log(150), 0.5)))))
            at = r.randint(0, max(0, len(s) - crop))
            seqs.append(s[at:at + crop])
        n = -(-max(len(s) for s in seqs) // MULTIPLE) * MULTIPLE
        ids = torch.full((BATCH, n), PAD, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
        return ids, torch.tensor(fams)


class AlibiEncoder(nn.Module):
    """Bidirectional transformer encoder (2 pre-LN blocks, 4 heads, d=64) with ALiBi
    attention biases (-slope * |i - j| per head), masked mean pooling, family logits. The
    ALiBi bias depends only on the padded length: built once per length, kept in a cache."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(AA, D, padding_idx=PAD)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(D), "qkv": nn.Linear(D, 3 * D), "out": nn.Linear(D, D),
            "ln2": nn.LayerNorm(D), "ff": nn.Sequential(nn.Linear(D, 128), nn.GELU(),
                                                        nn.Linear(128, D))})
            for _ in range(LAYERS))
        self.head = nn.Linear(D, FAMILIES)
        self.slopes = torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])
        self._alibi = {}                     # padded length -> (HEADS, n, n) float bias

    def alibi(self, n):
        if n not in self._alibi:
            pos = torch.arange(n, dtype=torch.float32)
            dist = (pos.view(1, -1) - pos.view(-1, 1)).abs()
            self._alibi[n] = -self.slopes.view(HEADS, 1, 1) * dist
        return self._alibi[n]

    def forward(self, ids):
        b, n = ids.shape
        keep = ids != PAD
        bias = self.alibi(n).unsqueeze(0).masked_fill(~keep.view(b, 1, 1, n), float("-inf"))
        h = self.emb(ids)
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](h)).view(b, n, 3, HEADS, D // HEADS).unbind(2)
            att = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // HEADS) + bias
            ctx = torch.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v).reshape(b, n, D)
            h = h + blk["out"](ctx)
            h = h + blk["ff"](blk["ln2"](h))
        pooled = (h * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True)
        return self.head(pooled), h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Families(random.Random(17))
    model = AlibiEncoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    drift_log = {}            # step -> the batch's final hidden states, for drift analysis
    rows = []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            crop = CROP_START + int((CROP_END - CROP_START) * min(1.0, step / CROP_GROW_UNTIL))
            ids, fam = data.batch(crop)
            new = int(ids.shape[1] not in model._alibi)
            logits, hidden = model(ids)
            loss = F.cross_entropy(logits, fam)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= DRIFT_FROM:
                # THE BUG: meant to sample a few steps for an embedding-drift plot, it keeps
                # every step's hidden states of two proteins (2 x length x D floats) and
                # never prunes the dict
                drift_log[step] = hidden[:2].detach().clone()
            rec.step(loss=loss)
            heap, rss = heap_mib(), rss_mib()
            lv = loss.item()
            del ids, fam, logits, hidden, loss
            rows.append((new, heap, rss, lv, heap_mib()))
            if step % 50 == 0:
                print(f"step {step} loss {lv:.3f} lengths {len(model._alibi)} "
                      f"kept {len(drift_log)} heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(STEPS // 4, DRIFT_FROM, STEPS))
    kept = sum(t.numel() * 4 for t in drift_log.values())
    cache = sum(t.numel() * 4 for t in model._alibi.values())
    print(f"[held] drift log {len(drift_log)} entries {kept / 2 ** 20:.2f} MiB "
          f"({kept / max(len(drift_log), 1) / 1024:.0f} KiB each); ALiBi cache "
          f"{len(model._alibi)} lengths {cache / 2 ** 20:.2f} MiB")


if __name__ == "__main__":
    main()
