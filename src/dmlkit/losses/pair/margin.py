"""Margin loss of Wu et al. (2017) with a (learnable, optionally per-class) boundary ``beta``.

Per pair: ``[margin + d_ap - beta]_+`` (positive) and ``[margin + beta - d_an]_+``
(negative); ``beta`` is the boundary between positives and negatives (the DRO paper's
lambda, ASAP's beta). Paper vs PML:

* Wu et al. use each sampled pair once (``form="pair"``); PML forms all triplets and counts
  a positive pair once per negative of its anchor and a negative pair once per positive
  (``form="triplet"``, dmlkit's default, so values match PML).
* The sum is divided by the number of non-zero terms (Wu et al. and PML agree:
  ``reduction="mean_nonzero"``); ``"mean"`` divides by all terms, ``"sum"`` does not divide.
* With ``learn_beta``, ``nu * beta`` is added (PML); per-class betas are averaged over the
  same units as the margin terms. Wu et al. regularise ``nu * (beta_0 + beta_class)``.

A PairSelection is read in the configured ``form`` (triplets = its positive x negative pairs
per anchor). With DRO weights the loss is always per pair: ``sum(weight * term)``
(+ ``nu * sum(weight * beta)``), not normalised further.
"""

from __future__ import annotations

import torch

from dmlkit.core.validation import BOOL, NONE, Interval, Options
from dmlkit.distances import BaseDistance, LpDistance
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair._triplets import GeneratorStateMixin, sample_triplets
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch
from dmlkit.losses.pair.terms import dissimilarity, oriented
from dmlkit.mining.selection import PairSelection, TripletSelection


