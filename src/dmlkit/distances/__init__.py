"""Distances, similarities and embedding normalisations."""

from dmlkit.distances._closed_form import MatrixContext
from dmlkit.distances.batched import BatchedDistance
from dmlkit.distances.convert import as_distance
from dmlkit.distances.normalization import (
    NORMALIZATIONS,
    bounded_normalize,
    l2_normalize,
    normalize,
)
from dmlkit.distances.pairwise import (
    DISTANCES,
    BaseDistance,
    CallableDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    create_distance,
    squared_euclidean,
)
from dmlkit.distances.snr import SNRDistance

__all__ = [
    "BaseDistance",
    "BatchedDistance",
    "SNRDistance",
    "CallableDistance",
    "CosineSimilarity",
    "DotProductSimilarity",
    "LpDistance",
    "MatrixContext",
    "DISTANCES",
    "NORMALIZATIONS",
    "as_distance",
    "bounded_normalize",
    "create_distance",
    "l2_normalize",
    "normalize",
    "squared_euclidean",
]
