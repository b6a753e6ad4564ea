"""dmlkit's distance for a distance argument: dmlkit's own as is, PML's converted or wrapped."""

from __future__ import annotations

from dmlkit.distances.pairwise import (
    BaseDistance,
    CallableDistance,
    CosineSimilarity,
    DotProductSimilarity,
    LpDistance,
)
from dmlkit.distances.snr import SNRDistance
from dmlkit.exceptions import InvalidParameterError


def as_distance(distance: object, owner: str = "distance") -> BaseDistance:
    """A dmlkit distance for ``distance``: dmlkit's own as is, PML's standard ones converted.

    pytorch-metric-learning's ``CosineSimilarity``, ``DotProductSimilarity``, ``LpDistance``
    and ``SNRDistance`` become dmlkit's classes with the same settings (so the losses keep their
    fast paths); any other callable with an ``is_inverted`` attribute is wrapped in
    :class:`CallableDistance`.
    """
    if isinstance(distance, BaseDistance):
        return distance
    kind = type(distance).__name__
    module = type(distance).__module__
    if module.startswith("pytorch_metric_learning") and kind in _PML_DISTANCES:
        settings = {
            "p": getattr(distance, "p", 2),
            "power": getattr(distance, "power", 1),
            "normalize_embeddings": bool(getattr(distance, "normalize_embeddings", True)),
        }
        if kind == "DotProductSimilarity" and settings["normalize_embeddings"] and settings["p"] == 2:
            kind = "CosineSimilarity"  # the same values, on the cosine's fast path
        if kind == "CosineSimilarity":
            settings.pop("normalize_embeddings")
        return _PML_DISTANCES[kind](**settings)
    if callable(distance) and hasattr(distance, "is_inverted"):
        return CallableDistance(distance)
    raise InvalidParameterError(
        f"The 'distance' parameter of {owner} must be a dmlkit or pytorch-metric-learning distance "
        f"(called as distance(x, y) -> [B, R], with an is_inverted flag). Got {distance!r} instead."
    )


#: PML distance class name -> dmlkit class (built with the PML object's settings).
_PML_DISTANCES = {
    "CosineSimilarity": CosineSimilarity,
    "DotProductSimilarity": DotProductSimilarity,
    "LpDistance": LpDistance,
    "SNRDistance": SNRDistance,
}
