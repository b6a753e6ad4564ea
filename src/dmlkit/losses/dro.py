"""The DRO pairwise objective ``sum_ij p*_ij l_ij`` and its grouped KL variant (DRO-KL-G).

"A Simple and Effective Framework for Pairwise Deep Metric Learning" (DRO), Eq. (1) and (7).
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import InstanceOf, Options
from dmlkit.distances import CosineSimilarity
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES, MetricLoss, zero_loss
from dmlkit.mining.dro import BASE_LOSSES, DRO_WEIGHTINGS, DROKLGroupedMiner, DROPairWeighting


@LOSSES.register("dro")
class DROLoss(MetricLoss):
    """``sum_ij p*_ij l_ij(theta)`` with ``p*`` from a DRO pair weighting (detached).

    DRO, Eq. (1) and Lemma 1: the optimal distributional variable ``p*`` is found without
    gradients and the model follows ``sum p*_ij grad l_ij``; the returned value is
    ``g(theta, p*)`` (for DRO-KL it excludes the ``-gamma KL`` term, which has no gradient at
    ``p*``). ``weighting`` is a DRO weighter instance, or one of ``"top_k"``, ``"top_k_pn"``,
    ``"kl"``, ``"kl_grouped"`` built with ``base`` and ``weighting_params`` (e.g. ``k=160``,
    ``gamma=0.1``, ``margin=0.2``, ``threshold=0.5``).
    """

    _parameter_constraints = {"weighting": [Options(tuple(DRO_WEIGHTINGS)), InstanceOf((DROPairWeighting,))],
     "base": [Options(BASE_LOSSES), InstanceOf((type(None),))]}

    def __init__(self, weighting: str | DROPairWeighting = "top_k", base: str | None = None, **weighting_params):
        super().__init__()
        owner = type(self).__name__
        if isinstance(weighting, DROPairWeighting):
            if weighting_params:
                raise InvalidParameterError(
                    f"{owner} got an already-built weighting and extra parameters "
                    f"{sorted(weighting_params)}; set them on the weighting instead."
                )
            if base is not None and base != weighting.base:
                raise InvalidParameterError(
                    f"The 'base' parameter of {owner} ({base!r}) disagrees with the weighting's base "
                    f"({weighting.base!r}); the weights and the loss must use the same pair loss."
                )
            self.weighting = weighting
        else:
            self.weighting = DRO_WEIGHTINGS[weighting](base=base or "margin", **weighting_params)
        self.similarity = CosineSimilarity()

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor | None,
                     ref_emb: torch.Tensor | None = None, ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        selection = self.weighting(embeddings, labels, ref_emb, ref_labels)
        if selection.num_pairs == 0:
            return zero_loss(embeddings, ref_emb)
        reference = embeddings if ref_emb is None else ref_emb.to(embeddings.dtype)
        similarity = self.similarity(embeddings, reference)
        terms = self.weighting.pair_loss(similarity, selection.positive)
        weights = selection.positive_weight + selection.negative_weight
        return (weights.to(terms.dtype) * terms).sum()

    def extra_repr(self) -> str:
        return ""


@LOSSES.register("dro_kl_g")
class DROKLGroupedLoss(DROLoss):
    """DRO-KL-G: per-anchor KL-weighted positive and negative pairs, optionally with pseudo pairs.

    DRO, Eq. (7) and Eq. (23): ``(1/B) sum_i (sum_{j in P_i} p+_ij l_ij + sum_{j in N_i} p-_ij l_ij)``
    with ``p+_i = softmax(l_i / gamma_pos)``, ``p-_i = softmax(l_i / gamma_neg)`` (detached),
    and with ``pseudo_pairs=True`` one extra zero-gradient pair of similarity ``c+``/``c-`` in
    each softmax. Margin base with ``gamma=1`` recovers the lifted-structure gradient (Eq. (22));
    ``c+ = c- = lambda``, ``gamma_pos = 1/alpha``, ``gamma_neg = 1/beta`` recovers multi-similarity
    (Eq. (27)). See :class:`~dmlkit.mining.DROKLGroupedMiner` for the parameters.
    """

    def __init__(self, gamma_pos: float = 0.1, gamma_neg: float = 0.1, pseudo_pairs: bool = False,
                 pos_offset: float | None = None, neg_offset: float | None = None,
                 ignore_zero_losses: bool = False, base: str = "margin", margin: float = 0.2,
                 threshold: float = 0.5, alpha: float = 2.0, beta: float = 50.0):
        weighting = DROKLGroupedMiner(gamma_pos=gamma_pos, gamma_neg=gamma_neg, pseudo_pairs=pseudo_pairs,
                                      pos_offset=pos_offset, neg_offset=neg_offset,
                                      ignore_zero_losses=ignore_zero_losses, base=base, margin=margin,
                                      threshold=threshold, alpha=alpha, beta=beta)
        super().__init__(weighting)


__all__ = ["DROKLGroupedLoss", "DROLoss"]
