"""Several embedders side by side: the concatenation of their embeddings is the ensemble's embedding.

The same construction as the 512-D ensemble of ASAP Table 1 (after Musgrave et al. 2020): each
member's normalised embedding is concatenated and the result re-normalised. Here the members are
trained together in one run (``model.ensemble=N``), each from its own initialisation and with its
own loss (``dmlkit.engine.objective.EnsembleObjective``), on the same batches, or with
``member_batches`` each on its own batch (``protocol.member_folds``: each member holds out its own
fold of the training classes, ``dmlkit.engine.member_folds``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from dmlkit.models.embedder import Embedder, EmbedsImages


class EmbedderEnsemble(EmbedsImages, nn.Module):
    """``N`` :class:`Embedder` members: ``[B, C, H, W] -> [B, sum of member sizes]``.

    The output is ``cat(member_1(x), ..., member_N(x)) / sqrt(N)``: with L2-normalised members it
    has unit norm, and its cosine similarity is the mean of the members' similarities.
    :func:`split_embeddings` undoes the concatenation for the per-member losses.
    ``pretrained_cfg`` and :meth:`preprocess` are the first member's (all members share one
    backbone name, so one preprocessing); a loaded ensemble embeds image files as a loaded
    :class:`Embedder` does (:class:`~dmlkit.models.embedder.EmbedsImages`).

    With ``member_batches=True``, a training-mode batch is ``N`` blocks of equal size, block ``i``
    member ``i``'s own batch: the output is block-diagonal, ``[N x b, sum of member sizes]``, with
    member ``i``'s embeddings of block ``i`` in its columns (the same ``1 / sqrt(N)`` scale) and zeros
    elsewhere, and each member computes only its block. Eval mode embeds every image by every member.
    """

    def __init__(self, members: Sequence[Embedder], *, member_batches: bool = False):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"EmbedderEnsemble needs at least 2 members. Got {len(members)}.")
        self.members = nn.ModuleList(members)
        self.pretrained_cfg: dict[str, Any] = dict(members[0].pretrained_cfg)
        self.weights_report = members[0].weights_report
        self.pretrained_weights = getattr(members[0], "pretrained_weights", None)
        self.member_batches = member_batches

    @property
    def embedding_size(self) -> int:
        return sum(m.embedding_size for m in self.members)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = len(self.members) ** -0.5
        if self.training and self.member_batches:
            if x.shape[0] % len(self.members):
                raise ValueError(f"EmbedderEnsemble with member_batches takes {len(self.members)} equal blocks of "
                                 f"rows in training mode. Got a batch of {x.shape[0]}.")
            blocks = x.chunk(len(self.members))
            return torch.block_diag(*[member(block) for member, block in zip(self.members, blocks)]) * scale
        return torch.cat([member(x) for member in self.members], dim=1) * scale

    @property
    def member_sizes(self) -> list[int]:
        return [m.embedding_size for m in self.members]

    def preprocess(self, images: torch.Tensor, *, resize: bool = False) -> torch.Tensor:
        return self.members[0].preprocess(images, resize=resize)

    def extra_repr(self) -> str:
        return f"members={len(self.members)}" + (", member_batches=True" if self.member_batches else "")


def split_embeddings(embeddings: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """The members' own embeddings ``[B, E_i]`` from an ensemble's ``[B, sum E_i]`` (rescaled by ``sqrt(N)``)."""
    scale = len(sizes) ** 0.5
    return [part * scale for part in embeddings.split(list(sizes), dim=1)]
