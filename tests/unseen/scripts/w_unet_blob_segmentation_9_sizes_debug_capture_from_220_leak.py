"""U-Net segmenting soft-edged ellipses in 1-channel images of 9 sizes (height and width each
48, 64 or 80, drawn per batch). From step 220 a "failure viewer" capture is switched on: each
step appends the batch's input, its bottleneck features and its predicted mask (all detached
copies) to a list that was meant to be written to disk and cleared, and never is. HOST MEMORY
LEAK from step 220 (~594 KiB a step, depending on the batch's size); flat before it.

What it does: 6 images per batch, 2-5 ellipses (radii 3 + up to 1/6 of the side) at +1.2 on
smooth clutter (bilinear-upsampled noise, x0.5) plus N(0, 0.4) noise; target = the ellipse
mask. Model: 3-level U-Net (double conv 3x3 + InstanceNorm + SiLU at 16, 32, 64 channels, max
pools, transposed-conv upsampling with skips), 1x1 output. Loss: BCE-with-logits + soft Dice.
AdamW(2e-3, wd 1e-4), 460 steps.

What is TRUE of the run (measured once with the recorder on, standard preset; heap = glibc
mallinfo2 uordblks + hblkhd, RSS from psutil, both right after rec.step):
- Sizes: 9, first seen at steps 0, 1, 2, 3, 6, 7, 13, 17, 21. Capture: 240 steps, 139.3 MiB
  at the end (594 KiB/step on average).
- Heap: 129.5 MiB at step 0, 141.3 at 25, then flat 140.7-142.2 MiB over steps 46-219 (slope
  +0.001 MiB/step over 50-219); 141.8 at 220, 142.6 at 221, 160.1 at 250, 187.2 at 300, 216.8
  at 350, 246.2 at 400, 280.6 at 459: +0.580 MiB/step over 220-459 (+0.565 over 220-339,
  +0.585 over 340-459), no plateau.
- RSS: 471.7 MiB at step 0, 568.2 by step 46, 572.3 at 100, 588.2 from step 133 (+14) to step
  ~270: flat over 133-229. The first ~60 MiB of captured tensors fill free memory the
  allocator already held, so RSS stays at 583.9-588.2 until step ~330, then climbs: 599.0 at
  350, 627.6 at 400, 658.6 at 459 (+0.614 MiB/step over 340-459).
- Training is fine: loss 1.49 at step 0, 46-step window means 1.00, 0.67, 0.37, 0.25, 0.13,
  0.12, 0.09, 0.05, 0.06, 0.04; IoU 0.98 at the end; finite throughout. About 37 s on 2 cores.
- A second recording (the harness's run) gave the same heap figures (within 0.4 MiB) and RSS
  within 15 MiB (602.6 flat over steps ~130-219, 593.5 at 300, 622.2 at 400, 659.7 at 459).
"""

import argparse
import ctypes

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 220, "tolerance": 23},
    ],
}

STEPS, BATCH, CAPTURE_FROM = 460, 6, 220
SIDES = (48, 64, 80)                            # 9 (h, w) sizes

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


def make_batch(g):
    """BATCH 1-channel images of one (h, w): 2-5 soft-edged ellipses (the foreground to segment)
    on smooth clutter plus noise; target = the ellipses' mask."""
    h = SIDES[int(torch.randint(0, len(SIDES), (1,), generator=g))]
    w = SIDES[int(torch.randint(0, len(SIDES), (1,), generator=g))]
    yy = torch.arange(h, dtype=torch.float32).view(1, h, 1)
    xx = torch.arange(w, dtype=torch.float32).view(1, 1, w)
    mask = torch.zeros(BATCH, h, w)
    for _ in range(int(torch.randint(2, 6, (1,), generator=g))):
        cy = torch.rand(BATCH, 1, 1, generator=g) * h
        cx = torch.rand(BATCH, 1, 1, generator=g) * w
        ry = 3 + torch.rand(BATCH, 1, 1, generator=g) * h / 6
        rx = 3 + torch.rand(BATCH, 1, 1, generator=g) * w / 6
        mask = torch.maximum(mask, (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1).float())
    low = torch.randn(BATCH, 1, h // 8, w // 8, generator=g)
    clutter = F.interpolate(low, size=(h, w), mode="bilinear", align_corners=False)
    img = 1.2 * mask.unsqueeze(1) + 0.5 * clutter + 0.4 * torch.randn(BATCH, 1, h, w, generator=g)
    return img, mask.unsqueeze(1)


def double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.InstanceNorm2d(cout, affine=True),
                         nn.SiLU(), nn.Conv2d(cout, cout, 3, padding=1),
                         nn.InstanceNorm2d(cout, affine=True), nn.SiLU())