@LOSSES.register("margin")
class MarginLoss(GeneratorStateMixin, PairLoss):
    """``[margin + d_ap - beta]_+ + [margin + beta - d_an]_+`` over triplets or pairs.

    Wu et al. (2017) Eq. (4)-(5). ``beta`` is a buffer, or a parameter when ``learn_beta``;
    with ``num_classes`` it holds one boundary per class, indexed by the anchor's label.
    """

    supports_weights = True
    _repr_keys = ("margin", "nu", "triplets_per_anchor", "learn_beta", "num_classes", "form", "reduction")

    _parameter_constraints = {
        "margin": [Interval(float)],
        "nu": [Interval(float, 0, None)],
        "beta": [Interval(float)],
        "triplets_per_anchor": [Options(("all",)), Interval(int, 1, None)],
        "learn_beta": [BOOL],
        "num_classes": [NONE, Interval(int, 1, None)],
        "form": [Options(("triplet", "pair"))],
        "seed": [Interval(int, 0, None)],
    }

    def __init__(
        self,
        margin: float = 0.2,
        nu: float = 0.0,
        beta: float = 1.2,
        triplets_per_anchor: str | int = "all",
        learn_beta: bool = False,
        num_classes: int | None = None,
        *,
        form: str = "triplet",
        distance: BaseDistance | None = None,
        miner: object | None = None,
        reduction: str = "mean_nonzero",
        seed: int = 0,
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
        self.margin = float(margin)
        self.nu = float(nu)
        self.triplets_per_anchor = triplets_per_anchor
        self.learn_beta = learn_beta
        self.num_classes = num_classes
        self.form = form
        initial = torch.full((num_classes or 1,), float(beta))
        if learn_beta:
            self.beta = torch.nn.Parameter(initial)
        else:
            self.register_buffer("beta", initial)
        self.generator = torch.Generator().manual_seed(seed)

    def default_distance(self) -> BaseDistance:
        return LpDistance(power=1, normalize_embeddings=True)

    def own_state(self) -> torch.Tensor:
        """``beta``: it follows the embeddings' device (PML copies it there per call) and keeps its dtype
        (cast per call, as PML's ``to_device(beta, dtype=embeddings.dtype)``)."""
        return self.beta

    def _anchor_beta(self, batch: PairBatch) -> torch.Tensor:
        """``[B]`` boundary of each anchor: its class's beta, or the shared one."""
        beta = self.beta.to(batch.embeddings.dtype)
        if self.num_classes is None:
            return beta.expand(batch.num_anchors)
        if batch.labels is None or batch.labels.dim() != 1:
            raise InvalidParameterError(
                "MarginLoss with num_classes needs class-id labels [B] to pick each anchor's beta."
            )
        return beta[batch.labels]

    def compute_pair_loss(self, batch: PairBatch) -> torch.Tensor:
        dis = dissimilarity(self.distance.matrix(batch.embeddings, batch.references), self.distance)
        beta = self._anchor_beta(batch)
        boundary = oriented(beta, self.distance).unsqueeze(1)
        sel = batch.selection
        weighted = batch.weights is not None or (
            isinstance(sel, PairSelection) and (sel.positive_weight is not None or sel.negative_weight is not None)
        )
        random_triplets = self.form == "triplet" and self.triplets_per_anchor != "all" and not weighted
        if isinstance(sel, TripletSelection) or random_triplets:
            if isinstance(sel, TripletSelection):
                a, p, n = sel.anchor, sel.positive, sel.negative
            else:
                masks = batch.pair_masks()
                a, p, n = sample_triplets(masks.positive, masks.negative, self.triplets_per_anchor, self.generator)
            b = boundary[a, 0]
            pos_terms = (self.margin + dis[a, p] - b).clamp_min(0.0)
            neg_terms = (self.margin + b - dis[a, n]).clamp_min(0.0)
            total = pos_terms.sum() + neg_terms.sum()
            nonzero = ((pos_terms > 0).sum() + (neg_terms > 0).sum()).to(dis.dtype)
            count = dis.new_tensor(2.0 * a.numel())
            unit_beta, num_units = beta[a].sum(), count
            return self._reduce(total, nonzero, count, unit_beta, num_units)
        masks = batch.pair_masks()
        pos, neg = masks.positive, masks.negative
        pos_terms = (self.margin + dis - boundary).clamp_min(0.0)
        neg_terms = (self.margin + boundary - dis).clamp_min(0.0)
        zero = dis.new_zeros(())
        if masks.weighted:
            pw = torch.where(pos, masks.positive_weight, zero)
            nw = torch.where(neg, masks.negative_weight, zero)
            loss = (pw * pos_terms).sum() + (nw * neg_terms).sum()
            if self.learn_beta and self.nu != 0:
                loss = loss + self.nu * ((pw + nw).sum(1) * beta).sum()
            return loss
        num_pos = pos.sum(1, keepdim=True).to(dis.dtype)
        num_neg = neg.sum(1, keepdim=True).to(dis.dtype)
        if self.form == "triplet":
            # Each (a, p) lies in |N(a)| triplets and each (a, n) in |P(a)| triplets.
            pos_mult = torch.where(pos, num_neg, zero)
            neg_mult = torch.where(neg, num_pos, zero)
            units = (num_pos * num_neg).squeeze(1)
        else:
            pos_mult, neg_mult = pos.to(dis.dtype), neg.to(dis.dtype)
            units = (num_pos + num_neg).squeeze(1)
        total = (pos_mult * pos_terms).sum() + (neg_mult * neg_terms).sum()
        nonzero = (pos_mult * (pos_terms > 0)).sum() + (neg_mult * (neg_terms > 0)).sum()
        count = pos_mult.sum() + neg_mult.sum()
        return self._reduce(total, nonzero, count, (units * beta).sum(), units.sum())

    def _reduce(self, total, nonzero, count, unit_beta, num_units) -> torch.Tensor:
        """Divide by the reduction's divisor (nothing selected gives 0) and add the beta penalty.

        ``unit_beta`` sums each unit's (triplet's or pair's) beta, as PML's per-class penalty.
        """
        divisor = self.reducer.divisor(count, nonzero)
        safe = divisor.clamp_min(1)
        loss = total / safe
        if self.learn_beta and self.nu != 0:
            if self.num_classes is None:
                penalty = self.nu * self.beta.sum()
                loss = loss + torch.where(num_units > 0, penalty, penalty * 0)
            else:
                penalty = self.nu * unit_beta / safe
                loss = loss + torch.where(divisor > 0, penalty, penalty * 0)
        return loss
