"""Ensemble evaluation: concatenate several models' embeddings before retrieval (ASAP 4-fold 512-D)."""

from __future__ import annotations

from typing import Sequence

import torch

from dmlkit.distances import normalize
from dmlkit.exceptions import DataError, InvalidParameterError


def concatenate_embeddings(parts: Sequence[torch.Tensor], *, normalization: str = "l2") -> torch.Tensor:
    """Concatenate ``m`` embedding sets ``[N, D_i]`` into ``[N, sum D_i]``, normalising each part first.

    With ``normalization="l2"`` every model contributes equally (each part has unit norm, the
    concatenation has norm ``sqrt(m)``), as in the 4 x 128-D ensembles of Musgrave et al. / ASAP.
    """
    parts = list(parts)
    if not parts:
        raise InvalidParameterError("concatenate_embeddings needs at least one embedding tensor.")
    rows = parts[0].shape[0]
    for i, p in enumerate(parts):
        if not isinstance(p, torch.Tensor) or p.dim() != 2:
            raise InvalidParameterError(f"part {i} must be a [N, D] torch.Tensor.")
        if p.shape[0] != rows:
            raise DataError(f"part 0 has {rows} rows but part {i} has {p.shape[0]}.")
    return torch.cat([normalize(p.float(), normalization) for p in parts], dim=1)


def ensemble_retrieval_metrics(
    parts: Sequence[torch.Tensor],
    labels: torch.Tensor,
    *,
    reference_parts: Sequence[torch.Tensor] | None = None,
    reference_labels: torch.Tensor | None = None,
    normalization: str = "l2",
    **kwargs,
) -> dict[str, float | int]:
    """Retrieval metrics of the concatenated ensemble; ``kwargs`` go to :func:`retrieval_metrics`."""
    from dmlkit.evaluation.retrieval import retrieval_metrics

    reference = None
    if reference_parts is not None:
        reference = concatenate_embeddings(reference_parts, normalization=normalization)
    return retrieval_metrics(
        concatenate_embeddings(parts, normalization=normalization),
        labels,
        reference=reference,
        reference_labels=reference_labels,
        **kwargs,
    )
