"""The two benchmark workloads: a small GPT-style transformer and a deep MLP of small tensors."""

from __future__ import annotations

import math

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """~4.2M parameters in 53 tensors (4 blocks, d=256, vocab 2048, context 128)."""

    def __init__(self, vocab: int = 2048, ctx: int = 128, d: int = 256, layers: int = 4,
                 heads: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), -math.inf), 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln_f(x))


def mlp(width: int = 128, depth: int = 95) -> nn.Sequential:
    """``depth`` Linear layers (weight + bias: 2*depth tensors, ~1.6M parameters)."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# The MLP's batch: 320 gave the "~50 ms per step" (47 ms) on the machine the first
# figures came from; the same 2-core machine type has since run it in 28-36 ms. The batch
# sets the step time only: the recorder's per-step work depends on the parameters, so its
# overhead in ms per step is the same and its percentage scales with 1 / step time.
MLP_BATCH = 320

WORKLOADS = {
    # name: (model factory, batch factory, loss)
    "gpt": (
        lambda: GPT(),
        lambda g: (torch.randint(0, 2048, (12, 128), generator=g),) * 2,
        lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                   y.reshape(-1)),
    ),
    # GPT-2 small's shape (124M parameters, 148 tensors): a GPU workload (--device cuda)
    "gpt2": (
        lambda: GPT(vocab=50304, ctx=512, d=768, layers=12, heads=12),
        lambda g: (torch.randint(0, 50304, (8, 512), generator=g),) * 2,
        lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                   y.reshape(-1)),
    ),
    "mlp": (
        lambda: mlp(),
        lambda g, batch=None: (torch.randn(batch or MLP_BATCH, 128, generator=g),
                               torch.randn(batch or MLP_BATCH, 128, generator=g)),
        lambda out, y: nn.functional.mse_loss(out, y),
    ),
}


def build(name: str, seed: int = 0, device: str = "cpu"
          ) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = WORKLOADS[name][0]().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def timed_step(model: nn.Module, opt: torch.optim.Optimizer, loss_fn, x, y, log=None,
               cuda: bool = False) -> float:
    """One training step (logged by ``log.step`` when given), its wall seconds. On CUDA the
    harness syncs before (the other replica's queued work is not this step's) and after (the
    step's time includes its GPU work): the benchmark's sync points, never the recorder's."""
    import time

    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if log is not None:
        log.step(loss=loss)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0
