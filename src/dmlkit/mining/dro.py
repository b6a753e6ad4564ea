"""Distributionally robust pair weighting (DRO-TopK, DRO-TopK-PN, DRO-KL, DRO-KL-G).

"A Simple and Effective Framework for Pairwise Deep Metric Learning" (DRO), Eq. (1):
``F(theta) = max_{p in U} sum_ij p_ij l_ij(theta)``. Each weighter scores every pair of the
mini-batch with a simple pairwise base loss ``l_ij`` on cosine similarity, solves the inner
maximisation in closed form, and returns the optimal ``p*`` as the pair weights of a
:class:`PairSelection`. Weights are detached: the model is updated with
``sum_ij p*_ij grad l_ij`` (DRO, Lemma 1), so a loss computes ``sum weight * l_ij`` over the
selected pairs with no further normalisation.

Normalisation of the weights (what ``sum weight * l`` means):

* TopK, TopK-PN, KL: one simplex over the whole mini-batch (weights sum to 1).
* KL-G: one simplex per anchor and sign (Eq. (7)), averaged over the ``B`` anchors (each
  anchor's weights are divided by ``B``), so the objective is on the scale of MS loss Eq. (2).

Self-pairs ``(i, i)`` are excluded (the paper's footnote 1 includes them for simplicity). A
batch without any positive pair or without any negative pair has no imbalance to correct and
gets an empty selection.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dmlkit.core.validation import BOOL, NONE, Interval, Options, validate_params
from dmlkit.distances import CosineSimilarity
from dmlkit.mining.base import BaseMiner, SeededMinerMixin, empty_pairs
from dmlkit.mining.selection import PairSelection

BASE_LOSSES = ("margin", "binomial")
POSITIVE_FLOAT = Interval(float, 0, None, closed="neither")


class DROPairLoss(nn.Module):
    """``[B, R]`` pairwise base losses ``l_ij`` from cosine similarities ``S [B, R]``.

    DRO, Sec. 3.3 and Sec. 4 (``L_M``, ``L_B``), with threshold ``lambda``:

    * ``"margin"`` (Wu et al.): ``l = [m + y (lambda - S)]_+`` with ``y = +1`` for positive
      and ``-1`` for negative pairs.
    * ``"binomial"`` (Yi et al., in the scaled form of MS Eq. (2)):
      ``l = (1/alpha) log(1 + e^{-alpha (S - lambda)})`` for positives and
      ``(1/beta) log(1 + e^{beta (S - lambda)})`` for negatives — a smooth hinge.
    """

    def __init__(self, base: str = "margin", margin: float = 0.2, threshold: float = 0.5,
                 alpha: float = 2.0, beta: float = 50.0, owner: str | None = None):
        super().__init__()
        validate_params(owner or type(self).__name__,
                        {"base": base, "margin": margin, "threshold": threshold, "alpha": alpha, "beta": beta},
                        {"base": [Options(BASE_LOSSES)], "margin": [Interval(float)],
                         "threshold": [Interval(float)], "alpha": [POSITIVE_FLOAT], "beta": [POSITIVE_FLOAT]})
        self.base = base
        self.margin = float(margin)
        self.threshold = float(threshold)
        self.alpha = float(alpha)
        self.beta = float(beta)

    def forward(self, similarity: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        """Base loss of each pair: the positive formula where ``positive`` is True, else the negative one."""
        if self.base == "margin":
            signed = torch.where(positive, self.threshold - similarity, similarity - self.threshold)
            return (self.margin + signed).clamp_min(0.0)
        pos = F.softplus(self.alpha * (self.threshold - similarity)) / self.alpha
        neg = F.softplus(self.beta * (similarity - self.threshold)) / self.beta
        return torch.where(positive, pos, neg)

    def of_similarity(self, similarity: float, positive: bool) -> float:
        """The base loss of a single pair with the given similarity (used for pseudo pairs)."""
        s = torch.tensor([[similarity]], dtype=torch.float64)
        return float(self(s, torch.tensor([[positive]])))

    def extra_repr(self) -> str:
        return (f"base={self.base!r}, margin={self.margin}, threshold={self.threshold}, "
                f"alpha={self.alpha}, beta={self.beta}")


class DROPairWeighting(BaseMiner):
    """Base of the DRO weighters: scores all pairs with :class:`DROPairLoss`, then :meth:`weigh`."""

    def __init__(self, base: str = "margin", margin: float = 0.2, threshold: float = 0.5,
                 alpha: float = 2.0, beta: float = 50.0):
        super().__init__()
        self.pair_loss = DROPairLoss(base, margin, threshold, alpha, beta, owner=type(self).__name__)
        self.similarity = CosineSimilarity()

    @property
    def base(self) -> str:
        return self.pair_loss.base

    def mine(self, embeddings, ref_emb, positive, negative) -> PairSelection:
        if not positive.any() or not negative.any():
            return empty_pairs(*positive.shape, device=positive.device)
        losses = self.pair_loss(self.similarity(embeddings, ref_emb), positive)
        return self.weigh(losses, positive, negative)

    def weigh(self, losses: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> PairSelection:  # pragma: no cover
        """The optimal weights ``p*`` for pair losses ``[B, R]`` under ``[B, R]`` pair masks."""
        raise NotImplementedError


def _top_k_mask(losses: torch.Tensor, candidates: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """``(mask [B, R], k_eff)``: the ``min(k, #candidates)`` candidate pairs with the largest losses."""
    k_eff = min(k, int(candidates.sum()))
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=losses.device)
    if k_eff > 0:
        flat = losses.masked_fill(~candidates, float("-inf")).flatten()
        chosen[flat.topk(k_eff).indices] = True
    return chosen.view_as(candidates), k_eff


