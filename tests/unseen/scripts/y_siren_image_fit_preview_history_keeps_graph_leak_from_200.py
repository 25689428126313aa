"""SIREN (Sitzmann et al. 2020: sine activations, omega_0 = 30, their uniform init) fitting a
64x64 synthetic grayscale image (rings + a tilted sinusoid + two Gaussian blobs) as a
function of pixel coordinates in [-1, 1]^2: 2 -> 64 -> 64 -> 64 -> 64 -> 1 (four sine layers,
linear output). Each step draws 1,024 random pixels; MSE loss; Adam (lr 1e-4, constant);
500 steps.

The leak: a "live preview" added for a progress GIF. From step 200 on (after the first
phase) every step renders a 24x24 thumbnail, `model(preview_coords)`, and appends it to a
list — outside torch.no_grad() and without .detach(). Nothing ever calls backward on it, so
each thumbnail keeps its whole autograd graph alive with every tensor its forward saved for
backward (the 576 x 64 inputs and pre-activations of each layer, ~1 MiB), and memory grows by
a fixed amount every step from step 200 to the end. The list is read only after training.

What is TRUE of the run (measured by this script: heap = glibc mallinfo2 uordblks + hblkhd,
RSS from psutil, both right after rec.step):
- Steps 0-199: heap 125.0 MiB at step 0, 125.3 from step ~50 to 199 (slope +0.000
  MiB/step over 100-199); RSS 388.9 at step 0, warming up to 401.0 at 199 (+0.07 MiB/step
  over 0-99, +0.012 over 100-199).
- From step 200 (the first thumbnail kept, heap 125.3 -> 126.5 at step 200): heap +1.150
  MiB/step, the same over 200-299 and 300-499 (linear, no plateau): 138.0 at 210, 184.0 at
  250, 241.5 at 300, 356.5 at 400, 470.3 at 499 (+345 MiB). RSS +1.85 MiB/step over 200-499:
  414 at 210, 581 at 300, 767 at 400, 950 at 499.
- Training is healthy throughout and unaffected by the leak: loss 0.0722 at step 0, window
  means per 100 steps 0.0138, 0.00099, 0.00038, 0.00019, 0.00009; gradient norm 1.39 at
  step 0, max 0.09 after step 100; full-image MSE at the end 6e-5 (PSNR 46 dB). Finite.
- Root cause: a memory leak starting at step 200.
- About 6 s on 2 cores (1 thread).
"""

import argparse
import ctypes
import math

import psutil
import torch
import torch.nn.functional as F
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 200, "tolerance": 25}],
          "forbidden": ["loss_divergence", "gradient_explosion", "nonfinite"]}

STEPS, BATCH, HID, RES, OMEGA, LEAK_FROM = 500, 1024, 64, 64, 30.0, 200


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
    heap = float("nan")
    if _MI is not None:
        mi = _MI()
        heap = (mi.uordblks + mi.hblkhd) / 2 ** 20
    return _PROC.memory_info().rss / 2 ** 20, heap


class SineLayer(nn.Module):
    def __init__(self, n_in, n_out, first=False):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)
        bound = 1 / n_in if first else math.sqrt(6 / n_in) / OMEGA
        with torch.no_grad():
            self.linear.weight.uniform_(-bound, bound)

    def forward(self, x):
        return torch.sin(OMEGA * self.linear(x))


class Siren(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(SineLayer(2, HID, first=True), SineLayer(HID, HID),
                                 SineLayer(HID, HID), SineLayer(HID, HID))
        self.out = nn.Linear(HID, 1)
        with torch.no_grad():
            b = math.sqrt(6 / HID) / OMEGA
            self.out.weight.uniform_(-b, b)

    def forward(self, x):
        return self.out(self.net(x)).squeeze(-1)


def target_image():
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, RES), torch.linspace(-1, 1, RES), indexing="ij")
    r = (xs ** 2 + ys ** 2).sqrt()
    img = (0.5 * torch.cos(12 * r) * torch.exp(-2 * r) + 0.3 * torch.sin(6 * (xs + 0.5 * ys))
           + 0.6 * torch.exp(-((xs - 0.4) ** 2 + (ys + 0.3) ** 2) / 0.02)
           + 0.4 * torch.exp(-((xs + 0.5) ** 2 + (ys - 0.5) ** 2) / 0.05))
    coords = torch.stack([xs, ys], -1).view(-1, 2)
    return coords, img.view(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(4)
    coords, pixels = target_image()
    pv = torch.linspace(-1, 1, 24)
    preview_coords = torch.stack(torch.meshgrid(pv, pv, indexing="ij")[::-1], -1).view(-1, 2)
    model = Siren()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    preview_history = []
    trace = []
    with Recorder(args.run_dir, model=model, optimizer=opt) as rec:
        for step in range(STEPS):
            idx = torch.randint(0, coords.shape[0], (BATCH,), generator=g)
            pred = model(coords[idx])
            loss = F.mse_loss(pred, pixels[idx])
            opt.zero_grad()
            loss.backward()
            gn = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
            opt.step()
            if step >= LEAK_FROM:
                preview_history.append(model(preview_coords).view(24, 24))   # BUG: keeps graph
            rec.step(loss=loss)
            rss, heap = memory_mib()
            trace.append((step, loss.item(), gn, rss, heap))
            if step % 25 == 0 or LEAK_FROM - 2 <= step <= LEAK_FROM + 3:
                print(f"step {step} loss {loss.item():.5f} grad_norm {gn:.4g} rss {rss:.1f} MiB "
                      f"heap {heap:.1f} MiB previews {len(preview_history)}", flush=True)
    with torch.no_grad():
        full = F.mse_loss(model(coords), pixels).item()
    psnr = 10 * math.log10(float(pixels.max() - pixels.min()) ** 2 / full)
    print(f"[fit] full-image MSE at the end {full:.5f} (PSNR {psnr:.1f} dB); "
          f"pixel variance {pixels.var().item():.4f}")

    def slope(a, b, i):
        part = trace[a:b + 1]
        xm = (len(part) - 1) / 2
        return (sum((x - xm) * p[i] for x, p in enumerate(part))
                / sum((x - xm) ** 2 for x in range(len(part))))

    for a, b in ((0, 99), (100, 199), (150, 199), (200, 299), (300, 499), (200, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(a, b, 3):+.3f} MiB/step, heap "
              f"{slope(a, b, 4):+.3f} MiB/step")
    for s in (0, 50, 100, 150, 199, 200, 210, 250, 300, 400, 499):
        print(f"[mem] step {s}: rss {trace[s][3]:.1f} heap {trace[s][4]:.1f} "
              f"loss {trace[s][1]:.5f}")
    for a in range(0, STEPS, 100):
        part = trace[a:a + 100]
        print(f"[win] steps {a}-{a + 99}: loss mean {sum(p[1] for p in part) / 100:.5f}, grad norm "
              f"max {max(p[2] for p in part):.3g}")


if __name__ == "__main__":
    main()
