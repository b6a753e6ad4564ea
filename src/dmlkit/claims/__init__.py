"""The five papers' claims, tested with networks that learn: arms, seeded class splits, paired statistics.

``scripts/reproduce.py claims [CLAIM...] [--quick]`` runs it (:func:`run_claims`); docs/results.md
gives the tables. The pieces: :mod:`~dmlkit.claims.catalogue` (arms and claims, with the papers'
numbers), :mod:`~dmlkit.claims.glyphs` (Omniglot splits re-drawn per seed, the CNN from scratch),
:mod:`~dmlkit.claims.runner` (resumable training, learning rates chosen on validation classes),
:mod:`~dmlkit.claims.analysis` (verdicts from :mod:`dmlkit.report.stats`).
"""

from dmlkit.claims.catalogue import ARMS, CLAIMS, UNTESTED, Arm, Claim, Comparison
from dmlkit.claims.experiment import run_claims

__all__ = ["ARMS", "CLAIMS", "UNTESTED", "Arm", "Claim", "Comparison", "run_claims"]
