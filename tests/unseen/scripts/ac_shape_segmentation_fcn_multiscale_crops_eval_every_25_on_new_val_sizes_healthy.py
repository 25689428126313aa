"""Semantic segmentation of synthetic scenes (discs / boxes / background) with a small
dilated FCN trained on multi-scale square crops (64, 80, 96 px) and validated every 25
steps on 4 full-size validation images, one at a time, each with its own size (56 images,
sizes from {72, 80, ..., 160}^2, no two alike). The validation passes at steps 24, 49, ...,
349 each meet 4 sizes never seen before; the passes at 374 and 399 revisit the first 8
images. Each new size makes oneDNN build and cache forward convolution primitives for it
(and grow its buffers when it is the largest yet): ~200-370 KiB of heap a size, so the heap
steps up at validation steps and is flat in between.
HEALTHY: bounded by the 56 + 3 shapes; not a leak. Validation runs inside the step (after
opt.step, before rec.step) under torch.no_grad with model.eval().

What it does: 6 scenes a batch of 2-5 objects with random colours on a textured
background; per-pixel cross-entropy. Model: conv 3->16, strided conv 16->32, dilated convs
(d2, d4) 32->32 (BN + ReLU each), 1x1 classifier, bilinear upsampling to the input size.
Adam(2e-3), 400 steps, one thread; mean IoU of the two object classes is passed as a
metric at validation steps. The model is called directly on tensors built in the loop.

What is TRUE of the run (measured with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd and RSS from psutil, right after rec.step; "floor" = the heap
once the step's batch, logits and loss are freed):
- Shapes: 3 training crops (met in the first steps) and 56 validation sizes; 17 steps met
  a new shape (the first 3 crops' steps and 14 validation passes), the last at step 349.
- Heap: 142.5 MiB at step 0 (the validation set is built first), 147.1 at 66, 152.1 at
  133, 154.7 at 200, 158.9 at 266, 161.9 at 333, 162.8 at 399 (+20 MiB).
- Where it rises (floor): steps 1-132 +8.93 MiB at 7 steps meeting 22 new shapes (2 new
  crops, 5 validation passes) vs +0.12 MiB over 125 other steps (1.0 KiB each);
  133-265 +7.17 at 5 passes / 20 sizes (1468 KiB a pass) vs +0.10 over 128 (0.8 KiB);
  266-399 +3.25 at 4 passes / 16 sizes (832 KiB a pass) vs +0.13 over 130 (1.0 KiB; the
  passes at 374 and 399 over known sizes included). Same numbers with
  ONEDNN_PRIMITIVE_CACHE_CAPACITY=8192 (the cache never fills here); with it set to 0
  the passes still add 0.87 / 0.99 / 0.36 MiB each by third (the rest of oneDNN's
  per-shape state).
- Not a leak: floor 161.06 MiB at step 359, 161.07 at 399; extended to 800 steps (no new
  size after 349), steps 400-799 add -0.03 MiB, RSS 520.6 MiB at step 400 and 525.9 at 799.
- RSS of this run: 437 MiB at step 0, 489 at 133, 501 at 266, 523 at 399.
- Training is fine: loss 1.31 at step 0, 40-step window means 0.64, 0.34, 0.23, 0.21,
  0.19, 0.14, 0.12, 0.10, 0.09, 0.08; validation mIoU 0.49 (step 49), 0.43, 0.60, 0.60,
  0.64, 0.82, 0.84 (349), 0.59 (399; 4 images a pass); finite throughout. About 16 s.
"""

import argparse
import ctypes
import random

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": True, "findings": []}

STEPS, BATCH, CLASSES = 400, 6, 3
CROPS = (64, 80, 96)                  # multi-scale square training crops
VAL_IMAGES, VAL_EVERY, VAL_PER_PASS = 56, 25, 4

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


