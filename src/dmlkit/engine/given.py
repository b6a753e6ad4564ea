"""The objects a user gives a run in place of what its config would build: one record, read by the plan and the build.

``dmlkit.fit``, :class:`dmlkit.recipe.Trainer` and :func:`dmlkit.recipe.prepare_run` take them as keyword arguments
(``model=``, ``loss=``, ``miner=``, ``data=``, ``optimizer=``) and hand them on as one :class:`GivenObjects`:
the recipe reads them (a given model is measured, never changed) and leaves to them what they decide;
:func:`~dmlkit.engine.resolve.resolve_run` uses them instead of building the config's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class GivenObjects:
    """What replaces the config's objects (None: built from the config).

    ``model``: an ``nn.Module`` from images ``[B, C, H, W]`` to embeddings ``[B, D]``; ``loss`` and ``miner``:
    dmlkit's or pytorch-metric-learning's; ``data``: the user's splits (:func:`dmlkit.data.user.user_splits`);
    ``optimizer``: an optimiser over the model's (and the loss's) parameters.
    """

    model: nn.Module | None = None
    loss: nn.Module | None = None
    miner: nn.Module | None = None
    data: Any = None
    optimizer: torch.optim.Optimizer | None = None

    def names(self) -> list[str]:
        """The names of the objects given, in the order of the fields."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    @property
    def read_by_the_plan(self) -> bool:
        """Whether the plan reads any of them (the optimiser is only used when the run is built)."""
        return any(obj is not None for obj in (self.model, self.loss, self.miner, self.data))


#: No object given: the config builds every part.
NOTHING_GIVEN = GivenObjects()


__all__ = ["NOTHING_GIVEN", "GivenObjects"]
