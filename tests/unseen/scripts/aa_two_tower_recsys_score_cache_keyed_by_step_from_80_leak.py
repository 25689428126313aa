"""Two-tower retrieval model (user tower, item tower, in-batch softmax). After the 80-step
learning-rate warm-up, every step stores its user ids, item ids and the 96 x 96 in-batch score
matrix in a dict keyed by the step number, "for a calibration plot later". Every key is new
and nothing is ever removed, so the dict grows by one 37.5 KiB entry per step. LEAK from step
80 (~38 KiB/step of heap).

What it does: 1,000 users and 2,000 items with unit 8-d latent tastes. A user's click is
drawn from softmax(12 <u, v>) over all items. Each tower sees a 16-d noisy linear view of the
latents (side features) through an MLP 16->64->32, plus a per-id embedding (init std 0.01),
L2-normalised. Logits = user @ item.T / 0.1. Loss = cross-entropy against the diagonal.
Adam(3e-3) with linear warm-up over 80 steps, batch 96, 500 steps.

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Steps 0-79: heap 135.2-135.6 MiB (+0.003 MiB/step). RSS warms up 398 -> 406 (+0.06 to +0.10
  MiB/step over 0-79, most of it in the first 10 steps and around step 50-78).
- From step 80: 420 entries by step 499, 15.4 MiB of tensor data. Heap 135.4-135.5 at 80,
  136.2-136.3 at 100, 138.1-138.2 at 150, 140.1-140.2 at 200, 143.9-144.0 at 300, 147.7-147.9
  at 400, 151.5-151.6 at 499: +0.0384-0.0386 MiB/step over 80-179, 180-329 and 330-499 (linear).
- RSS 406 at step 80, 425-430 at 499 (+0.046 to +0.056 MiB/step over 80-499, in uneven
  steps).
- Training is healthy and unaffected: loss (in-batch CE, ln 96 = 4.56 at chance) 50-step
  means 3.85, 2.69, 2.42, 2.38, 2.27, 2.24, 2.18, 2.15, 2.14, 2.11; in-batch top-1 0.10 ->
  0.38. Finite.
- Root cause: a memory leak starting at step 80.
- About 5 s of training (9 s wall) on 2 shared cores, 1 thread.
"""

import argparse
import ctypes
import time

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 80, "tolerance": 25}],
          "forbidden": ["loss_divergence", "gradient_explosion", "nonfinite"]}

STEPS, BATCH, USERS, ITEMS, LATENT, DIM, FEAT = 500, 96, 1000, 2000, 8, 32, 16
WARMUP, CALIB_FROM, TEMP = 80, 80, 0.1

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


_MI = _mallinfo2()
_PROC = psutil.Process()


def memory_mib():
    """(RSS, heap) in MiB; heap = glibc mallinfo2 uordblks + hblkhd."""
    heap = float("nan")
    if _MI is not None:
        mi = _MI()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


def slope(trace, a, b, i):
    part = trace[a:b + 1]
    xm = (len(part) - 1) / 2
    return (sum((x - xm) * p[i] for x, p in enumerate(part))
            / sum((x - xm) ** 2 for x in range(len(part))))


class Tower(nn.Module):
    """Side features (16-d) through an MLP, plus a per-id embedding (init std 0.01)."""

    def __init__(self, feats):
        super().__init__()
        self.register_buffer("feats", feats)
        self.emb = nn.Embedding(feats.shape[0], DIM)
        nn.init.normal_(self.emb.weight, std=0.01)
        self.mlp = nn.Sequential(nn.Linear(FEAT, 64), nn.ReLU(), nn.Linear(64, DIM))

    def forward(self, ids):
        return F.normalize(self.mlp(self.feats[ids]) + self.emb(ids), dim=-1)


class TwoTower(nn.Module):
    def __init__(self, user_feats, item_feats):
        super().__init__()
        self.users = Tower(user_feats)
        self.items = Tower(item_feats)

    def forward(self, u, i):
        return self.users(u) @ self.items(i).T / TEMP          # (B, B) in-batch logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(8)
    # ground truth: latent tastes; a user's clicks ~ softmax(12 * <u, v>) over all items; the
    # towers see 16-d noisy linear views of the latents (side features), not the latents
    u_lat = F.normalize(torch.randn(USERS, LATENT, generator=g), dim=-1)
    v_lat = F.normalize(torch.randn(ITEMS, LATENT, generator=g), dim=-1)
    click_p = (12.0 * u_lat @ v_lat.T).softmax(-1)                  # (USERS, ITEMS)
    user_feats = u_lat @ torch.randn(LATENT, FEAT, generator=g) + 0.3 * torch.randn(
        USERS, FEAT, generator=g)
    item_feats = v_lat @ torch.randn(LATENT, FEAT, generator=g) + 0.3 * torch.randn(
        ITEMS, FEAT, generator=g)
    model = TwoTower(user_feats, item_feats)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    score_cache = {}             # step -> in-batch scores, for a calibration plot "later"
    trace = []
    t0 = time.time()
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            u = torch.randint(0, USERS, (BATCH,), generator=g)
            i = torch.multinomial(click_p[u], 1, generator=g).squeeze(1)
            logits = model(u, i)
            loss = F.cross_entropy(logits, torch.arange(BATCH))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if step >= CALIB_FROM:       # after the warm-up; nothing ever removes an entry
                score_cache[step] = {"users": u.clone(), "items": i.clone(),
                                     "scores": logits.detach().clone()}
            rec.step(loss=loss)
            acc = (logits.argmax(-1) == torch.arange(BATCH)).float().mean().item()
            rss, heap = memory_mib()
            trace.append((step, loss.item(), acc, rss, heap, len(score_cache)))
            if step % 25 == 0 or CALIB_FROM - 1 <= step <= CALIB_FROM + 1:
                print(f"step {step} loss {loss.item():.4f} in-batch top1 {acc:.2f} rss {rss:.1f} "
                      f"heap {heap:.1f} cached steps {len(score_cache)}", flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    entry = score_cache[CALIB_FROM]
    per = sum(v.numel() * v.element_size() for v in entry.values()) / 1024
    print(f"[cache] {len(score_cache)} entries, {per:.1f} KiB of tensor data each, "
          f"{per * len(score_cache) / 1024:.1f} MiB in all")
    for a, b in ((0, 79), (20, 79), (80, 179), (180, 329), (330, 499), (80, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 3):+.4f} MiB/step, heap "
              f"{slope(trace, a, b, 4):+.4f} MiB/step")
    for s in (0, 10, 25, 50, 78, 79, 80, 81, 90, 100, 150, 200, 300, 400, 499):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[3]:.1f} heap {t[4]:.1f} cached {t[5]}")
    for a in range(0, STEPS, 50):
        part = trace[a:a + 50]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: loss {sum(p[1] for p in part) / n:.4f} top1 "
              f"{sum(p[2] for p in part) / n:.3f} rss {min(p[3] for p in part):.1f}-"
              f"{max(p[3] for p in part):.1f} heap {min(p[4] for p in part):.1f}-"
              f"{max(p[4] for p in part):.1f}")


if __name__ == "__main__":
    main()