def scenes(n, h, w, g):
    """n RGB scenes of h x w with 2-5 objects each: discs (class 1) and axis-aligned boxes
    (class 2) with their own colours, over a textured background (class 0); later objects
    cover earlier ones. Returns images (n, 3, h, w) and per-pixel labels (n, h, w)."""
    y = torch.arange(h).view(1, h, 1).float()
    x = torch.arange(w).view(1, 1, w).float()
    img = 0.3 * torch.rand(n, 3, 1, 1, generator=g) + 0.15 * torch.randn(n, 3, h, w, generator=g)
    lab = torch.zeros(n, h, w, dtype=torch.long)
    for _ in range(int(torch.randint(2, 6, (), generator=g))):
        u = torch.rand(n, 6, generator=g)
        cy, cx = (u[:, 0] * h).view(n, 1, 1), (u[:, 1] * w).view(n, 1, 1)
        size = (6 + u[:, 2] * min(h, w) / 5).view(n, 1, 1)
        disc = (y - cy) ** 2 + (x - cx) ** 2 < size ** 2
        box = ((y - cy).abs() < size) & ((x - cx).abs() < 0.7 * size)
        is_disc = (u[:, 3] < 0.5).view(n, 1, 1)
        m = torch.where(is_disc, disc, box)
        colour = 0.4 + 0.6 * torch.rand(n, 3, 1, 1, generator=g)
        img = torch.where(m.unsqueeze(1), colour + 0.1 * torch.randn(n, 3, h, w, generator=g),
                          img)
        lab = torch.where(m, torch.where(is_disc, 1, 2), lab)
    return img, lab


class TinyFCN(nn.Module):
    """Conv 3->16, strided conv 16->32, two dilated convs (d2, d4) at half resolution, a
    1x1 classifier, bilinear upsampling back to the input size: any image size goes in."""

    def __init__(self):
        super().__init__()
        def cbr(cin, cout, **kw):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, bias=False, **kw),
                                 nn.BatchNorm2d(cout), nn.ReLU())
        self.enc = nn.Sequential(cbr(3, 16, padding=1), cbr(16, 32, padding=1, stride=2),
                                 cbr(32, 32, padding=2, dilation=2),
                                 cbr(32, 32, padding=4, dilation=4))
        self.cls = nn.Conv2d(32, CLASSES, 1)

    def forward(self, x):
        return F.interpolate(self.cls(self.enc(x)), size=x.shape[-2:], mode="bilinear",
                             align_corners=False)


@torch.no_grad()
def evaluate(model, val, first):
    """Mean IoU of the foreground classes on VAL_PER_PASS validation images (one at a time,
    each at its own size), starting at index `first` of the validation set."""
    model.eval()
    inter = torch.zeros(CLASSES)
    union = torch.zeros(CLASSES)
    for i in range(first, first + VAL_PER_PASS):
        img, lab = val[i % len(val)]
        pred = model(img).argmax(1)
        for c in range(CLASSES):
            inter[c] += ((pred == c) & (lab == c)).sum()
            union[c] += ((pred == c) | (lab == c)).sum()
    model.train()
    return float((inter[1:] / union[1:].clamp(min=1)).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(8)
    pick = random.Random(21)
    # the validation set: full-size images, each with its own size (no two alike)
    sizes = pick.sample([(h, w) for h in range(72, 161, 8) for w in range(72, 161, 8)],
                        VAL_IMAGES)
    val = [scenes(1, h, w, g) for h, w in sizes]
    model = TinyFCN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    seen, rows, passes = set(), [], 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(args.steps):
            side = pick.choice(CROPS)
            new = int((side, side) not in seen)
            seen.add((side, side))
            x, y = scenes(BATCH, side, side, g)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            miou = None
            if (step + 1) % VAL_EVERY == 0:       # validation pass, before the step ends
                first = passes * VAL_PER_PASS
                for i in range(first, first + VAL_PER_PASS):
                    new += sizes[i % VAL_IMAGES] not in seen
                    seen.add(sizes[i % VAL_IMAGES])
                miou = evaluate(model, val, first)
                passes += 1
            rec.step(loss=loss, **({"val_miou": miou} if miou is not None else {}))
            heap, rss = heap_mib(), rss_mib()
            lv = loss.item()
            del x, y, logits, loss
            rows.append((new, heap, rss, lv, heap_mib()))
            if miou is not None and passes % 2 == 0:
                print(f"step {step} loss {lv:.3f} val mIoU {miou:.3f} shapes {len(seen)} "
                      f"heap {heap:.1f} MiB", flush=True)
    tell(rows, cuts=(STEPS // 3, 2 * STEPS // 3, STEPS))


if __name__ == "__main__":
    main()
