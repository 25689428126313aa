"""Two more matrix architectures (#45: at least 15), each written here after a well-known
design, small enough to learn its synthetic task in a few hundred CPU steps:

* ``tcn``: a WaveNet-style temporal convolutional LM (causal dilated Conv1d, gated residual
  blocks with dilations 1, 2, 4), Adam;
* ``moe``: a Switch-Transformer-style mixture of experts over image patches (top-1 routing to
  4 expert MLPs per block, the load-balancing auxiliary loss): an expert that receives no
  token in a step gets no gradient in that step, as in real sparse models.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .archs import adam
from .models import (
    VOCAB,
    ModelSpec,
    ce_loss,
    image_batches,
    nanogpt_loss,
    random_labels,
    random_tokens,
    token_batches,
)


# ---------------------------------------------------------------- TCN (WaveNet-style)
class GatedBlock(nn.Module):
    def __init__(self, d: int, dilation: int) -> None:
        super().__init__()
        self.pad = dilation  # (kernel 2: causal left padding of one dilation)
        self.conv = nn.Conv1d(d, 2 * d, kernel_size=2, dilation=dilation)
        self.res = nn.Conv1d(d, d, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(F.pad(x, (self.pad, 0)))
        a, b = h.chunk(2, dim=1)
        return x + self.res(torch.tanh(a) * torch.sigmoid(b))


class TCN(nn.Module):
    def __init__(self, seed: int, d: int = 48) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList([GatedBlock(d, k) for k in (1, 2, 4)])
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).transpose(1, 2)
        for b in self.blocks:
            x = b(x)
        return self.head(x.transpose(1, 2))


# ---------------------------------------------------------------- Switch-style MoE
class Expert(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwitchBlock(nn.Module):
    """Pre-norm; each token goes to its top-1 expert, scaled by the router's probability;
    ``aux`` is the Switch load-balancing loss (n · Σ fraction_i · mean_prob_i)."""

    def __init__(self, d: int, experts: int = 4) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList([Expert(d, 2 * d) for _ in range(experts)])
        self.aux = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        flat = h.reshape(-1, h.shape[-1])
        prob = self.router(flat).softmax(-1)
        top = prob.argmax(-1)
        out = torch.zeros_like(flat)
        for i, e in enumerate(self.experts):
            sel = top == i
            if sel.any():  # (an expert without tokens gets no gradient this step)
                out[sel] = e(flat[sel]) * prob[sel, i:i + 1]
        n = len(self.experts)
        frac = F.one_hot(top, n).float().mean(0)
        self.aux = n * (frac * prob.mean(0)).sum()
        return x + out.view_as(x)


class SwitchMoE(nn.Module):
    def __init__(self, seed: int, d: int = 32, classes: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.patch = nn.Conv2d(3, d, kernel_size=4, stride=4)
        self.blocks = nn.ModuleList([SwitchBlock(d) for _ in range(2)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        for b in self.blocks:
            t = b(t)
        return self.head(self.norm(t).mean(1))


def moe_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy plus 0.01 × the blocks' load-balancing losses (Switch's α)."""
    loss = ce_loss(model, batch)
    return loss + 0.01 * sum(b.aux for b in model.blocks)  # type: ignore[union-attr]


MORE2: dict[str, ModelSpec] = {
    "tcn": ModelSpec(build=lambda s: TCN(s), optimizer=adam, lr=3e-3, batch_size=16,
                     data=lambda s: token_batches(s, 16), loss=nanogpt_loss,
                     nan_parent="blocks.1", nan_child="res", cut="embed",
                     cut_subject=("embed",), freeze="blocks.0",
                     randomize=random_tokens(VOCAB)),
    "moe": ModelSpec(build=lambda s: SwitchMoE(s), optimizer=adam, lr=2e-3, batch_size=32,
                     data=lambda s: image_batches(s, 32), loss=moe_loss,
                     nan_parent="blocks.1", nan_child="norm", cut="patch",
                     cut_subject=("patch",), freeze="blocks.0",
                     randomize=random_labels(8), chance_loss=math.log(8)),
}
