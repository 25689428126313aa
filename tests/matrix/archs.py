"""The matrix's wider set of architectures (#26), each written here after a well-known design,
small enough to learn its synthetic task in a few hundred CPU steps:

* ``gru`` / ``lstm``: recurrent LMs (embedding, one recurrent layer, a decoder head), Adam;
* ``cnnbn``: a VGG-style CNN whose convs keep ``bias=True`` before BatchNorm (the common
  healthy CNN whose conv bias gets a zero gradient by construction), SGD with momentum;
* ``vit``: a Vision Transformer (conv patch embedding, class token, learned positions,
  pre-norm blocks with dropout), AdamW with decay groups;
* ``unet``: a U-Net-style encoder–decoder with a skip connection and GroupNorm, denoising;
* ``mixer``: an MLP-Mixer (token-mixing and channel-mixing MLPs);
* ``vae``: a VAE with two losses (reconstruction + KL);
* ``gnn``, ``recsys``: in archs_sparse.py (message passing; an EmbeddingBag recommender).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .archs_sparse import (
    GNN,
    Recommender,
    click_batches,
    click_loss,
    gnn_loss,
    graph_batches,
    random_clicks,
    random_node_labels,
)
from .models import (
    ModelSpec,
    ce_loss,
    image_batches,
    random_labels,
    random_tokens,
    token_batches,
)

LM_VOCAB = 64  # the recurrent LMs' language (a small one: they learn it within 300 steps)


def adam(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def adamw_groups(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Decay on matrices, none on biases, norms and embeddings-like vectors."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                              {"params": rest, "weight_decay": 0.0}], lr=lr)


def sgd(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)


# ---------------------------------------------------------------- recurrent LMs
class Decoder(nn.Module):
    def __init__(self, cell: str, d: int, h: int, vocab: int) -> None:
        super().__init__()
        self.rnn = (nn.GRU if cell == "gru" else nn.LSTM)(d, h, batch_first=True)
        self.head = nn.Linear(h, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out)


class RNNLM(nn.Module):
    def __init__(self, seed: int, cell: str, d: int = 32, h: int = 64) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(LM_VOCAB, d)
        self.decoder = Decoder(cell, d, h, LM_VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.emb(ids))


def rnn_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, LM_VOCAB), ids[:, 1:].reshape(-1))


def _rnn(cell: str) -> ModelSpec:
    return ModelSpec(build=lambda s: RNNLM(s, cell), optimizer=adam, lr=3e-3, batch_size=16,
                     data=lambda s: token_batches(s, 16, LM_VOCAB), loss=rnn_loss,
                     nan_parent="decoder", nan_child="head", cut="emb", cut_subject=("emb",),
                     freeze="emb", randomize=random_tokens(LM_VOCAB),
                     chance_loss=math.log(LM_VOCAB))


# ---------------------------------------------------------------- CNN, bias before BN
class ConvBNBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=True)  # the default bias=True
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class VGGish(nn.Module):
    def __init__(self, seed: int, classes: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.block1, self.block2, self.block3 = (ConvBNBlock(3, 8), ConvBNBlock(8, 16),
                                                 ConvBNBlock(16, 16))
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.block1(x), 2)
        x = F.max_pool2d(self.block2(x), 2)
        return self.fc(self.block3(x).mean((2, 3)))


# ---------------------------------------------------------------- ViT
class MLPBlock(nn.Module):
    def __init__(self, d: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(F.gelu(self.fc1(x))))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(d), Attention(d, heads)
        self.norm2, self.mlp = nn.LayerNorm(d), MLPBlock(d, 2 * d, dropout=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, seed: int, d: int = 32, classes: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.patch_embed = nn.Conv2d(3, d, 4, stride=4)  # 16 patches of 4x4
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        self.blocks = nn.ModuleList([ViTBlock(d, 2) for _ in range(2)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


# ---------------------------------------------------------------- U-Net
class GNBlock(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.norm = nn.GroupNorm(4, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(self.conv(x)))


class UNet(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.enc1, self.enc2 = GNBlock(3, 8), GNBlock(8, 16)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec1 = GNBlock(16, 8)
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        return self.out(self.dec1(torch.cat([self.up(e2), e1], 1)))


def denoise_batches(seed: int, batch: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """(noisy image, clean image) pairs of the class templates."""
    g = torch.Generator().manual_seed(9_100 + seed)
    templates = F.interpolate(torch.randn(8, 3, 4, 4, generator=g), size=16, mode="bilinear",
                              align_corners=False)

    def draw(step: int) -> tuple[torch.Tensor, ...]:
        gs = torch.Generator().manual_seed(seed * 1_000_039 + step)
        clean = templates[torch.randint(0, 8, (batch,), generator=gs)]
        return clean + 0.5 * torch.randn(batch, 3, 16, 16, generator=gs), clean

    return draw


def mse_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def random_targets(batch: Any, g: torch.Generator) -> Any:
    x, y = batch
    return x, torch.randn(y.shape, generator=g)


# ---------------------------------------------------------------- MLP-Mixer
class MixerBlock(nn.Module):
    def __init__(self, tokens: int, d: int) -> None:
        super().__init__()
        self.norm1, self.token_mlp = nn.LayerNorm(d), MLPBlock(tokens, 2 * tokens)
        self.norm2, self.channel_mlp = nn.LayerNorm(d), MLPBlock(d, 2 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, seed: int, d: int = 32, classes: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.stem = nn.Linear(48, d)  # 16 patches of 4x4x3
        self.blocks = nn.ModuleList([MixerBlock(16, d) for _ in range(2)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = x.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5).reshape(b, 16, 48)
        x = self.stem(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x).mean(1))


# ---------------------------------------------------------------- VAE
class VAEDecoder(nn.Module):
    def __init__(self, z: int, h: int, out: int) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(z, h), nn.Linear(h, out)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.fc(z)))


class VAE(nn.Module):
    def __init__(self, seed: int, z: int = 8, h: int = 64) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.enc = nn.Linear(768, h)
        self.mu, self.logvar = nn.Linear(h, z), nn.Linear(h, z)
        self.decoder = VAEDecoder(z, h, 768)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.relu(self.enc(x.flatten(1)))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decoder(z).view_as(x), mu, logvar


def vae_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Two losses: reconstruction of the clean image and the KL term (β = 0.1)."""
    x, clean = batch
    recon, mu, logvar = model(x)
    kl = -0.5 * torch.mean(torch.sum(1 + logvar - mu.pow(2) - logvar.exp(), dim=1))
    return F.mse_loss(recon, clean) + 0.1 * kl / 768