def _selection(weights: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor,
               chosen: torch.Tensor | None = None) -> PairSelection:
    chosen = weights > 0 if chosen is None else chosen
    pos, neg = chosen & positive, chosen & negative
    return PairSelection(pos, neg, weights * pos, weights * neg)


class DROTopKMiner(DROPairWeighting):
    """Weight ``1/K`` on the ``K`` pairs with the largest base losses, 0 elsewhere.

    DRO, Sec. 3.2 (DRO-TopK): ``U = {sum p = 1, 0 <= p_ij <= 1/K}``, so ``sum p* l`` is the
    mean of the top-K pair losses. With fewer than ``K`` valid pairs, all of them get
    ``1/#pairs``.
    """

    _repr_keys = ("k",)

    def __init__(self, k: int = 160, base: str = "margin", margin: float = 0.2, threshold: float = 0.5,
                 alpha: float = 2.0, beta: float = 50.0):
        super().__init__(base, margin, threshold, alpha, beta)
        validate_params(type(self).__name__, {"k": k}, {"k": [Interval(int, 1, None)]})
        self.k = k

    def weigh(self, losses, positive, negative) -> PairSelection:
        chosen, k_eff = _top_k_mask(losses, positive | negative, self.k)
        weights = chosen.to(losses.dtype) / max(k_eff, 1)
        return _selection(weights, positive, negative, chosen)


class DROTopKPNMiner(DROPairWeighting):
    """The ``k_pos`` hardest positive and ``k_neg`` hardest negative pairs, averaged together.

    DRO, Sec. 3.2 (DRO-TopK-PN, with ``k_pos = k_neg = K/2`` in the paper): each selected
    pair gets ``1 / (k_pos' + k_neg')`` where the primes clip to the number of available pairs.
    """

    _repr_keys = ("k_pos", "k_neg")

    def __init__(self, k_pos: int = 80, k_neg: int = 80, base: str = "margin", margin: float = 0.2,
                 threshold: float = 0.5, alpha: float = 2.0, beta: float = 50.0):
        super().__init__(base, margin, threshold, alpha, beta)
        validate_params(type(self).__name__, {"k_pos": k_pos, "k_neg": k_neg},
                        {"k_pos": [Interval(int, 1, None)], "k_neg": [Interval(int, 1, None)]})
        self.k_pos = k_pos
        self.k_neg = k_neg

    def weigh(self, losses, positive, negative) -> PairSelection:
        chosen_pos, kp = _top_k_mask(losses, positive, self.k_pos)
        chosen_neg, kn = _top_k_mask(losses, negative, self.k_neg)
        chosen = chosen_pos | chosen_neg
        weights = chosen.to(losses.dtype) / max(kp + kn, 1)
        return _selection(weights, positive, negative, chosen)


