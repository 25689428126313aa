"""RealNVP normalising flow (6 affine couplings) fitting the 2-D pinwheel density by maximum
likelihood. For a moving-average progress line, every step appends the loss *tensor* to
`nll_history` and never detaches it, so each step's autograd graph stays alive forever.
backward() has already freed the graph's saved activations. What stays is the graph itself
(161 autograd nodes per step and their metadata), so the heap grows by a steady ~83 KiB per
step from step 0 to the end. LEAK from step 0.

What it does: pinwheel data (5 arms, radius N(1, 0.3), tangential N(0, 0.05), twisted by
0.25 exp(r), scaled 1.5). Each coupling transforms one coordinate by an MLP of the other:
1->48->48->2, SiLU, zero-initialised output, scale 2 tanh(s/2), alternating coordinates.
Standard-normal base. Loss = mean NLL. Adam(2e-3), batch 256, 500 steps. The progress line
prints torch.stack(nll_history[-50:]).mean().

What is TRUE of the run (measured, 2 runs, identical losses; heap = glibc mallinfo2 uordblks +
hblkhd, RSS from psutil, right after rec.step):
- Heap 125.0 MiB at step 0, 125.8 at 10, 129.8 at 50, 133.5 at 100, 141.7 at 200, 149.9 at
  300, 158.1 at 400, 166.2 at 499. Linear from the first step: +0.081 MiB/step over 0-49,
  100-199 and 200-299, +0.082 over 300-499, +41 MiB in all.
- RSS 388.4 at step 0, 396-397 at 50, 405 at 100, 414-415 at 200, 424-425 at 300, 434-435 at
  400, 445 at 499. That is +0.10 MiB/step over 100-499, with a little extra warm-up in the
  first 100 steps (+0.19 MiB/step over 0-99).
- Training itself is healthy and unaffected: NLL 3.07 at step 0, 50-step means 2.99, 2.89,
  2.70, 2.51, 2.44, 2.37, 2.28, 2.09, 1.93, 1.77; held-out NLL at the end 1.76 nats. Finite.
- Root cause: a memory leak starting at step 0 (the first appended loss).
- About 4-5 s of training (8-9 s wall) on 2 shared cores, 1 thread.
"""

import argparse
import ctypes
import math
import time

import psutil
import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {"healthy": False,
          "findings": [{"id": "memory_leak", "first_step": 0, "tolerance": 20}],
          "forbidden": ["loss_divergence", "gradient_explosion", "nonfinite"]}

STEPS, BATCH, HID, COUPLINGS, SMOOTH = 500, 256, 48, 6, 50

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


def pinwheel(n, g):
    """Five curved arms (the classic pinwheel density), radius ~ N(1, 0.3), tangential 0.05."""
    arm = torch.randint(0, 5, (n,), generator=g)
    r = 1 + 0.3 * torch.randn(n, generator=g)
    tang = 0.05 * torch.randn(n, generator=g)
    ang = arm * (2 * math.pi / 5) + 0.25 * torch.exp(r)
    x = torch.stack([r, tang], -1)
    rot = torch.stack([torch.stack([ang.cos(), -ang.sin()], -1),
                       torch.stack([ang.sin(), ang.cos()], -1)], -2)
    return 1.5 * (rot @ x[..., None]).squeeze(-1)


class Coupling(nn.Module):
    """Affine coupling: one coordinate is scaled and shifted by an MLP of the other."""

    def __init__(self, flip):
        super().__init__()
        self.flip = flip
        self.net = nn.Sequential(nn.Linear(1, HID), nn.SiLU(), nn.Linear(HID, HID), nn.SiLU(),
                                 nn.Linear(HID, 2))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x):
        keep, move = (x[:, 1:], x[:, :1]) if self.flip else (x[:, :1], x[:, 1:])
        s, t = self.net(keep).chunk(2, -1)
        s = 2.0 * torch.tanh(s / 2.0)
        moved = move * torch.exp(s) + t
        out = torch.cat([moved, keep], -1) if self.flip else torch.cat([keep, moved], -1)
        return out, s.squeeze(-1)


class RealNVP2D(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Coupling(i % 2 == 1) for i in range(COUPLINGS))

    def log_prob(self, x):
        logdet = torch.zeros(x.shape[0])
        for layer in self.layers:
            x, s = layer(x)
            logdet = logdet + s
        base = -0.5 * (x ** 2).sum(-1) - math.log(2 * math.pi)
        return base + logdet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    flow = RealNVP2D()
    opt = torch.optim.Adam(flow.parameters(), lr=2e-3)
    nll_history = []            # for the progress line's moving average
    trace = []
    t0 = time.time()
    with Recorder(args.run_dir, model=flow, optimizer=opt) as rec:
        for step in range(STEPS):
            x = pinwheel(BATCH, g)
            loss = -flow.log_prob(x).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            nll_history.append(loss)     # BUG: the tensor, with its graph (never freed)
            smooth = torch.stack(nll_history[-SMOOTH:]).mean().item()
            rec.step(loss=loss)
            rss, heap = memory_mib()
            trace.append((step, loss.item(), smooth, rss, heap))
            if step % 25 == 0:
                print(f"step {step} nll {loss.item():.4f} (avg of last {SMOOTH}: {smooth:.4f}) "
                      f"rss {rss:.1f} heap {heap:.1f} kept {len(nll_history)}", flush=True)
    print(f"[time] {time.time() - t0:.1f} s")
    with torch.no_grad():
        held = -flow.log_prob(pinwheel(20000, torch.Generator().manual_seed(99))).mean().item()
    print(f"[fit] held-out NLL {held:.4f} nats")
    for a, b in ((0, 49), (0, 99), (100, 199), (200, 299), (300, 499), (0, 499)):
        print(f"[slope] steps {a}-{b}: rss {slope(trace, a, b, 3):+.4f} MiB/step, heap "
              f"{slope(trace, a, b, 4):+.4f} MiB/step")
    for s in (0, 1, 2, 5, 10, 25, 50, 100, 200, 300, 400, 499):
        t = trace[s]
        print(f"[mem] step {s}: rss {t[3]:.1f} heap {t[4]:.1f} nll {t[1]:.4f}")
    for a in range(0, STEPS, 50):
        part = trace[a:a + 50]
        n = len(part)
        print(f"[win] steps {a}-{a + n - 1}: nll {sum(p[1] for p in part) / n:.4f} rss "
              f"{min(p[3] for p in part):.1f}-{max(p[3] for p in part):.1f} heap "
              f"{min(p[4] for p in part):.1f}-{max(p[4] for p in part):.1f}")


if __name__ == "__main__":
    main()
