"""An embedder's trained part alone, for training on its frozen stages' stored outputs
(:mod:`dmlkit.engine.frozen_stage_store`)."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from dmlkit.core.validation import InstanceOf, validate_params
from dmlkit.exceptions import InvalidParameterError
from dmlkit.models.embedder import Embedder


class TrainedStages(nn.Module):
    """Map the frozen stages' output ``[B, C, h, w]`` to embeddings ``[B, E]``: :meth:`Embedder.forward_from_prefix`.

    Holds the whole ``embedder`` (its frozen stages stay in the state dict, unused and without
    gradients), so the trained weights load back into an :class:`Embedder` that embeds images. The
    optimiser's groups are the embedder's: the trained stages at the backbone's rate, pooling and
    head at the head's.
    """

    def __init__(self, embedder: Embedder):
        super().__init__()
        validate_params("TrainedStages", {"embedder": embedder}, {"embedder": [InstanceOf((Embedder,))]})
        problem = embedder.prefix_problem()
        if problem is not None:
            raise InvalidParameterError(f"TrainedStages needs an embedder with a fixed frozen prefix: {problem}.")
        self.embedder = embedder

    @property
    def embedding_size(self) -> int:
        return self.embedder.embedding_size

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, C, h, w]`` (the frozen stages' output, any float dtype) -> ``[B, E]``."""
        return self.embedder.forward_from_prefix(features)

    def trunk_parameters(self) -> Iterator[nn.Parameter]:
        return self.embedder.trunk_parameters()

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.embedder.head_parameters()


__all__ = ["TrainedStages"]
