"""Distances, similarities and embedding normalisations."""

from dmlkit.distances._closed_form import MatrixContext
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
    as_distance,
    create_distance,
    squared_euclidean,
)

__all__ = [
    "BaseDistance",
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
