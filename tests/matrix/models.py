"""The real-model matrix's architectures: each a small config of a well-known design, with a
synthetic task it learns steadily over a few hundred steps on one CPU core.

* ``gpt2`` and ``bert``: the ``transformers`` library's own GPT2LMHeadModel and
  BertForSequenceClassification (the Trainer's fine-tuning case: which of two sources wrote a
  sequence), built from small configs with random weights (nothing is downloaded).
* ``nanogpt``: a GPT written here after nanoGPT's design (pre-norm blocks, fused qkv
  projection, GELU MLP, the LM head tied to the token embedding, AdamW with decay and
  no-decay parameter groups).
* ``resnet``: a ResNet written here after He et al. (a conv+BatchNorm stem, BasicBlocks with
  two 3x3 conv+BN and an identity or 1x1-conv shortcut, global average pooling).

Each :class:`ModelSpec` says how to build the model and its optimizer, how to draw a batch
and compute the loss, and which module's forward the NaN pathology poisons (by plain code,
not by a submodule: see ``pathologies.nan_forward``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 256
BERT_VOCAB = 48
"""BERT's token language. (A masked LM over it, as BERT is pretrained, sits at its unigram loss
for the first few hundred steps here, before attention learns to read the neighbours: its
"healthy" runs had not learned by their end, so a plateau warning on them was the truth. BERT
is trained instead on the task most users run it on: classifying sequences.)"""
SOURCE_SHARED = 0.75
"""Share of the token transitions the two sources of ``source_batches`` have in common: the
classifier learns steadily over the run (loss ln 2 -> ~0.3-0.5 in 300 steps, step decay
included), neither in a handful of steps nor never."""
SEQ = 16


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One architecture of the matrix."""

    build: Callable[[int], nn.Module]
    """seed -> model (random weights)."""
    optimizer: Callable[[nn.Module, float], torch.optim.Optimizer]
    """(model, lr) -> its optimizer, as its authors configure it."""
    lr: float
    """A learning rate at which the healthy run learns steadily."""
    data: Callable[[int], Callable[[int], Any]]
    """seed -> (step -> batch); batches are deterministic per (seed, step)."""
    loss: Callable[[nn.Module, Any], torch.Tensor]
    """(model, batch) -> scalar loss."""
    nan_parent: str
    """Module whose forward makes the NaN (by plain code before it calls ``nan_child``)."""
    nan_child: str
    """The submodule of ``nan_parent`` that receives the NaN as its input (it did not make it:
    blaming it is the bug the matrix guards against)."""
    batch_size: int
    cut: str = ""
    """A module whose output the ``detach`` pathology detaches (the graph-cut bug)."""
    cut_subject: tuple[str, ...] = ()
    """The modules the no_gradient finding may name for that cut (the parameters upstream
    of it that get no gradient from anywhere else)."""
    freeze: str = ""
    """A block the ``frozen`` pathology freezes by mistake (requires_grad_(False) after the
    model is built, before the optimizer is)."""
    randomize: Callable[[Any, torch.Generator], Any] | None = None
    """batch -> the batch with its labels (targets) drawn at random (``random_labels``)."""
    chance_loss: float | None = None
    """The loss at chance level under random labels (ln of the number of classes)."""


# ---------------------------------------------------------------- synthetic data
def markov_chain(seed: int, vocab: int = VOCAB) -> torch.Tensor:
    """A sparse random bigram chain over VOCAB tokens (each token has 3 likely successors):
    a language with ~1.2 nats of entropy per token that small LMs learn over a few hundred
    steps (from ln(vocab) at init)."""
    g = torch.Generator().manual_seed(5_000 + seed)
    logits = torch.full((vocab, vocab), -4.0)
    for t in range(vocab):
        nxt = torch.randperm(vocab, generator=g)[:3]
        logits[t, nxt] = torch.tensor([2.0, 1.2, 0.5])
    return torch.softmax(logits, dim=1)


def markov_walk(probs: torch.Tensor, rows: int, g: torch.Generator) -> torch.Tensor:
    """``rows`` sequences of SEQ tokens from the chain ``probs``: a uniform first token, then
    each next one drawn from its predecessor's row."""
    ids = torch.empty(rows, SEQ, dtype=torch.long)
    ids[:, 0] = torch.randint(0, len(probs), (rows,), generator=g)
    for t in range(1, SEQ):
        ids[:, t] = torch.multinomial(probs[ids[:, t - 1]], 1, generator=g).squeeze(1)
    return ids


def token_batches(seed: int, batch: int, vocab: int = VOCAB) -> Callable[[int], torch.Tensor]:
    probs = markov_chain(seed, vocab)

    def draw(step: int) -> torch.Tensor:
        return markov_walk(probs, batch, torch.Generator().manual_seed(seed * 1_000_003 + step))

    return draw


