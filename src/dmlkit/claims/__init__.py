"""The five papers' claims, tested with networks that learn: arms tuned alike, seeded class splits, paired statistics.

``scripts/reproduce.py claims [CLAIM...] [--quick]`` runs it (:func:`run_claims`); docs/claims.md
describes the protocol. The pieces: :mod:`~dmlkit.claims.catalogue` (arms and claims, with the papers'
numbers), :mod:`~dmlkit.claims.glyphs` (Omniglot splits re-drawn per seed, a tuning pool, the CNN from
scratch), :mod:`~dmlkit.claims.photos` (grocery photos, EfficientNet-Lite0 fine-tuned),
:mod:`~dmlkit.claims.runner` (resumable tuning, result and curve runs), :mod:`~dmlkit.claims.records`
(run records checked as a whole), :mod:`~dmlkit.claims.analysis` (verdicts from
:mod:`dmlkit.report.stats`), :mod:`~dmlkit.claims.verify` (every statistic recomputed from claims.json).
"""

from dmlkit.claims.catalogue import ARMS, CLAIMS, UNTESTED, Arm, Claim, Comparison
from dmlkit.claims.experiment import run_claims

__all__ = ["ARMS", "CLAIMS", "UNTESTED", "Arm", "Claim", "Comparison", "run_claims"]
