"""Signal-to-noise ratio distance (Yuan et al., "Signal-To-Noise Ratio: A Robust Distance Metric
for Deep Metric Learning", CVPR 2019, Eq. (4)): ``d(x, y) = Var(y - x) / Var(x)``."""

from __future__ import annotations

import torch

from dmlkit.distances.pairwise import BaseDistance, _require

#: An anchor whose features are all equal has no signal; its noise is divided by this instead of 0
#: (PML divides by 0: inf or NaN).
SIGNAL_FLOOR = 1e-12


class SNRDistance(BaseDistance):
    """``Var(x - y) / Var(x)`` over the feature dimension (unbiased variances), anchor ``x`` first.

    Yuan et al. (2019) Eq. (4): the noise ``y - x`` over the signal ``x``. As PML's
    ``SNRDistance``, the embeddings are L2-normalised first unless ``normalize_embeddings=False``.
    The ``[B, R]`` matrix comes from one product, without the ``[B, R, D]`` differences:
    ``(D - 1) Var(x - y) = |x|^2 + |y|^2 - 2<x, y> - (sum x - sum y)^2 / D``.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        _require(self, not self.is_inverted, "is_inverted", "False")

    def compute_mat(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        dim = query_emb.shape[1]
        q_sq, r_sq = (query_emb * query_emb).sum(1), (ref_emb * ref_emb).sum(1)
        q_sum, r_sum = query_emb.sum(1), ref_emb.sum(1)
        noise = q_sq.unsqueeze(1) + r_sq - 2.0 * (query_emb @ ref_emb.T)
        noise = (noise - (q_sum.unsqueeze(1) - r_sum).square() / dim).clamp_min(0.0)
        signal = q_sq - q_sum.square() / dim
        return noise / signal.clamp_min(SIGNAL_FLOOR).unsqueeze(1)

    def pairwise_distance(self, query_emb: torch.Tensor, ref_emb: torch.Tensor) -> torch.Tensor:
        return torch.var(query_emb - ref_emb, dim=1) / torch.var(query_emb, dim=1).clamp_min(SIGNAL_FLOOR)