def source_batches(seed: int, batch: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """(ids, label) batches: half of each batch drawn from one Markov source, half from a
    second one whose transitions differ from it in (1 - SOURCE_SHARED) of the tokens' rows;
    the label says which source wrote the sequence."""
    first = markov_chain(seed, BERT_VOCAB)
    second = first.clone()
    g = torch.Generator().manual_seed(77 + seed)
    rows = torch.randperm(BERT_VOCAB, generator=g)[:round((1 - SOURCE_SHARED) * BERT_VOCAB)]
    second[rows] = markov_chain(seed + 50, BERT_VOCAB)[rows]
    half = batch // 2

    def draw(step: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        ids = torch.cat([markov_walk(first, half, g), markov_walk(second, half, g)])
        return ids, torch.cat([torch.zeros(half), torch.ones(half)]).long()

    return draw


def image_batches(seed: int, batch: int, classes: int = 8
                  ) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """3x16x16 images: a class template (smooth random pattern) under heavy noise, 5% label
    noise: learnable, but not in a handful of steps."""
    g = torch.Generator().manual_seed(9_000 + seed)
    templates = F.interpolate(torch.randn(classes, 3, 4, 4, generator=g), size=16,
                              mode="bilinear", align_corners=False)

    def draw(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gs = torch.Generator().manual_seed(seed * 1_000_033 + step)
        y = torch.randint(0, classes, (batch,), generator=gs)
        x = 0.6 * templates[y] + torch.randn(batch, 3, 16, 16, generator=gs)
        flip = torch.rand(batch, generator=gs) < 0.05
        y = torch.where(flip, torch.randint(0, classes, (batch,), generator=gs), y)
        return x, y

    return draw


def random_labels(classes: int) -> Callable[[Any, torch.Generator], Any]:
    """(x, y) -> (x, labels drawn uniformly): nothing to learn but the class prior."""
    def draw(batch: Any, g: torch.Generator) -> Any:
        x, y = batch
        return x, torch.randint(0, classes, y.shape, generator=g)
    return draw


def random_tokens(vocab: int) -> Callable[[Any, torch.Generator], Any]:
    """A token batch -> uniform random tokens (an LM's 'random labels': chance is ln V)."""
    def draw(ids: Any, g: torch.Generator) -> Any:
        return torch.randint(0, vocab, ids.shape, generator=g)
    return draw


# ---------------------------------------------------------------- transformers models
def hf_gpt2(seed: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=48, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def hf_bert(seed: int) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=BERT_VOCAB, hidden_size=48, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=96, max_position_embeddings=SEQ,
                     pad_token_id=0, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, num_labels=2)
    return BertForSequenceClassification(cfg)


def hf_adamw(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """transformers.Trainer's default: AdamW, weight decay 0 unless asked (we ask 0.01, with
    biases and LayerNorm weights excluded, as the Trainer's decay_parameters do)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": rest, "weight_decay": 0.0}], lr=lr)


def lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def hf_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The loss a transformers model computes from its ``labels`` (what the Trainer uses)."""
    ids, labels = batch
    return model(input_ids=ids, labels=labels).loss


# ---------------------------------------------------------------- nanoGPT-style GPT
class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))  # plain code between the two projections


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, seed: int, d: int = 48, layers: int = 2, heads: int = 2) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d), wpe=nn.Embedding(SEQ, d),
            h=nn.ModuleList([GPTBlock(d, heads) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # scaled residual projections (GPT-2 paper)
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.transformer.wte(ids) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def nanogpt_adamw(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """nanoGPT's configure_optimizers: 2-D weights decay, biases and norms do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": nodecay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def nanogpt_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


# ---------------------------------------------------------------- ResNet
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, seed: int, classes: int = 8, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = nn.Sequential(BasicBlock(width, width, 1), BasicBlock(width, width, 1))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, 2),
                                    BasicBlock(2 * width, 2 * width, 1))
        self.fc = nn.Linear(2 * width, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def sgd_momentum(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The ResNet recipe: SGD with Nesterov momentum 0.9 and weight decay 5e-4."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                           weight_decay=5e-4)


def ce_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


MODELS: dict[str, ModelSpec] = {
    "gpt2": ModelSpec(build=hf_gpt2, optimizer=hf_adamw, lr=1e-3, batch_size=16,
                      data=lambda s: token_batches(s, 16), loss=lm_loss,
                      nan_parent="transformer.h.1.mlp", nan_child="c_proj",
                      cut="transformer.h.0", cut_subject=("transformer.wpe", "transformer.h.0"),
                      freeze="transformer.h.1", randomize=random_tokens(VOCAB),
                      chance_loss=math.log(VOCAB)),
    "bert": ModelSpec(build=hf_bert, optimizer=hf_adamw, lr=1e-3, batch_size=32,
                      data=lambda s: source_batches(s, 32), loss=hf_loss,
                      nan_parent="bert.encoder.layer.1.attention", nan_child="output",
                      cut="bert.encoder.layer.0",
                      # the whole embedding block: with a classifier head nothing ties the word
                      # embeddings to the output (an MLM head did), so none of it gets a gradient
                      cut_subject=("bert.embeddings", "bert.encoder.layer.0"),
                      freeze="bert.encoder.layer.1", randomize=random_labels(2),
                      chance_loss=math.log(2)),
    "nanogpt": ModelSpec(build=lambda s: NanoGPT(s), optimizer=nanogpt_adamw, lr=1e-3,
                         batch_size=16, data=lambda s: token_batches(s, 16),
                         loss=nanogpt_loss, nan_parent="transformer.h.1.mlp",
                         nan_child="c_proj", cut="transformer.h.0",
                         cut_subject=("transformer.wpe", "transformer.h.0"),
                         randomize=random_tokens(VOCAB), chance_loss=math.log(VOCAB)),
    "resnet": ModelSpec(build=lambda s: ResNet(s), optimizer=sgd_momentum, lr=0.05,
                        batch_size=32, data=lambda s: image_batches(s, 32), loss=ce_loss,
                        nan_parent="layer2.0", nan_child="conv2", cut="layer1",
                        cut_subject=("conv1", "bn1", "layer1"), freeze="layer2",
                        randomize=random_labels(8), chance_loss=math.log(8)),
}
