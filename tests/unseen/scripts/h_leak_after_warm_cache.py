"""U-Net segmenter whose decoded-image cache fills in epoch 1; from step 150 it keeps every loss.

What it does: binary segmentation (foreground mask) of synthetic 64×64 RGB images of random
discs and boxes on a noisy, shaded background. The dataset is bounded: 60 "data files" of 8
images; each epoch visits the 60 files in a freshly shuffled order (fixed seed), 300 steps =
5 epochs. Model: a two-level U-Net (16-32-64 channels, BatchNorm, transposed-conv upsampling,
skip connections), 118 k parameters; loss = BCE-with-logits + soft Dice; Adam(lr=2e-3).

Memory that grows for an innocent reason: decoding a file is treated as expensive, so its
result is cached in a dict keyed by the file index (``cache[i]``: 8×3×64×64 images + 8×1×64×64
masks, float32, 512 KiB per file). During the first epoch (steps 0-59) every file is new and
the cache grows by 512 KiB a step to 60 entries (30 MiB); from step 60 on nothing is added.

The bug: from step HISTORY_FROM = 150 the loop keeps every step's loss tensor, with its
autograd graph, in a list that is never cleared (``history.append(loss)``, meant "for a
smoothed loss curve at the end"; ``loss.item()`` was intended). ``backward()`` has already
freed the saved activations of that graph, so what each step leaves behind is the graph
itself — its node objects and their metadata, ≈41 KiB of live heap a step — and those
long-lived small allocations, scattered among the freed activation buffers, also keep the
heap from being reused: RSS grows ≈10× faster than the live heap. (Step 150's own loss is
alive anyway at the end of step 150; the first retained graph shows from step 151.)

What is TRUE of the run (ground truth):
- A leak from step 150 to the end (memory_leak, first step 150), after a bounded cache that
  filled and stopped at step 59 (that earlier growth is not a leak). Measured with the
  Recorder replaced by a stub (live heap = glibc mallinfo2 uordblks + hblkhd, RSS from
  /proc/self/statm, end of each step): the live heap rises by 513 KiB a step over steps 0-59
  (117.1 → 146.7 MiB), is flat at 146.68-146.69 MiB over steps 60-150, then grows linearly by
  41 KiB a step, with no plateau, to 152.7 MiB at step 299 (+6.0 MiB over 149 steps). RSS is
  within 413-425 MiB over steps 60-150 and climbs to 502 MiB at step 299 (≈+560 KiB a step,
  noisy). With the recorder: 128.5 → 168.3 MiB over steps 0-59, 168.25-168.53 MiB over
  60-150, then +41 KiB a step to 174.5 MiB; RSS 548 MiB at step 150 → 612 MiB at step 299.
- Training is otherwise healthy: the loss falls from 1.54 to ≈0.06; no divergence, no NaN/Inf.
"""

import argparse

import torch
from torch import nn
from tracealyze.recorder import Recorder

EXPECT = {
    "healthy": False,
    "findings": [
        {"id": "memory_leak", "first_step": 150, "tolerance": 5},
    ],
    "forbidden": ["loss_divergence", "nonfinite"],
}

STEPS, NFILES, BATCH, SIZE = 300, 60, 8, 64
HISTORY_FROM = 150


def decode(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """"Decode" data file ``index``: 8 RGB 64×64 images of random discs and boxes on a noisy,
    shaded background, and their foreground masks. Deterministic per index; treated as
    expensive, so the loop caches the result."""
    g = torch.Generator().manual_seed(1000 + index)
    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    masks = torch.zeros(BATCH, 1, SIZE, SIZE)
    for b in range(BATCH):
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            cy, cx = torch.randint(8, SIZE - 8, (2,), generator=g).tolist()
            r = int(torch.randint(4, 12, (1,), generator=g))
            if torch.rand(1, generator=g) < 0.5:
                shape = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
            else:
                shape = ((yy - cy).abs() < r) & ((xx - cx).abs() < r * 0.6)
            masks[b, 0] = torch.maximum(masks[b, 0], shape.float())
    fg = torch.rand(BATCH, 3, 1, 1, generator=g) * 0.6 + 0.4
    bg = torch.rand(BATCH, 3, 1, 1, generator=g) * 0.4
    shade = torch.linspace(-0.2, 0.2, SIZE)[None, None, :, None]
    img = masks * fg + (1 - masks) * (bg + shade) + 0.25 * torch.randn(BATCH, 3, SIZE, SIZE,
                                                                         generator=g)
    img = (img - img.mean((2, 3), keepdim=True)) / img.std((2, 3), keepdim=True)
    return img.contiguous(), masks


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    """A two-level U-Net (Ronneberger et al. 2015), 16-32-64 channels."""

    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2, self.mid = block(3, 16), block(16, 32), block(32, 64)
        self.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.dec2 = block(64, 32)
        self.up1 = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec1 = block(32, 16)
        self.out = nn.Conv2d(16, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(nn.functional.max_pool2d(e1, 2))
        m = self.mid(nn.functional.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.out(d1)


def seg_loss(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    bce = nn.functional.binary_cross_entropy_with_logits(logits, mask)
    p = logits.sigmoid()
    dice = 1 - (2 * (p * mask).sum((1, 2, 3)) + 1) / (p.sum((1, 2, 3)) + mask.sum((1, 2, 3)) + 1)
    return bce + dice.mean()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)

    model = UNet()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # bounded: NFILES entries
    history = []  # the leak, from HISTORY_FROM on: every loss, with its graph
    losses = []
    step = 0
    with Recorder(args.run_dir, model=model, optimizer=opt, preset="standard") as rec:
        while step < STEPS:
            for i in torch.randperm(NFILES, generator=g).tolist():
                if i not in cache:
                    cache[i] = decode(i)
                img, mask = cache[i]
                loss = seg_loss(model(img), mask)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step >= HISTORY_FROM:
                    history.append(loss)  # "for a smoothed loss curve at the end"
                rec.step(loss=loss)
                losses.append(loss.item())
                step += 1
                if step >= STEPS:
                    break
    print(f"loss first {losses[0]:.3f} last-10 mean {sum(losses[-10:]) / 10:.4f}; "
          f"cache {len(cache)} entries; history holds {len(history)} losses")


if __name__ == "__main__":
    main()
