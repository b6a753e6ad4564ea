"""Ranking losses: smoothed or histogram-binned average precision and rank-based objectives.

FastAP, Smooth-AP, PNP and the histogram loss score each anchor's ranking of the whole batch,
so they are defined within the batch only (no ``ref_emb``, as in PML). They are called as PML's
are, ``loss(embeddings [B, D], labels [B], indices_tuple=None)``, with PML's class names,
arguments and defaults, and are registered in ``LOSSES``; every public module here is imported
and every class it registers is exported. Where PML and the paper differ each module's
docstring says how, and the paper's form is a named option.
"""

from dmlkit.core.registry import import_submodules
from dmlkit.losses.base import LOSSES
from dmlkit.losses.ranking._base import RankingLoss

import_submodules(__name__, __path__)  # every loss module registers its classes in LOSSES
_losses = LOSSES.classes_in(__name__)
globals().update(_losses)

__all__ = ["RankingLoss", *_losses]
