"""Matrix architectures that are not images or sequences: message passing over random
graphs in plain torch (``gnn``) and an EmbeddingBag recommender (``recsys``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


# ---------------------------------------------------------------- GNN
class MessagePassing(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.lin_self, self.lin_nbr = nn.Linear(cin, cout), nn.Linear(cin, cout, bias=False)

    def forward(self, h: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        return F.relu(self.lin_self(h) + self.lin_nbr(adj @ h))


class GNN(nn.Module):
    def __init__(self, seed: int, d: int = 32, classes: int = 4) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(8, d)
        self.layers = nn.ModuleList([MessagePassing(d, d) for _ in range(2)])
        self.head = nn.Linear(d, classes)

    def forward(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, adj = batch
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, adj)
        return self.head(h)


def graph_batches(seed: int, graphs: int = 16, nodes: int = 12
                  ) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """Random graphs (edge probability 0.25, mean-normalised adjacency with self loops);
    a node's class is set by its features and its neighbours' (a fixed random rule)."""
    g0 = torch.Generator().manual_seed(9_200 + seed)
    w_self, w_nbr = torch.randn(8, 4, generator=g0), torch.randn(8, 4, generator=g0)

    def draw(step: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed * 1_000_081 + step)
        x = torch.randn(graphs, nodes, 8, generator=g)
        a = (torch.rand(graphs, nodes, nodes, generator=g) < 0.25).float()
        a = ((a + a.transpose(1, 2)) > 0).float() + torch.eye(nodes)
        adj = a / a.sum(-1, keepdim=True)
        y = (x @ w_self + adj @ x @ w_nbr).argmax(-1)
        return x, adj, y

    return draw


def gnn_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, adj, y = batch
    return F.cross_entropy(model((x, adj)).reshape(-1, 4), y.reshape(-1))


def random_node_labels(batch: Any, g: torch.Generator) -> Any:
    x, adj, y = batch
    return x, adj, torch.randint(0, 4, y.shape, generator=g)


# ---------------------------------------------------------------- recommender
ITEMS = 50


class Tower(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(2 * d, d), nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x))).squeeze(-1)


class Recommender(nn.Module):
    def __init__(self, seed: int, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.history = nn.EmbeddingBag(ITEMS, d, mode="mean")
        self.item = nn.Embedding(ITEMS, d)
        self.tower = Tower(d)

    def forward(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        hist, cand = batch[0], batch[1]
        return self.tower(torch.cat([self.history(hist), self.item(cand)], -1))


def click_batches(seed: int, batch: int = 256) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """Users (a bag of 8 past items) and a candidate item; the click probability is the
    sigmoid of the candidate's affinity with the history (a latent dot product)."""
    g0 = torch.Generator().manual_seed(9_300 + seed)
    latent = torch.randn(ITEMS, 4, generator=g0)

    def draw(step: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed * 1_000_099 + step)
        hist = torch.randint(0, ITEMS, (batch, 8), generator=g)
        cand = torch.randint(0, ITEMS, (batch,), generator=g)
        score = (latent[hist].mean(1) * latent[cand]).sum(-1) * 6
        click = (torch.rand(batch, generator=g) < torch.sigmoid(score)).float()
        return hist, cand, click

    return draw


def click_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(model(batch), batch[2])


def random_clicks(batch: Any, g: torch.Generator) -> Any:
    hist, cand, click = batch
    return hist, cand, (torch.rand(click.shape, generator=g) < 0.5).float()
