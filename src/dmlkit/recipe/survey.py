"""The recipe's first look at the data: the splits as read before any model exists (image files not decoded).

It decides nothing; the recipe reads it (which model, which image size) and the engine's
:func:`~dmlkit.engine.splits.build_splits` reuses it where it already holds every split in memory.
"""

from __future__ import annotations

from dmlkit.config.schema import RunConfig
from dmlkit.engine.splits import read_splits


def survey_data(cfg: RunConfig):
    """The splits as read before any model exists (image files not decoded), for the recipe's first look."""
    return read_splits(cfg, decode=False)


__all__ = ["survey_data"]
