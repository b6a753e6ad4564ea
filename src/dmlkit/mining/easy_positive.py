"""Easy positive sampling: each anchor's positive is its nearest same-class sample."""

from __future__ import annotations

import torch

from dmlkit.core.validation import NONE, Interval, Options, validate_params
from dmlkit.distances import BaseDistance, CosineSimilarity, as_distance
from dmlkit.mining.base import (
    DISTANCE,
    BaseMiner,
    SeededMinerMixin,
    default_distance,
    empty_triplets,
)
from dmlkit.mining.batch_hard import extreme_per_row
from dmlkit.mining.distance_weighted import distance_weighted_log_weights, row_probabilities, sphere_distances
from dmlkit.mining.multi_similarity import hard_negative_mask
from dmlkit.mining.selection import PairSelection, TripletSelection

NEGATIVE_STRATEGIES = ("random", "distance_weighted", "semihard", "multi_similarity")


def easy_positives(mat: torch.Tensor, positive: torch.Tensor, inverted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index [B], has_positive [B])``: each anchor's nearest same-class reference.

    EPS, Sec. 4.3: ``p_a = argmin_{t in C_a} ||f(t) - f(a)||`` (most similar for similarities).
    """
    return extreme_per_row(mat, positive, largest=inverted)


class EasyPositiveMiner(SeededMinerMixin, BaseMiner):
    """Triplets ``(a, p_a, n)`` (or MS pairs) with ``p_a`` the easy positive of anchor ``a``.

    "Reducing Class Collapse in Metric Learning with Easy Positive Sampling" (EPS), Sec. 4.3
    and Sec. 5.2.2. Negatives, following the paper's four options:

    * ``"random"``: ``negatives_per_anchor`` draws, uniform over the other classes.
    * ``"distance_weighted"``: ``negatives_per_anchor`` draws with Wu et al.'s ``∝ 1/q(d)``
      (on L2-normalised embeddings, whatever ``distance`` is) — the margin-loss setting.
    * ``"semihard"``: every negative with ``d(a,p_a) < d(a,n) < d(a,p_a) + margin`` (the
      positive is fixed by EPS, then semi-hard negatives are taken relative to it).
    * ``"multi_similarity"``: returns a :class:`PairSelection` whose positives are the easy
      positives and whose negatives are MS hard negatives, ``S_an + epsilon > min_p S_ap``
      over all the anchor's positives — the paper replaces only MS's positive mining and
      keeps "the same hard-negative method". Anchors without negatives keep no positive.

    The default measure is Euclidean distance between L2-normalised embeddings, or cosine
    similarity for ``"multi_similarity"`` (MS's own measure); both rank positives alike.
    Draws are with replacement, from this miner's own generator.
    """

    _repr_keys = ("negative", "margin", "epsilon", "negatives_per_anchor", "seed")

    def __init__(self, negative: str = "semihard", margin: float = 0.2, epsilon: float = 0.1,
                 negatives_per_anchor: int = 1, cutoff: float = 0.5, nonzero_loss_cutoff: float = 1.4,
                 distance: BaseDistance | None = None, seed: int = 0,
                 generator: torch.Generator | None = None):
        super().__init__()
        validate_params(
            type(self).__name__,
            {"negative": negative, "margin": margin, "epsilon": epsilon,
             "negatives_per_anchor": negatives_per_anchor, "cutoff": cutoff,
             "nonzero_loss_cutoff": nonzero_loss_cutoff, "distance": distance},
            {"negative": [Options(NEGATIVE_STRATEGIES)], "margin": [Interval(float, 0, None)],
             "epsilon": [Interval(float, 0, None)], "negatives_per_anchor": [Interval(int, 1, None)],
             "cutoff": [Interval(float, 0, 2, closed="neither")],
             "nonzero_loss_cutoff": [Interval(float, 0, None, closed="neither")],
             "distance": [DISTANCE, NONE]},
        )
        self.negative = negative
        self.margin = float(margin)
        self.epsilon = float(epsilon)
        self.negatives_per_anchor = negatives_per_anchor
        self.cutoff = float(cutoff)
        self.nonzero_loss_cutoff = float(nonzero_loss_cutoff)
        if distance is None:
            distance = CosineSimilarity() if negative == "multi_similarity" else default_distance()
        self.distance = as_distance(distance)
        self._init_generator(seed, generator)

    def mine(self, embeddings, ref_emb, positive, negative) -> TripletSelection | PairSelection:
        mat = self.distance(embeddings, ref_emb)
        inverted = self.distance.is_inverted
        easy_pos, has_pos = easy_positives(mat, positive, inverted)
        if self.negative == "multi_similarity":
            keep = has_pos & negative.any(dim=1)  # as in MS mining, no negatives -> no positives
            anchors = torch.arange(mat.shape[0], device=mat.device)
            pos_mask = torch.zeros_like(positive)
            pos_mask[anchors[keep], easy_pos[keep]] = True
            return PairSelection(pos_mask, hard_negative_mask(mat, positive, negative, self.epsilon, inverted))
        if self.negative == "semihard":
            return self._semihard(mat, easy_pos, has_pos, negative)
        if self.negative == "random":
            probs, has_neg = row_probabilities(torch.zeros_like(mat), negative)
        else:
            log_w = distance_weighted_log_weights(sphere_distances(embeddings, ref_emb), embeddings.shape[1],
                                                  self.cutoff, self.nonzero_loss_cutoff)
            probs, has_neg = row_probabilities(log_w, negative)
        anchor = (has_pos & has_neg).nonzero(as_tuple=True)[0]
        if anchor.numel() == 0:
            return empty_triplets(embeddings.device)
        neg = self.sample_rows(probs[anchor], self.negatives_per_anchor)
        anchor = anchor.repeat_interleave(self.negatives_per_anchor)
        return TripletSelection(anchor, easy_pos[anchor], neg.reshape(-1))

    def _semihard(self, mat, easy_pos, has_pos, negative) -> TripletSelection:
        anchor = has_pos.nonzero(as_tuple=True)[0]
        if anchor.numel() == 0:
            return empty_triplets(mat.device)
        pos = easy_pos[anchor]
        margins = self.distance.margin(mat[anchor], mat[anchor, pos][:, None])
        kept = negative[anchor] & (margins > 0) & (margins < self.margin)
        row, neg = kept.nonzero(as_tuple=True)
        return TripletSelection(anchor[row], pos[row], neg)
