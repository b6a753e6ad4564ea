"""The batch read as consecutive triplets: rows ``(3i, 3i + 1, 3i + 2)``."""

from __future__ import annotations

import torch

from dmlkit.core.validation import check_embeddings_labels
from dmlkit.exceptions import DataError
from dmlkit.mining.base import BaseMiner
from dmlkit.mining.selection import TripletSelection


class EmbeddingsAlreadyPackagedAsTriplets(BaseMiner):
    """Triplets ``(3i, 3i + 1, 3i + 2)``: the batch was built as anchor, positive, negative rows.

    Labels are not read (as in pytorch-metric-learning); the batch size must be a multiple of 3.
    """

    def forward(self, embeddings, labels, ref_emb=None, ref_labels=None) -> TripletSelection:
        # only the row count matters: no reference resolution, no [B, B] label masks
        check_embeddings_labels(embeddings, labels)
        return self.mine(embeddings, embeddings, None, None)

    def mine(self, embeddings, ref_emb, positive, negative) -> TripletSelection:
        size = embeddings.shape[0]
        if size % 3:
            raise DataError(f"EmbeddingsAlreadyPackagedAsTriplets needs a batch of whole triplets "
                            f"(a multiple of 3 rows). Got {size} rows.")
        anchor = torch.arange(0, size, 3, device=embeddings.device)
        return TripletSelection(anchor, anchor + 1, anchor + 2)
