"""Contrastive loss: positives pulled within ``pos_margin``, negatives pushed past ``neg_margin``.

Hadsell et al. (2006); with a positive margin, the generalized contrastive loss of Wu et al.
(2017) / ASAP Sec. 3 (``(iota_{y,y'} (d - beta) + alpha)_+``). ASAP's two variants are both
settings of this class:

* **C1** as ASAP ran it (App. A.2: "XBM's official implementation ... 0.5 margin"):
  :class:`CosineContrastiveLoss` (``1 - s`` per positive, ``s`` per negative with ``s > 0.5``);
  the Euclidean form of Hadsell is ``ContrastiveLoss(pos_margin=0, neg_margin=m)``;
* **C2** (Wu et al.): ``ContrastiveLoss(pos_margin=m_pos, neg_margin=m_neg)``.

Paper vs PML: Hadsell squares both hinges and sums over pairs; PML uses the plain hinges,
averaged over the non-zero positive terms plus the average over the non-zero negative terms.
dmlkit's ``ContrastiveLoss`` follows PML by default (``reduction="mean_nonzero"``); ``"mean"``
averages positives and negatives separately over all selected pairs and ``"sum"`` sums (the
form ASAP Eq. (4.11) averages over ``m |rho|`` pairs, see ``ProxyPairLoss(reduction="mean")``;
ASAP used its own TensorFlow framework, Sec. 5). Distance default as in PML: Euclidean between
L2-normalised embeddings.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity, LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import Pairwise


@LOSSES.register("contrastive")
class ContrastiveLoss(PairLoss):
    """``[d_ap - pos_margin]_+`` per positive pair plus ``[neg_margin - d_an]_+`` per negative pair.

    Hadsell et al. (2006) Eq. (4) without the squares (PML's form); Wu et al. (2017) Eq. (4)
    when ``pos_margin > 0``. For a similarity (``distance=CosineSimilarity()``) the roles
    flip: ``[pos_margin - s_ap]_+`` and ``[s_an - neg_margin]_+``.
    """

    supports_weights = True
    reduces_terms = True
    sub_loss_names = ("pos_loss", "neg_loss")
    _repr_keys = ("pos_margin", "neg_margin", "reduction")

    _parameter_constraints = {"pos_margin": [Interval(float)], "neg_margin": [Interval(float)]}

    def __init__(
        self,
        pos_margin: float = 0.0,
        neg_margin: float = 1.0,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean_nonzero",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction,
            reducer=reducer,
            embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight,
        )
        self.pos_margin = float(pos_margin)
        self.neg_margin = float(neg_margin)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.float_masks()
        if not (masks.weighted or self.reduces_from_counts()):
            return self._reduce_terms(batch)
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        mat = pairs.mat
        # Hinges in the measure's own orientation: [d - pos_margin]_+ and [neg_margin - d]_+
        # for a distance, [pos_margin - s]_+ and [s - neg_margin]_+ for a similarity.
        sign = -1.0 if self.distance.is_inverted else 1.0
        if sign > 0 and self.pos_margin <= 0 and self.distance.is_nonnegative:
            # d >= 0, so d - pos_margin needs no hinge.
            pos_terms = mat * masks.positive if self.pos_margin == 0 else (mat - self.pos_margin).mul_(masks.positive)
        else:
            pos_terms = mat - self.pos_margin
            pos_terms = (pos_terms.neg_() if sign < 0 else pos_terms).clamp_min_(0.0).mul_(masks.positive)
        neg_terms = torch.rsub(mat, self.neg_margin)
        neg_terms = (neg_terms.neg_() if sign < 0 else neg_terms).clamp_min_(0.0).mul_(masks.negative)
        if masks.weighted:
            value = (pos_terms * masks.positive_weight).sum() + (neg_terms * masks.negative_weight).sum()
            # d(loss)/d(mat) = sign * (w_p [active positive] - w_n [active negative]).
            coefficient = pos_terms.sign_().mul_(masks.positive_weight)
            coefficient.sub_(neg_terms.sign_().mul_(masks.negative_weight))
            return pairs.attach(value, coefficient.mul_(sign) if sign < 0 else coefficient)
        pos_sum, neg_sum = pos_terms.sum(), neg_terms.sum()
        pos_active, neg_active = pos_terms.sign_(), neg_terms.sign_()
        pos_count = self.reducer.for_sub_loss("pos_loss").divisor(masks.positive.sum(), pos_active.sum()).clamp_min(1.0)
        neg_count = self.reducer.for_sub_loss("neg_loss").divisor(masks.negative.sum(), neg_active.sum()).clamp_min(1.0)
        value = pos_sum / pos_count + neg_sum / neg_count
        # d(loss)/d(mat) = sign * ([active positive] / n_pos - [active negative] / n_neg)
        #                = (sign / n_pos) * ([active positive] - (n_pos / n_neg) [active negative]).
        coefficient = pos_active.addcmul_(neg_active, -pos_count / neg_count)
        return pairs.attach(value, coefficient, sign / pos_count)

    def _reduce_terms(self, batch: PairBatch) -> torch.Tensor:
        """The hinges on the autograd graph, handed to each sub-loss's reducer (any reducer object)."""
        masks = batch.pair_masks()
        mat = self.distance.matrix(batch.embeddings, batch.references)
        pos_terms = self.distance.margin(mat, self.pos_margin).clamp_min(0.0)
        neg_terms = self.distance.margin(self.neg_margin, mat).clamp_min(0.0)
        return self.reduce("pos_loss", pos_terms, masks.positive, batch, "pos_pair") + self.reduce(
            "neg_loss", neg_terms, masks.negative, batch, "neg_pair"
        )


@LOSSES.register("cosine_contrastive")
class CosineContrastiveLoss(PairLoss):
    """XBM's contrastive loss on similarities: ``1 - s`` per positive, ``s`` per negative with ``s > margin``.

    Wang et al., "Cross-Batch Memory for Embedding Learning" (CVPR 2020), official code; ASAP
    App. A.2's C1 ("XBM's official implementation", margin 0.5). For anchor ``a`` the term is
    ``t_a = sum_{p: s_ap < 1 - epsilon} (1 - s_ap) + sum_{n: s_an > margin} s_an`` (the
    ``epsilon`` cut drops a sample's pairs with itself when it is also among the references, as
    XBM's memory holds the current batch). ``reduction="mean"`` (XBM) averages ``t_a`` over all
    anchors; ``"sum"`` adds every pair term (``ProxyPairLoss(reduction="mean")`` then divides by
    ``m |rho|``, ASAP Eq. (4.11)); ``"mean_nonzero"`` averages over anchors with ``t_a > 0``.
    Unlike a hinge, a negative's term jumps from 0 to ``margin`` as ``s`` crosses it (its
    gradient is that of ``[s - margin]_+``). ``distance``: a similarity, cosine by default; XBM
    and ASAP take the dot product of the model's output (``distance: dot`` on bounded-normalised
    embeddings, ASAP Sec. 4.4).
    """

    reductions = ("mean", "sum", "mean_nonzero")
    _repr_keys = ("margin", "epsilon", "reduction")

    _parameter_constraints = {"margin": [Interval(float)], "epsilon": [Interval(float, 0, None)]}

    def __init__(
        self,
        margin: float = 0.5,
        epsilon: float = 1e-5,
        *,
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean",
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
    ):
        super().__init__(
            distance=distance, miner=miner, reduction=reduction, reducer=reducer,
            embedding_regularizer=embedding_regularizer, embedding_reg_weight=embedding_reg_weight,
        )
        if not self.distance.is_inverted:
            raise InvalidParameterError(
                f"The 'distance' parameter of CosineContrastiveLoss must be a similarity (cosine or dot). "
                f"Got {self.distance!r} instead."
            )
        self.margin = float(margin)
        self.epsilon = float(epsilon)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        masks = batch.float_masks()
        if not (masks.weighted or self.reduces_from_counts()):
            return self._reduce_terms(batch)
        pairs = Pairwise(self.distance, batch.embeddings, batch.references, batch.same_set)
        sim = pairs.mat
        pos_active = masks.positive * (sim < 1.0 - self.epsilon)
        neg_active = masks.negative * (sim > self.margin)
        per_anchor = (pos_active * (1.0 - sim)).sum(dim=1) + (neg_active * sim).sum(dim=1)  # t_a [B]
        divisor = self.reducer.divisor(per_anchor.new_tensor(per_anchor.numel()), (per_anchor > 0).sum())
        divisor = divisor.to(sim.dtype).clamp_min(1.0)
        # d(loss)/d(s) = (-[active positive] + [active negative]) / divisor
        return pairs.attach(per_anchor.sum() / divisor, neg_active - pos_active, 1.0 / divisor)