MORE: dict[str, ModelSpec] = {
    "gru": _rnn("gru"),
    "lstm": _rnn("lstm"),
    "cnnbn": ModelSpec(build=lambda s: VGGish(s), optimizer=sgd, lr=0.05, batch_size=32,
                       data=lambda s: image_batches(s, 32), loss=ce_loss,
                       nan_parent="block2", nan_child="bn", cut="block1",
                       cut_subject=("block1",), freeze="block2",
                       randomize=random_labels(8), chance_loss=math.log(8)),
    "vit": ModelSpec(build=lambda s: ViT(s), optimizer=adamw_groups, lr=2e-3, batch_size=32,
                     data=lambda s: image_batches(s, 32), loss=ce_loss,
                     nan_parent="blocks.1.mlp", nan_child="fc2", cut="patch_embed",
                     cut_subject=("patch_embed",), freeze="blocks.0",
                     randomize=random_labels(8), chance_loss=math.log(8)),
    "unet": ModelSpec(build=lambda s: UNet(s), optimizer=adam, lr=3e-3, batch_size=16,
                      data=lambda s: denoise_batches(s, 16), loss=mse_loss,
                      nan_parent="dec1", nan_child="conv", cut="enc2",
                      cut_subject=("enc2",), freeze="enc1", randomize=random_targets),
    "mixer": ModelSpec(build=lambda s: Mixer(s), optimizer=adamw_groups, lr=2e-3,
                       batch_size=32, data=lambda s: image_batches(s, 32), loss=ce_loss,
                       nan_parent="blocks.1.channel_mlp", nan_child="fc2", cut="stem",
                       cut_subject=("stem",), freeze="blocks.1",
                       randomize=random_labels(8), chance_loss=math.log(8)),
    "vae": ModelSpec(build=lambda s: VAE(s), optimizer=adam, lr=1e-3, batch_size=32,
                     data=lambda s: denoise_batches(s, 32), loss=vae_loss,
                     nan_parent="decoder", nan_child="out", cut="enc",
                     cut_subject=("enc",), freeze="decoder"),
    "gnn": ModelSpec(build=lambda s: GNN(s), optimizer=adam, lr=3e-3, batch_size=16,
                     data=lambda s: graph_batches(s), loss=gnn_loss,
                     nan_parent="layers.1", nan_child="lin_nbr", cut="embed",
                     cut_subject=("embed",), freeze="layers.0",
                     randomize=random_node_labels, chance_loss=math.log(4)),
    # recommenders train on large batches: at 64 the clicks' label noise held the loss
    # within 10% of ln 2 for half the run (a step decay then froze it there)
    "recsys": ModelSpec(build=lambda s: Recommender(s), optimizer=adam, lr=2e-2,
                        batch_size=256, data=lambda s: click_batches(s, 256),
                        loss=click_loss,
                        nan_parent="tower", nan_child="fc2", cut="history",
                        cut_subject=("history",), freeze="item",
                        randomize=random_clicks, chance_loss=math.log(2)),
}
