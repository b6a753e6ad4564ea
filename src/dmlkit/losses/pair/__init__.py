"""Pair-based losses (contrastive, triplet, margin, multi-similarity, lifted, N-pairs, binomial).

Each loss is a :class:`~dmlkit.losses.base.MetricLoss` called as PML's are, ``loss(embeddings
[B, D], labels [B], indices_tuple=None, ref_emb=None, ref_labels=None)``, plus dmlkit's keyword
pair sources (``pairs=``, ``weights=``, ``pos_mask=``), with PML's class names, argument names
and defaults (``distance=``, ``reducer=``, ``embedding_regularizer=`` included), and is
registered in ``LOSSES``. Every public module here is imported and every class it registers is
exported: a new loss needs only its module.

Where the papers and PML differ, dmlkit follows PML by default (drop-in values) and offers
the paper's choice as an option; each module's docstring lists its differences:

* reduction — ``reduction="mean_nonzero"`` (PML's AvgNonZeroReducer) for contrastive and
  triplet; ``"mean"`` is the papers' average; ``MarginLoss(form="pair")`` is Wu et al.'s
  per-pair reading of PML's all-triplet sum;
* distance — PML's defaults (Euclidean between L2-normalised embeddings; cosine for MS,
  binomial and N-pairs); Hadsell squares the contrastive hinges, Sohn uses raw dot products;
* references — with ``ref_emb`` (memory, proxies), triplet swap uses the true
  positive-to-negative distance and lifted structure uses the anchor's negatives only,
  where PML indexes anchor rows with reference indices;
* empty sets — terms over an empty set of pairs are 0, never NaN; the generalized lifted
  loss keeps the non-empty half of an anchor without positives (or negatives), as PML does.
"""

from dmlkit.core.registry import import_submodules
from dmlkit.losses.base import LOSSES
from dmlkit.losses.pair.base import PairLoss
from dmlkit.losses.pair.batch import PairBatch, PairMasks

import_submodules(__name__, __path__)  # every loss module registers its classes in LOSSES
_losses = LOSSES.classes_in(__name__)
globals().update(_losses)

__all__ = ["PairBatch", "PairLoss", "PairMasks", *_losses]
