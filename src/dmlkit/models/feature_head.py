"""The embedding head alone, for training on stored backbone features (``dmlkit.engine.pooled_feature_store``)."""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.core.validation import Interval, Options, validate_params
from dmlkit.distances import normalize
from dmlkit.distances.normalization import NORMALIZATIONS
from dmlkit.models.embedder import HEAD_INITS, make_linear_head


class FeatureHead(nn.Module):
    """Map stored features ``[B, F, 1, 1]`` (or ``[B, F]``) to embeddings ``[B, D]``: linear head, then normalisation.

    The same head as :class:`~dmlkit.models.Embedder`'s (``make_linear_head``: Kaiming fan-out or
    identity initialisation, zero bias) and the same normalisations (``"l2"``, ASAP Sec. 4.4's
    ``"bounded"``, ``"none"``), computed in fp32; a frozen backbone's pooled features are the input.
    """

    def __init__(self, num_features: int, embedding_size: int = 128, normalization: str = "l2", init: str = "kaiming"):
        super().__init__()
        validate_params(
            "FeatureHead",
            {"num_features": num_features, "embedding_size": embedding_size, "normalization": normalization,
             "init": init},
            {"num_features": [Interval(int, 1, None)], "embedding_size": [Interval(int, 1, None)],
             "normalization": [Options(NORMALIZATIONS)], "init": [Options(HEAD_INITS)]},
        )
        self.head = make_linear_head(num_features, embedding_size, init)
        self.normalization = normalization

    @property
    def embedding_size(self) -> int:
        return int(self.head.out_features)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, F, 1, 1]`` or ``[B, F]`` -> ``[B, D]``."""
        x = features.flatten(1).float()
        with torch.autocast(x.device.type, enabled=False):
            return normalize(self.head(x), self.normalization)

    def extra_repr(self) -> str:
        return f"normalization={self.normalization!r}"


__all__ = ["FeatureHead"]
