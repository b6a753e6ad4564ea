"""Distances, similarities and embedding normalisations."""

from dmlkit._registry import Registry
from dmlkit.distances._closed_form import MatrixContext
from dmlkit.distances.normalization import (
    NORMALIZATIONS,
    bounded_normalize,
    l2_normalize,
    normalize,
)
from dmlkit.distances.pairwise import (
    BaseDistance,
    CallableDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
    as_distance,
    create_distance,
    squared_euclidean,
)

DISTANCES: Registry[BaseDistance] = Registry("distance")
DISTANCES.register("cosine")(CosineSimilarity)
DISTANCES.register("dot")(DotProductSimilarity)
DISTANCES.register("euclidean")(lambda **kw: LpDistance(power=1, **kw))
DISTANCES.register("squared_euclidean")(lambda **kw: LpDistance(power=2, **kw))

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
