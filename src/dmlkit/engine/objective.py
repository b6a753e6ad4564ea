"""What the engine minimises: a loss with its optional miner and cross-batch memory."""

from __future__ import annotations

import torch
from torch import nn


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
