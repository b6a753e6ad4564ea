"""Angular loss (Wang et al., "Deep Metric Learning with Angular Loss", ICCV 2017).

Eq. (8) (the N-pair form, ``f_{a,p,n} = 4 tan^2(alpha) (x_a + x_p)^T x_n - 2 (1 + tan^2(alpha)) x_a^T x_p``)
per positive pair ``(a, p)``: ``log(1 + sum_n exp(f_{a,p,n}))`` over every negative ``n`` of the
anchor. As in PML: ``alpha`` in degrees, the negatives are all the anchor's
differently-labelled references even when pairs are mined (mined pairs choose the ``(a, p)``),
mean over positive pairs. Paper vs PML: the paper L2-normalises every feature; PML normalises
the anchor and the positive but takes the negatives ``x_n`` as given (the same when the model
already outputs unit vectors). dmlkit follows PML by default; ``normalize_negatives=True`` is
the paper's form. The paper adds an N-pair term (Eq. (9)); that is
``NPairsLoss`` combined through ``MultipleLosses``.
"""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import BOOL, Interval
from dmlkit.distances import BaseDistance, LpDistance, l2_normalize
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.logsumexp import softmax_with_one
from dmlkit.losses.pair._fixed_distance import require_distance
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import attach_gradient


@LOSSES.register("angular")
class AngularLoss(PairLoss):
    """``log(1 + sum_n exp(4 tan^2(alpha) (x_a + x_p)^T x_n - 2 (1 + tan^2(alpha)) x_a^T x_p))`` per positive pair.

    Wang et al. (2017) Eq. (8); mean over positive pairs (PML's ``MeanReducer``).
    """

    reductions = ("mean", "mean_nonzero", "sum")
    _repr_keys = ("alpha", "normalize_negatives", "reduction")
    _parameter_constraints = {"alpha": [Interval(float, 0, 90, closed="neither")], "normalize_negatives": [BOOL]}

    def __init__(
        self,
        alpha: float = 40,
        normalize_negatives: bool = False,
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
        require_distance("AngularLoss", self.distance, LpDistance, p=2, power=1, normalize_embeddings=True)
        self.alpha = float(alpha)
        self.normalize_negatives = normalize_negatives

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        if batch.labels is None and batch.pos_mask is None:
            raise InvalidParameterError("AngularLoss needs labels (or pos_mask): its negatives are every other class.")
        positive = batch.pair_masks().positive
        negative = batch.label_pair_masks()[1]
        anchors, positives = positive.nonzero(as_tuple=True)
        if anchors.numel() == 0 or not negative[anchors].any():
            return zero_loss(batch.embeddings, batch.references)
        x = l2_normalize(batch.embeddings)
        refs = x if batch.same_set else l2_normalize(batch.references)
        negatives = refs if self.normalize_negatives else batch.references  # [R, D], PML: as given
        x_neg = x @ negatives.T  # [B, R]
        refs_neg = x_neg if batch.same_set and self.normalize_negatives else refs @ negatives.T  # [R, R]
        a_dot_p = (x[anchors] * refs[positives]).sum(1)  # [P]
        sq_tan = math.tan(math.radians(self.alpha)) ** 2
        outer, inner = 4.0 * sq_tan, 2.0 * (1.0 + sq_tan)
        # The [P, R] exponent and its log-sum-exp without autograd; d(loss)/d(f) = softmax-with-one / divisor
        # reaches x_neg, refs_neg and a_dot_p through index-adds (one autograd node, no [P, R] graph).
        with torch.no_grad():
            f = x_neg[anchors].add_(refs_neg[positives]).mul_(outer).sub_(inner * a_dot_p.unsqueeze(1))
            terms, weight = softmax_with_one(f.masked_fill_(~negative[anchors], float("-inf")))
            divisor = self.reducer.divisor(anchors.new_tensor(anchors.numel()), (terms > 0).sum())
            divisor = divisor.to(terms.dtype).clamp_min(1.0)
            weight.div_(divisor)
            grad_x_neg = torch.zeros_like(x_neg).index_add_(0, anchors, weight).mul_(outer)
            grad_refs_neg = torch.zeros_like(refs_neg).index_add_(0, positives, weight).mul_(outer)
            grad_a_dot_p = weight.sum(1).mul_(-inner)
        return attach_gradient(
            terms.sum() / divisor, (x_neg, grad_x_neg), (refs_neg, grad_refs_neg), (a_dot_p, grad_a_dot_p)
        )
