"""Triplets whose negative sees the anchor-positive pair under a large angle (angular mining)."""

from __future__ import annotations

import math

import torch

from dmlkit._validation import NONE, Interval, validate_params
from dmlkit.distances import BaseDistance
from dmlkit.mining.base import DISTANCE, BaseMiner, empty_triplets, normalised_euclidean
from dmlkit.mining.selection import TripletSelection


def angular_angles(anchors: torch.Tensor, positives: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """``[P, R]`` angles ``atan(||a - p|| / (2 ||n - c||))`` at each reference ``n``, ``c = (a + p) / 2``.

    Wang et al., "Deep Metric Learning with Angular Loss" (2017), Eq. (5), on the embeddings as
    given (pytorch-metric-learning does not normalise them here either). Computed in float64
    (one ``[P, R]`` product) so that the threshold test matches a direct evaluation.
    """
    a, p, n = anchors.double(), positives.double(), references.double()
    centre = (a + p) / 2
    ap = (a - p).norm(dim=1, keepdim=True)
    sq = centre.square().sum(1, keepdim=True) + n.square().sum(1)[None, :] - 2.0 * centre @ n.T
    return torch.atan(ap / (2.0 * sq.clamp_min(0.0).sqrt()))


class AngularMiner(BaseMiner):
    """Every triplet ``(a, p, n)`` whose angle at ``n`` exceeds ``angle`` degrees.

    Wang et al. (2017), Eq. (5): ``tan(angle_n) = ||x_a - x_p|| / (2 ||x_n - x_c||)``. The
    distance is fixed to PML's asserted ``LpDistance(p=2, power=1, normalize_embeddings=True)``;
    ``distance=`` is accepted only with those settings, and, as in PML, the angles are measured
    on the embeddings as given.
    """

    _repr_keys = ("angle",)

    def __init__(self, angle: float = 20, distance: BaseDistance | None = None):
        super().__init__()
        validate_params(type(self).__name__, {"angle": angle, "distance": distance},
                        {"angle": [Interval(float)], "distance": [DISTANCE, NONE]})
        self.distance = normalised_euclidean(distance, type(self).__name__)
        self.angle_degrees = float(angle)
        self.angle = math.radians(angle)

    def mine(self, embeddings, ref_emb, positive, negative) -> TripletSelection:
        anchor, pos = positive.nonzero(as_tuple=True)
        if anchor.numel() == 0:
            return empty_triplets(embeddings.device)
        angles = angular_angles(embeddings[anchor], ref_emb[pos], ref_emb)
        pair, neg = (negative[anchor] & (angles > self.angle)).nonzero(as_tuple=True)
        return TripletSelection(anchor[pair], pos[pair], neg)
