"""The base of the ranking losses: PML's call within one batch, labels required, miner weights.

A ranking loss sees all ``B x B`` pairs of its batch. PML's ``indices_tuple`` does not select
pairs for FastAP and Smooth-AP: it weights each anchor by how often it occurs in the tuple
(``count / max count``; PML's ``convert_to_weights``); the other ranking losses refuse it.
"""

from __future__ import annotations

import torch

from dmlkit.core.devices import autocast_off, to_device
from dmlkit.distances import BaseDistance
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import require_orientation
from dmlkit.mining.selection import PairSelection, TripletSelection


def anchor_weights(indices_tuple: tuple, num: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[B]`` weights: occurrences of each sample in PML's index tuple over the largest count (1s if empty).

    A dmlkit miner's selection counts as the PML tuple of the same pairs or triplets."""
    if isinstance(indices_tuple, (PairSelection, TripletSelection)):
        indices_tuple = indices_tuple.to_indices_tuple()
    if not isinstance(indices_tuple, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in indices_tuple):
        raise InvalidParameterError(
            f"indices_tuple must be PML's tuple of 3 or 4 index tensors. Got {type(indices_tuple).__name__}."
        )
    indices = torch.cat([t.reshape(-1).to(device=device, dtype=torch.long) for t in indices_tuple])
    if indices.numel() == 0:
        return torch.ones(num, dtype=dtype, device=device)
    if int(indices.min()) < 0 or int(indices.max()) >= num:
        raise DataError(f"indices_tuple indexes past the {num} embeddings.")
    counts = torch.bincount(indices, minlength=num).to(dtype)
    return counts / counts.max()


def positive_lists(positive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index [B, M], valid [B, M])``: each row's positive columns, padded to the largest count ``M``."""
    counts = positive.sum(1)
    width = max(int(counts.max()), 1)
    index = torch.sort(positive.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :width]
    valid = torch.arange(width, device=positive.device)[None, :] < counts[:, None]
    return index, valid


class RankingLoss(PairLoss):
    """``loss(embeddings [B, D], labels [B], indices_tuple=None) -> scalar`` within the batch."""

    supports_references = False
    #: Hands its terms to the reducer itself, so any reducer object applies (PairLoss.reduces_terms).
    reduces_terms = True
    requires_labels = True
    #: Whether PML's ``indices_tuple`` weights the anchors (FastAP, Smooth-AP).
    takes_anchor_weights = False
    #: The measure the loss's equation needs: a similarity (``"a similarity ..."``) or None (any).
    measure: str | None = None

    def __init__(
        self, *, distance: BaseDistance | None, reduction: str, reducer: object | None = None,
        embedding_regularizer: object | None = None, embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=None, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        if self.measure is not None:
            require_orientation(self.distance, type(self).__name__, True, self.measure)

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None) -> torch.Tensor:
        """PML's call; ``labels`` are required and ``ref_emb`` is refused."""
        name = type(self).__name__
        if labels is None:
            raise InvalidParameterError(f"{name} needs class labels [B] (it ranks the batch by them).")
        if isinstance(embeddings, torch.Tensor):
            labels, indices_tuple, ref_emb, ref_labels = to_device((labels, indices_tuple, ref_emb, ref_labels),
                                                                   embeddings.device)
            self.follow_embeddings_(embeddings)
        weights = None
        if indices_tuple is not None:
            if not self.takes_anchor_weights:
                raise InvalidParameterError(f"{name} takes no indices_tuple: it ranks every pair of the batch.")
            weights = anchor_weights(indices_tuple, embeddings.shape[0], embeddings.dtype, embeddings.device)
        batch = self._prepare(embeddings, labels, None, None, ref_emb, ref_labels, None)
        with autocast_off(embeddings.device.type):
            loss = self.compute_ranking_loss(batch, weights)
        return self.add_regularization(loss, embeddings)

    def compute_ranking_loss(self, batch: PairBatch, weights: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


def node_shares(values: torch.Tensor, start: float, delta: float, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(below, share)``: each value's lower node ``below`` of the grid ``start + r delta`` (``r < num_nodes``)
    and the share ``(v - t_below) / delta`` it gives the node above (``1 - share`` to ``below``): the
    triangular kernels of FastAP Eq. (10) and the histogram loss's Eq. (2). Values on the grid's last
    node go to it whole; ``share`` carries the gradient."""
    scaled = (values - start) / delta
    below = scaled.detach().floor().clamp_(0, num_nodes - 2)
    return below.long(), scaled - below


def sigmoid_rank_sums(
    sim: torch.Tensor, index: torch.Tensor, masks: torch.Tensor, temperature: float, clamp: float | None = None
) -> torch.Tensor:
    """``[B, M, C]``: ``sum_k masks[i, k, c] sigmoid((s_ik - s_ij) / T)`` for the listed ``j = index[i, m]``.

    The smoothed count of the references ranked before ``j`` in anchor ``i``'s list, restricted by
    each of the ``C`` masks ``[B, B, C]`` (Smooth-AP Eq. (8), PNP Eq. (5)); ``clamp`` bounds the
    sigmoid's argument (PNP, as PML). One ``[B, M, B]`` tensor for the ``M`` listed columns per row,
    instead of ``[B, B, B]``.
    """
    listed = sim.gather(1, index)  # [B, M]
    z = (sim[:, None, :] - listed[:, :, None]) / temperature
    if clamp is not None:
        z = z.clamp(-clamp, clamp)
    return torch.bmm(torch.sigmoid(z), masks)