class DROKLMiner(SeededMinerMixin, DROPairWeighting):
    """KL-regularised weights ``p* = softmax(l / gamma)`` over all pairs of the mini-batch.

    DRO, Sec. 3.2 (DRO-KL): ``max_p sum p l - gamma KL(p || uniform)`` on the simplex has
    the closed form ``p*_ij ∝ exp(l_ij / gamma)``, computed as a log-space softmax.
    With ``sample=True``, ``num_samples`` pairs (default ``2 B``) are drawn with replacement
    from ``p*`` and each drawn pair is weighted by its count / ``num_samples`` (an unbiased
    estimate of ``sum p* grad l``). ``ignore_zero_losses`` drops pairs with ``l = 0`` before
    normalising, as the paper's experiments do (Sec. 3.2, 4.2.1).
    """

    _repr_keys = ("gamma", "sample", "num_samples", "ignore_zero_losses")

    def __init__(self, gamma: float = 0.1, sample: bool = False, num_samples: int | None = None,
                 ignore_zero_losses: bool = False, base: str = "margin", margin: float = 0.2,
                 threshold: float = 0.5, alpha: float = 2.0, beta: float = 50.0, seed: int = 0,
                 generator: torch.Generator | None = None):
        super().__init__(base, margin, threshold, alpha, beta)
        validate_params(type(self).__name__,
                        {"gamma": gamma, "sample": sample, "num_samples": num_samples,
                         "ignore_zero_losses": ignore_zero_losses},
                        {"gamma": [POSITIVE_FLOAT], "sample": [BOOL], "num_samples": [Interval(int, 1, None), NONE],
                         "ignore_zero_losses": [BOOL]})
        self.gamma = float(gamma)
        self.sample = sample
        self.num_samples = num_samples
        self.ignore_zero_losses = ignore_zero_losses
        self._init_generator(seed, generator)

    def probabilities(self, losses: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """``[B, R]`` optimal ``p*`` (zeros outside the candidate pairs; all zero if there are none)."""
        candidates = positive | negative
        if self.ignore_zero_losses:
            candidates = candidates & (losses > 0)
        if not candidates.any():
            return torch.zeros_like(losses)
        logits = (losses / self.gamma).masked_fill(~candidates, float("-inf"))
        return torch.softmax(logits.flatten(), dim=0).view_as(losses)

    def weigh(self, losses, positive, negative) -> PairSelection:
        probs = self.probabilities(losses, positive, negative)
        if not self.sample or not bool((probs > 0).any()):
            return _selection(probs, positive, negative)
        num_samples = self.num_samples or 2 * losses.shape[0]
        drawn = self.sample_rows(probs.flatten()[None], num_samples)[0]
        counts = torch.bincount(drawn, minlength=probs.numel()).view_as(probs)
        return _selection(counts.to(losses.dtype) / num_samples, positive, negative)


def _grouped_softmax(logits: torch.Tensor, mask: torch.Tensor, pseudo_logit: float | None) -> torch.Tensor:
    """Row-wise softmax of ``logits`` over ``mask``, with an optional extra pseudo entry per row."""
    masked = logits.masked_fill(~mask, float("-inf"))
    if pseudo_logit is not None:
        pseudo = torch.full((masked.shape[0], 1), pseudo_logit, dtype=masked.dtype, device=masked.device)
        masked = torch.cat([masked, pseudo], dim=1)
    lse = torch.logsumexp(masked, dim=1, keepdim=True)
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = (masked - lse).exp()
    return probs[:, : logits.shape[1]] * mask


class DROKLGroupedMiner(DROPairWeighting):
    """Per-anchor KL weights, one simplex for positives and one for negatives (DRO-KL-G).

    DRO, Eq. (7): ``p+_ij ∝ exp(l_ij / gamma_pos)`` over the anchor's positives and
    ``p-_ij ∝ exp(l_ij / gamma_neg)`` over its negatives. With ``pseudo_pairs=True`` (Eq. (23)
    and (25)) each simplex gets one extra pseudo pair: a positive pair of similarity
    ``pos_offset`` (``c+``, default ``lambda + m``) and a negative pair of similarity
    ``neg_offset`` (``c-``, default ``lambda - m``), whose base losses (0 for the margin base
    with the defaults) enter only the normaliser. With the margin base, ``gamma=1`` gives the
    lifted-structure gradient (Eq. (22)); ``c+ = c- = lambda_MS``, ``gamma_pos = 1/alpha``,
    ``gamma_neg = 1/beta`` (and a margin large enough that every hinge is active) gives the
    multi-similarity gradient (Eq. (27)). Weights are divided by the number of anchors ``B``.
    """

    _repr_keys = ("gamma_pos", "gamma_neg", "pseudo_pairs", "pos_offset", "neg_offset", "ignore_zero_losses")

    def __init__(self, gamma_pos: float = 0.1, gamma_neg: float = 0.1, pseudo_pairs: bool = False,
                 pos_offset: float | None = None, neg_offset: float | None = None,
                 ignore_zero_losses: bool = False, base: str = "margin", margin: float = 0.2,
                 threshold: float = 0.5, alpha: float = 2.0, beta: float = 50.0):
        super().__init__(base, margin, threshold, alpha, beta)
        validate_params(type(self).__name__,
                        {"gamma_pos": gamma_pos, "gamma_neg": gamma_neg, "pseudo_pairs": pseudo_pairs,
                         "pos_offset": pos_offset, "neg_offset": neg_offset,
                         "ignore_zero_losses": ignore_zero_losses},
                        {"gamma_pos": [POSITIVE_FLOAT], "gamma_neg": [POSITIVE_FLOAT], "pseudo_pairs": [BOOL],
                         "pos_offset": [Interval(float), NONE], "neg_offset": [Interval(float), NONE],
                         "ignore_zero_losses": [BOOL]})
        self.gamma_pos = float(gamma_pos)
        self.gamma_neg = float(gamma_neg)
        self.pseudo_pairs = pseudo_pairs
        self.pos_offset = float(threshold + margin if pos_offset is None else pos_offset)
        self.neg_offset = float(threshold - margin if neg_offset is None else neg_offset)
        self.ignore_zero_losses = ignore_zero_losses

    def pseudo_losses(self) -> tuple[float, float]:
        """Base losses of the pseudo positive (similarity ``c+``) and pseudo negative (``c-``) pairs."""
        return (self.pair_loss.of_similarity(self.pos_offset, True),
                self.pair_loss.of_similarity(self.neg_offset, False))

    def weigh(self, losses, positive, negative) -> PairSelection:
        if self.ignore_zero_losses:
            positive, negative = positive & (losses > 0), negative & (losses > 0)
        pseudo_pos = pseudo_neg = None
        if self.pseudo_pairs:
            l_pos, l_neg = self.pseudo_losses()
            pseudo_pos, pseudo_neg = l_pos / self.gamma_pos, l_neg / self.gamma_neg
        p_pos = _grouped_softmax(losses / self.gamma_pos, positive, pseudo_pos)
        p_neg = _grouped_softmax(losses / self.gamma_neg, negative, pseudo_neg)
        scale = 1.0 / max(losses.shape[0], 1)
        return PairSelection(positive, negative, p_pos * scale, p_neg * scale)


DRO_WEIGHTINGS: dict[str, type[DROPairWeighting]] = {
    "top_k": DROTopKMiner,
    "top_k_pn": DROTopKPNMiner,
    "kl": DROKLMiner,
    "kl_grouped": DROKLGroupedMiner,
}

__all__ = [
    "BASE_LOSSES",
    "DRO_WEIGHTINGS",
    "DROKLGroupedMiner",
    "DROKLMiner",
    "DROPairLoss",
    "DROPairWeighting",
    "DROTopKMiner",
    "DROTopKPNMiner",
]
