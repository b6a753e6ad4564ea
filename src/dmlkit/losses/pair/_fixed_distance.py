"""The one check of losses whose equation fixes the measure (PML's ``assert_distance_type``)."""

from __future__ import annotations

from dmlkit.distances import BaseDistance
from dmlkit.exceptions import InvalidParameterError


def require_distance(owner: str, distance: BaseDistance, kind: type, **settings: object) -> None:
    """Refuse a ``distance=`` that is not ``kind`` with ``settings`` (the measure the loss's equation uses)."""
    if isinstance(distance, kind) and all(getattr(distance, k, None) == v for k, v in settings.items()):
        return
    wanted = kind.__name__ + (f"({', '.join(f'{k}={v!r}' for k, v in settings.items())})" if settings else "")
    raise InvalidParameterError(
        f"The 'distance' parameter of {owner} must be {wanted} (the measure of its equation) or None. "
        f"Got {distance!r} instead."
    )
