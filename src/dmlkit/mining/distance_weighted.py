"""Distance-weighted negative sampling on the unit sphere."""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval, validate_params
from dmlkit.distances import BaseDistance, l2_normalize, squared_euclidean
from dmlkit.mining.base import BaseMiner, SeededMinerMixin, empty_triplets, normalised_euclidean
from dmlkit.mining.selection import TripletSelection


def sphere_distances(embeddings: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` Euclidean distances between the L2-normalised rows (in ``[0, 2]``)."""
    return squared_euclidean(l2_normalize(embeddings), l2_normalize(ref_emb)).sqrt()


def distance_weighted_log_weights(distances: torch.Tensor, dim: int, cutoff: float,
                                  nonzero_loss_cutoff: float) -> torch.Tensor:
    """``[B, R]`` log sampling weights ``-log q(d)`` of negatives (``-inf`` where excluded).

    Wu et al., "Sampling Matters in Deep Embedding Learning" (2017), Sec. 4: on the
    ``n``-sphere ``q(d) ∝ d^(n-2) (1 - d^2/4)^((n-3)/2)``; negatives are drawn with
    probability ``∝ 1/q(d)``, with ``d`` clipped below at ``cutoff`` (bounded variance) and
    weight 0 for ``d >= nonzero_loss_cutoff`` (pairs that cannot have a loss).
    """
    d = distances.clamp_min(cutoff)
    one_minus = (1.0 - 0.25 * d * d).clamp_min(torch.finfo(d.dtype).tiny)
    log_weights = -(dim - 2.0) * d.log() - ((dim - 3.0) / 2.0) * one_minus.log()
    # A coincident pair (d = 0 with cutoff 0) has no finite weight: it is never drawn.
    excluded = (distances >= nonzero_loss_cutoff) | ~torch.isfinite(log_weights)
    return log_weights.masked_fill(excluded, float("-inf"))


def row_probabilities(log_weights: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probabilities [B, R], has_any [B])``: a row-wise softmax of ``log_weights`` over ``allowed``."""
    masked = log_weights.masked_fill(~allowed, float("-inf"))
    has_any = torch.isfinite(masked).any(dim=1)
    safe = masked.masked_fill(~has_any[:, None], 0.0)
    probs = torch.softmax(safe, dim=1).masked_fill(~torch.isfinite(masked), 0.0)
    return probs, has_any


class DistanceWeightedMiner(SeededMinerMixin, BaseMiner):
    """For every positive pair ``(a, p)``, one negative drawn with probability ``∝ 1/q(d(a, n))``.

    Wu et al. (2017), Sec. 4. Distances are Euclidean between L2-normalised embeddings
    (the sphere the density ``q`` is derived on); the weights are normalised per anchor in
    log space, so large ``D`` cannot overflow. Anchors whose negatives all lie beyond
    ``nonzero_loss_cutoff`` yield no triplet.
    """

    _repr_keys = ("cutoff", "nonzero_loss_cutoff", "seed")

    def __init__(self, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4, distance: BaseDistance | None = None,
                 *, seed: int = 0, generator: torch.Generator | None = None):
        super().__init__()
        validate_params(type(self).__name__, {"cutoff": cutoff, "nonzero_loss_cutoff": nonzero_loss_cutoff},
                        {"cutoff": [Interval(float)], "nonzero_loss_cutoff": [Interval(float)]})
        # PML asserts this one distance; the sphere distances below are computed directly
        self.distance = normalised_euclidean(distance, type(self).__name__)
        self.cutoff = float(cutoff)
        self.nonzero_loss_cutoff = float(nonzero_loss_cutoff)
        self._init_generator(seed, generator)

    def negative_probabilities(self, embeddings: torch.Tensor, ref_emb: torch.Tensor,
                               negative: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(probabilities [B, R], has_any [B])`` of drawing each reference as an anchor's negative."""
        log_w = distance_weighted_log_weights(sphere_distances(embeddings, ref_emb), embeddings.shape[1],
                                              self.cutoff, self.nonzero_loss_cutoff)
        return row_probabilities(log_w, negative)

    def mine(self, embeddings, ref_emb, positive, negative) -> TripletSelection:
        probs, has_neg = self.negative_probabilities(embeddings, ref_emb, negative)
        kept = positive & has_neg[:, None]
        anchor, pos = kept.nonzero(as_tuple=True)
        if anchor.numel() == 0:
            return empty_triplets(embeddings.device)
        # Draw max_positives negatives per anchor row ([B, K], never [P, R]), then give the
        # r-th positive of each anchor its r-th draw.
        rank = kept.cumsum(dim=1)[anchor, pos] - 1
        draws = self.sample_rows(probs[has_neg], int(kept.sum(dim=1).max()))
        row_of_anchor = has_neg.cumsum(0) - 1
        return TripletSelection(anchor, pos, draws[row_of_anchor[anchor], rank])
