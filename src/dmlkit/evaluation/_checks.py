"""Input checks shared by the evaluation functions (clear errors for bad embeddings)."""

from __future__ import annotations

from typing import Sequence

import torch

from dmlkit.core.validation import check_embeddings_labels
from dmlkit.exceptions import DataError, InvalidParameterError

METRICS = ("euclidean", "cosine", "dot")
BACKENDS = ("torch", "faiss")


def check_finite(x: torch.Tensor, name: str) -> None:
    """Raise DataError when ``x`` holds NaN or infinite values."""
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise DataError(f"{name} contains {bad} NaN or infinite value(s); evaluation needs finite embeddings.")


def check_evaluation_inputs(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    reference: torch.Tensor | None,
    reference_labels: torch.Tensor | None,
) -> None:
    """Validate query (and optional reference) embeddings and labels for retrieval."""
    check_embeddings_labels(embeddings, labels)
    check_finite(embeddings, "embeddings")
    if reference is None and reference_labels is not None:
        raise InvalidParameterError("reference_labels was given without reference embeddings.")
    if reference is None:
        if embeddings.shape[0] < 2:
            raise DataError(
                f"Leave-one-out retrieval needs at least two samples; embeddings has {embeddings.shape[0]} row."
            )
        return
    if reference_labels is None:
        raise InvalidParameterError("reference was given without reference_labels.")
    check_embeddings_labels(reference, reference_labels, name="reference", labels_name="reference_labels")
    check_finite(reference, "reference")
    if reference.shape[1] != embeddings.shape[1]:
        raise DataError(
            f"embeddings has {embeddings.shape[1]} columns but reference has {reference.shape[1]}."
        )


def check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """Return ``ks`` as a tuple of positive ints or raise InvalidParameterError."""
    try:
        values = tuple(ks)
    except TypeError:
        values = ()
    if not values or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in values):
        raise InvalidParameterError(
            f"The 'ks' parameter of retrieval_metrics must be a non-empty sequence of ints >= 1. Got {ks!r} instead."
        )
    return values
