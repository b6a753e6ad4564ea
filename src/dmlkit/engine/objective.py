"""What the engine minimises: a loss with its optional miner and cross-batch memory (one per ensemble member)."""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.models.ensemble import split_embeddings


class TrainingObjective(nn.Module):
    """Loss + optional miner + optional cross-batch memory, called as ``objective(emb, labels)``."""

    def __init__(self, loss: nn.Module, miner: nn.Module | None = None, memory: nn.Module | None = None):
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.memory = memory

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.memory is not None:
            return self.memory(embeddings, labels)
        if self.miner is not None:
            return self.loss(embeddings, labels, pairs=self.miner(embeddings, labels))
        return self.loss(embeddings, labels)

    @property
    def proxies(self) -> torch.Tensor | None:
        return getattr(self.loss, "proxies", None)


class EnsembleObjective(nn.Module):
    """One :class:`TrainingObjective` per member of an ``EmbedderEnsemble``; their losses add up.

    ``objective(ensemble_embeddings, labels)`` splits the ensemble's embedding into the members'
    own (``sizes`` columns each, rescaled by ``sqrt(N)`` back to the member's norm) and applies
    member ``i``'s loss, miner and memory to part ``i`` alone: each member learns as if it were
    trained by itself, with its own proxies.
    """

    def __init__(self, objectives: list[TrainingObjective], sizes: list[int]):
        super().__init__()
        if len(objectives) != len(sizes):
            raise ValueError(f"EnsembleObjective got {len(objectives)} objectives for {len(sizes)} members.")
        self.objectives = nn.ModuleList(objectives)
        self.sizes = list(sizes)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        parts = split_embeddings(embeddings, self.sizes)
        return torch.stack([objective(part, labels) for objective, part in zip(self.objectives, parts)]).sum()
