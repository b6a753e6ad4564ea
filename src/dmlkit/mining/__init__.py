"""Pair/triplet mining and DRO pair weighting.

Every miner is registered in :data:`MINERS` under a snake_case name and is called as
``miner(embeddings [B, D], labels [B], ref_emb=None, ref_labels=None)``, returning a
:class:`PairSelection` or :class:`TripletSelection` (``miner.as_pml()`` returns PML's index tuples).
"""

from dmlkit.mining.angular import AngularMiner
from dmlkit.mining.base import MINERS, BaseMiner, PMLStyleMiner, SeededMinerMixin
from dmlkit.mining.batch_easy_hard import BatchEasyHardMiner
from dmlkit.mining.batch_hard import BatchHardMiner
from dmlkit.mining.distance_weighted import DistanceWeightedMiner, distance_weighted_log_weights
from dmlkit.mining.dro import (
    DRO_WEIGHTINGS,
    DROKLGroupedMiner,
    DROKLMiner,
    DROPairLoss,
    DROPairWeighting,
    DROTopKMiner,
    DROTopKPNMiner,
)
from dmlkit.mining.easy_positive import EasyPositiveMiner
from dmlkit.mining.hdc import HDCMiner
from dmlkit.mining.multi_similarity import MultiSimilarityMiner
from dmlkit.mining.packaged_triplets import EmbeddingsAlreadyPackagedAsTriplets
from dmlkit.mining.pair_margin import PairMarginMiner
from dmlkit.mining.selection import PairSelection, TripletSelection, label_masks, selection_from_indices_tuple
from dmlkit.mining.triplet_margin import TripletMarginMiner
from dmlkit.mining.uniform_histogram import UniformHistogramMiner

_REGISTERED = {
    "triplet_margin": TripletMarginMiner,
    "batch_hard": BatchHardMiner,
    "distance_weighted": DistanceWeightedMiner,
    "multi_similarity": MultiSimilarityMiner,
    "pair_margin": PairMarginMiner,
    "easy_positive": EasyPositiveMiner,
    "dro_top_k": DROTopKMiner,
    "dro_top_k_pn": DROTopKPNMiner,
    "dro_kl": DROKLMiner,
    "dro_kl_grouped": DROKLGroupedMiner,
    "angular": AngularMiner,
    "batch_easy_hard": BatchEasyHardMiner,
    "hdc": HDCMiner,
    "uniform_histogram": UniformHistogramMiner,
    "embeddings_already_packaged_as_triplets": EmbeddingsAlreadyPackagedAsTriplets,
}
for _name, _cls in _REGISTERED.items():
    MINERS.register(_name)(_cls)


def create_miner(name: str, **kwargs) -> BaseMiner:
    """Build the miner registered as ``name`` (e.g. ``create_miner("triplet_margin", margin=0.1)``)."""
    return MINERS.create(name, **kwargs)


def list_miners(pattern: str = "*") -> list[str]:
    """Registered miner names matching a shell-style ``pattern``."""
    return MINERS.names(pattern)


__all__ = [
    "MINERS",
    "AngularMiner",
    "BatchEasyHardMiner",
    "EmbeddingsAlreadyPackagedAsTriplets",
    "HDCMiner",
    "UniformHistogramMiner",
    "BaseMiner",
    "BatchHardMiner",
    "DRO_WEIGHTINGS",
    "DROKLGroupedMiner",
    "DROKLMiner",
    "DROPairLoss",
    "DROPairWeighting",
    "DROTopKMiner",
    "DROTopKPNMiner",
    "DistanceWeightedMiner",
    "EasyPositiveMiner",
    "MultiSimilarityMiner",
    "PairMarginMiner",
    "PMLStyleMiner",
    "PairSelection",
    "SeededMinerMixin",
    "TripletMarginMiner",
    "TripletSelection",
    "create_miner",
    "distance_weighted_log_weights",
    "label_masks",
    "list_miners",
    "selection_from_indices_tuple",
]