class UNet(nn.Module):
    """3-level U-Net (16-32-64 channels, 2x2 max pools, transposed-conv upsampling)."""

    def __init__(self):
        super().__init__()
        self.d1, self.d2, self.bott = double_conv(1, 16), double_conv(16, 32), double_conv(32, 64)
        self.u2, self.c2 = nn.ConvTranspose2d(64, 32, 2, 2), double_conv(64, 32)
        self.u1, self.c1 = nn.ConvTranspose2d(32, 16, 2, 2), double_conv(32, 16)
        self.out = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        s1 = self.d1(x)
        s2 = self.d2(F.max_pool2d(s1, 2))
        b = self.bott(F.max_pool2d(s2, 2))
        u = self.c2(torch.cat([self.u2(b), s2], 1))
        u = self.c1(torch.cat([self.u1(u), s1], 1))
        return self.out(u), b


def dice_loss(logit, target):
    p = logit.sigmoid()
    inter = (p * target).sum((1, 2, 3))
    return (1 - (2 * inter + 1) / (p.sum((1, 2, 3)) + target.sum((1, 2, 3)) + 1)).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(53)
    model = UNet()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    captured = []    # debug capture: meant to be written to disk and cleared; it never is
    trace, seen, first_seen = [], set(), []
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        for step in range(STEPS):
            x, m = make_batch(g)
            logit, bottleneck = model(x)
            loss = F.binary_cross_entropy_with_logits(logit, m) + dice_loss(logit, m)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step >= CAPTURE_FROM:
                # "keep inputs, bottleneck and predictions of recent batches for the failure
                # viewer" switched on for the second half of training; the flush that was meant
                # to write and clear the list was never written
                captured.append((x.clone(), bottleneck.detach(), logit.detach().sigmoid()))
            with torch.no_grad():
                iou = (((logit > 0) & (m > 0.5)).sum() / ((logit > 0) | (m > 0.5)).sum()
                       .clamp_min(1))
            rec.step(loss=loss, iou=iou, height=x.shape[2], width=x.shape[3])
            rss, heap = memory_mib()
            trace.append((loss.item(), rss, heap))
            if tuple(x.shape[2:]) not in seen:
                seen.add(tuple(x.shape[2:]))
                first_seen.append(step)
            if step % 25 == 0 or step in (CAPTURE_FROM - 1, CAPTURE_FROM + 1) or step == STEPS - 1:
                held = sum(t.numel() * 4 for c in captured for t in c) / 2 ** 20
                print(f"step {step} size {tuple(x.shape[2:])} loss {loss.item():.4f} "
                      f"iou {iou.item():.3f} captured {len(captured)} ({held:.1f} MiB) "
                      f"rss {rss:.1f} MiB heap {heap:.1f} MiB", flush=True)
    held = sum(t.numel() * 4 for c in captured for t in c)
    report(trace, marks=(0, 50, 100, 150, 200, 219, 220, 250, 300, 350, 400, STEPS - 1),
           segments=((0, 99), (100, 219), (50, 219), (220, STEPS - 1), (220, 339),
                     (340, STEPS - 1)))
    print(f"[shapes] {len(seen)} sizes, first seen at steps {first_seen}; captured "
          f"{held / 2 ** 20:.1f} MiB in {len(captured)} steps "
          f"({held / max(len(captured), 1) / 1024:.0f} KiB/step)")


if __name__ == "__main__":
    main()
