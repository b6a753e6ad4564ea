"""Triplets whose negative sees the anchor-positive pair under a large angle (angular mining)."""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import NONE, Interval, validate_params
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


#: Elements of the ``[P, chunk, D]`` difference block :func:`half_angular_angles` builds at a time.
_HALF_BLOCK = 1 << 24


def half_angular_angles(anchors: torch.Tensor, positives: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """``[P, R]`` angles of Eq. (5) in the inputs' own (half) dtype, with PML's order of operations.

    ``c = (a + p) / 2``; ``||a - p||`` and ``||n - c||`` as ``F.pairwise_distance`` (``p=2``,
    ``eps=1e-6`` added to the difference); ``atan(ap / (2 nc))``. A float16 triplet whose angle
    rounds onto the threshold is then kept or dropped exactly as PML keeps or drops it (PML parity;
    float32 and float64 batches use :func:`angular_angles`).
    """
    centre = (anchors + positives) / 2
    ap = torch.nn.functional.pairwise_distance(anchors, positives)[:, None]
    step = max(1, _HALF_BLOCK // max(1, centre.shape[0] * centre.shape[1]))
    nc = torch.cat([
        torch.nn.functional.pairwise_distance(references[start:start + step][None, :, :], centre[:, None, :])
        for start in range(0, references.shape[0], step)
    ], dim=1) if references.shape[0] else centre.new_zeros(centre.shape[0], 0)
    return torch.atan(ap / (2 * nc))


class AngularMiner(BaseMiner):
    """Every triplet ``(a, p, n)`` whose angle at ``n`` exceeds ``angle`` degrees.

    Wang et al. (2017), Eq. (5): ``tan(angle_n) = ||x_a - x_p|| / (2 ||x_n - x_c||)``. The
    distance is fixed to PML's asserted ``LpDistance(p=2, power=1, normalize_embeddings=True)``;
    ``distance=`` is accepted only with those settings, and, as in PML, the angles are measured
    on the embeddings as given.
    """

    _repr_keys = ("angle",)
    #: float16/bfloat16 batches are mined in their own dtype with PML's formula (PML parity at the threshold).
    mines_in_input_dtype = True

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
        half = embeddings.dtype in (torch.float16, torch.bfloat16)
        angles = (half_angular_angles if half else angular_angles)(embeddings[anchor], ref_emb[pos], ref_emb)
        pair, neg = (negative[anchor] & (angles > self.angle)).nonzero(as_tuple=True)
        return TripletSelection(anchor[pair], pos[pair], neg)
