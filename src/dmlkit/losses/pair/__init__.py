"""Pair-based losses (contrastive, triplet, margin, multi-similarity, lifted, N-pairs, binomial).

Each loss is a :class:`~dmlkit.losses.base.MetricLoss` called as ``loss(embeddings [B, D],
labels [B], *, pairs=None, weights=None, ref_emb=None, ref_labels=None, pos_mask=None)``,
with PML's class names, argument names and defaults, and is registered in ``LOSSES``.
"""

from dmlkit.losses.pair._common import PairBatch, PairLoss, PairMasks
from dmlkit.losses.pair.binomial_deviance import BinomialDevianceLoss
from dmlkit.losses.pair.contrastive import ContrastiveLoss
from dmlkit.losses.pair.lifted_structure import GeneralizedLiftedStructureLoss, LiftedStructureLoss
from dmlkit.losses.pair.margin import MarginLoss
from dmlkit.losses.pair.multi_similarity import MultiSimilarityLoss
from dmlkit.losses.pair.npairs import NPairsLoss
from dmlkit.losses.pair.triplet_margin import TripletMarginLoss

__all__ = [
    "BinomialDevianceLoss",
    "ContrastiveLoss",
    "GeneralizedLiftedStructureLoss",
    "LiftedStructureLoss",
    "MarginLoss",
    "MultiSimilarityLoss",
    "NPairsLoss",
    "PairBatch",
    "PairLoss",
    "PairMasks",
    "TripletMarginLoss",
]
