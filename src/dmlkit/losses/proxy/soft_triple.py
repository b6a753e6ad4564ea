"""SoftTriple loss (Qian et al., ICCV 2019)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from dmlkit.core.cpu_ops import exp
from dmlkit.core.validation import Interval
from dmlkit.distances import BaseDistance, CosineSimilarity
from dmlkit.exceptions import DataError
from dmlkit.losses.base import LOSSES
from dmlkit.losses.logsumexp import exp_is_safe, exp_sum_
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, normalize_rows


def soft_triple_kernel(
    z: torch.Tensor, need_grad: bool, labels: torch.Tensor, centers: int, la: float, gamma: float, margin: float
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """SoftTriple (Sec. 3) and its analytic gradient from ``z = s / gamma [C*K, B]`` (overwritten).

    With ``u = z`` viewed ``[C, K, B]`` (``u - m`` with ``m`` the max over ``k`` when ``exp(u)``
    is unsafe), ``e_k = exp(u_k)``, ``Z = sum_k e_k`` and ``V = sum_k e_k u_k / Z = S / gamma``,
    the class logits are ``la * (gamma V - margin [c = y])`` and ``H = dl/dS = la (softmax -
    onehot) / B``. Since ``dS/ds_k = w_k (1 + u_k - V)`` (``w = e / Z``), ``dl/dz_k = gamma H / Z
    (e_k u_k + e_k (1 - V))``, written over ``z``; the ``[C, K, B]`` matrix is swept six times.
    """
    num_classes, batch = z.shape[0] // centers, z.shape[1]
    u = z.view(num_classes, centers, batch)
    shift = None
    if not exp_is_safe(1.0 / gamma, z.dtype):  # |u| <= 1 / gamma; else work with u - m (same u - V)
        shift = u.amax(dim=1, keepdim=True)
        u.sub_(shift)
    e = exp(u)
    norm = e.sum(dim=1)
    relaxed = u.mul_(e).sum(dim=1).div_(norm)  # V (- m), [C, B]
    logits = relaxed * (la * gamma) if shift is None else (relaxed + shift[:, 0]).mul_(la * gamma)
    rows = labels[None, :]  # sample i's class row: one entry per column, so scatter/gather (no sort, no sync)
    target = logits.gather(0, rows).sub_(la * margin)
    logits.scatter_(0, rows, target)
    probs, total, lse = exp_sum_(logits, 0, la * (1.0 + abs(margin)))
    loss = (lse - target[0]).mean()
    if not need_grad:
        return loss, None, None
    grad_s = probs.div_(total)
    grad_s = grad_s.scatter_(0, rows, grad_s.gather(0, rows).sub_(1.0)).mul_(la / batch)
    factor = grad_s.mul_(gamma).div_(norm)  # gamma H / Z
    grad_u = u.addcmul_(e, relaxed.neg_().add_(1.0)[:, None]).mul_(factor[:, None])
    return loss, grad_u.view(num_classes * centers, batch), None


@LOSSES.register("soft_triple")
class SoftTripleLoss(ProxyLoss):
    """Softmax over classes of a soft max-over-centres similarity (SoftTriple, Qian et al. 2019, Sec. 3).

    ``S_{i,c} = sum_k softmax_k(s_{i,c,k} / gamma) s_{i,c,k}`` over the ``K = centers_per_class``
    proxies of class ``c`` (cosine ``s``); ``loss_i = CE(la * (S_i - margin * onehot(y_i)), y_i)``,
    mean over the batch. ``tau > 0`` adds the paper's centre regulariser:
    ``tau * sum_c sum_{k<k'} sqrt(2 + 1e-5 - 2 <w_ck, w_ck'>) / (C K (K-1))`` on normalised
    centres; ``tau=0`` (default) matches PML, which leaves it out.
    """

    supports_fractional = False
    _repr_keys = (
        "num_classes", "embedding_size", "proxies_per_class", "la", "gamma", "margin", "tau", "matmul_precision"
    )

    _parameter_constraints = {
        "centers_per_class": [Interval(int, 1, None)],
        "la": [Interval(float, 0, None, closed="neither")],
        "gamma": [Interval(float, 0, None, closed="neither")],
        "margin": [Interval(float, None, None)],
        "tau": [Interval(float, 0, None)],
    }

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        centers_per_class: int = 10,
        la: float = 20,
        gamma: float = 0.1,
        margin: float = 0.01,
        tau: float = 0.0,
        proxy_init: str = "normal",
        seed: int = 0,
        matmul_precision: str = "highest",
        *,
        distance: object | None = None,
        reducer: object | None = None,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ):
        super().__init__(num_classes, embedding_size, centers_per_class, proxy_init, seed, matmul_precision,
            distance=distance, reducer=reducer, embedding_regularizer=embedding_regularizer,
            embedding_reg_weight=embedding_reg_weight, weight_regularizer=weight_regularizer,
            weight_reg_weight=weight_reg_weight,
        )
        self.la = float(la)
        self.gamma = float(gamma)
        self.margin = float(margin)
        self.tau = float(tau)

    @property
    def centers_per_class(self) -> int:
        return int(self.bank.proxies_per_class)

    def default_distance(self) -> BaseDistance:
        return CosineSimilarity()

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` class similarities ``S_{i,c}``: the softmax(s / gamma)-weighted cosine to class c's centres."""
        sim = super().get_logits(embeddings).view(-1, self.num_classes, self.centers_per_class)
        return (torch.softmax(sim / self.gamma, dim=2) * sim).sum(dim=2)

    @property
    def fc(self) -> torch.Tensor:
        """PML's layout of the centres, ``[embedding_size, C*K]``: a transposed view of :attr:`proxies`."""
        return self.proxies.t()

    def __setattr__(self, name: str, value: object) -> None:
        if name == "fc" and "bank" in self.__dict__.get("_modules", {}):
            # PML stores the centres as fc [D, C*K]; dmlkit keeps them class-major [C*K, D]. The
            # values are copied into a new parameter (assigning fc does not share the tensor).
            if not isinstance(value, torch.Tensor) or value.dim() != 2:
                raise DataError(f"SoftTripleLoss.fc must be a [embedding_size, C*K] tensor. Got {value!r} instead.")
            self.set_proxies(torch.nn.Parameter(value.detach().t().contiguous()))
        else:
            super().__setattr__(name, value)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        self.bank.check_labels(labels)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        return self.loss_with_proxies(embeddings, labels, proxies)

    def loss_with_proxies(self, embeddings: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
        """The loss of ``embeddings [B, D]`` against explicit ``proxies [C*K, D]`` (one fused sweep, see
        :func:`soft_triple_kernel`), plus the centre regulariser when ``tau > 0``."""
        k = self.centers_per_class
        kernel = partial(soft_triple_kernel, labels=labels, centers=k, la=self.la, gamma=self.gamma, margin=self.margin)
        loss = self.fused(normalize_rows(embeddings), proxies, kernel, 1.0 / self.gamma, labels)
        if self.tau > 0 and k > 1:
            loss = loss + self.tau * self.center_regularizer(proxies)
        return loss

    def center_regularizer(self, proxies: torch.Tensor) -> torch.Tensor:
        """Sum of pairwise distances between each class's normalised centres over ``C K (K-1)`` (SoftTriple regulariser)."""
        centers = F.normalize(proxies, dim=1).view(self.num_classes, self.centers_per_class, -1)
        gram = centers @ centers.transpose(1, 2)
        k = self.centers_per_class
        upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=gram.device), diagonal=1)
        dist = torch.sqrt((2.0 + 1e-5 - 2.0 * gram[:, upper]).clamp_min(1e-12))
        return dist.sum() / (self.num_classes * k * (k - 1))
