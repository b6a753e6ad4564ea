"""Proxy-NCA (Movshovitz-Attias et al., ICCV 2017) and ProxyNCA++ (Teh et al., ECCV 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dmlkit._validation import BOOL, Interval, Options, validate_params
from dmlkit.distances import l2_normalize
from dmlkit.losses.base import LOSSES, zero_loss
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._math import common_dtype, normalize_rows


def proxy_nca_loss(
    logits: torch.Tensor,
    candidates: torch.Tensor,
    assignment: str,
    exclude_positive: bool,
) -> torch.Tensor:
    """Mean over samples of ``LSE_{denominator} logits - LSE_{positives} logits``.

    Proxy-NCA Eq. (4) with ``Z`` the negative proxies (``exclude_positive=True``), or the
    softmax over positives and negatives (``False``, PML/ProxyNCA++). ``logits [B, P]``;
    ``candidates [B, Kc]`` the columns of each sample's class proxies. Works on column
    indices, so the only ``[B, P]`` passes are a (log-)softmax (and one masked copy when
    columns must be left out of the denominator).
    """
    if assignment == "dynamic":
        positive_cols = logits.detach().argmax(dim=1, keepdim=True)
        excluded = positive_cols if exclude_positive else None
    elif assignment == "nearest" and candidates.shape[1] > 1:
        nearest = logits.detach().gather(1, candidates).argmax(dim=1, keepdim=True)
        positive_cols = candidates.gather(1, nearest)
        excluded = candidates
    else:
        positive_cols = candidates
        excluded = candidates if exclude_positive else None
    positive_logits = logits.gather(1, positive_cols)
    denominator_logits = logits if excluded is None else logits.scatter(1, excluded, float("-inf"))
    if exclude_positive:
        numerator = torch.logsumexp(positive_logits, dim=1)
        return (torch.logsumexp(denominator_logits, dim=1) - numerator).mean()
    if excluded is not None:  # "nearest": the other class proxies are out, the positive is in
        denominator_logits = denominator_logits.scatter(1, positive_cols, positive_logits)
    if positive_cols.shape[1] == 1:  # softmax cross-entropy (fused log-softmax + NLL)
        return F.cross_entropy(denominator_logits, positive_cols[:, 0])
    log_probs = torch.log_softmax(denominator_logits, dim=1).gather(1, positive_cols)
    return -torch.logsumexp(log_probs, dim=1).mean()


@LOSSES.register("proxy_nca")
class ProxyNCALoss(ProxyLoss):
    """NCA between each sample and the proxies: Proxy-NCA Eq. (4) with proxies (Alg. 1).

    ``loss_i = -log( exp(-s d(x_i, p(y_i))) / sum_{p in Z} exp(-s d(x_i, p)) )``, mean over the
    batch, with ``d`` the squared Euclidean distance between L2-normalised embeddings and
    proxies (Sec. 3.3/4: both on the unit sphere) and ``s = softmax_scale``.

    * ``exclude_positive=False`` (default, PML's ProxyNCALoss): ``Z`` is all proxies, i.e. a
      softmax cross-entropy; ``True`` is the paper's Eq. (4), ``Z`` = negative proxies only
      (the loss can then go below 0).
    * ``assignment`` (Sec. 4.1): ``"static"`` = the class's proxy; with ``K > 1`` the class's
      ``K`` proxies enter the numerator as a log-sum-exp (soft nearest); ``"nearest"`` = the
      nearest proxy of the class (Eq. (5) within the class; the other class proxies are left
      out of the denominator); ``"dynamic"`` = nearest proxy overall, labels ignored (Sec. 6.6).
    * ``proxies_per_class`` may be a fraction ``f < 1`` (Sec. 6.5): ``ceil(C f)`` proxies and a
      seeded random pre-assignment of classes to them.
    """

    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "softmax_scale", "assignment", "exclude_positive")

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        softmax_scale: float = 1,
        proxies_per_class: float = 1,
        assignment: str = "static",
        exclude_positive: bool = False,
        proxy_init: str = "normal",
        seed: int = 0,
    ):
        validate_params(
            type(self).__name__,
            {"softmax_scale": softmax_scale, "assignment": assignment, "exclude_positive": exclude_positive},
            {
                "softmax_scale": [Interval(float, 0, None, closed="neither")],
                "assignment": [Options(("static", "nearest", "dynamic"))],
                "exclude_positive": [BOOL],
            },
        )
        super().__init__(num_classes, embedding_size, proxies_per_class, proxy_init, seed)
        self.softmax_scale = float(softmax_scale)
        self.assignment = assignment
        self.exclude_positive = exclude_positive

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, **kwargs) -> torch.Tensor:
        self.reject_kwargs(kwargs)
        embeddings, proxies = common_dtype(embeddings, self.proxies)
        candidates = self.bank.candidate_columns(labels)
        num_excluded = 1 if self.assignment == "dynamic" else candidates.shape[1]
        if self.exclude_positive and self.bank.num_proxies == num_excluded:
            return zero_loss(embeddings, proxies)  # no negative proxy at all: Eq. (4) is undefined
        # -s ||x - p||^2 = 2 s <x, p> - 2 s on the unit sphere; the constant cancels in the ratio
        logits = (2.0 * self.softmax_scale * l2_normalize(embeddings)) @ normalize_rows(proxies).T
        return proxy_nca_loss(logits, candidates, self.assignment, self.exclude_positive)


@LOSSES.register("proxy_nca_plus_plus")
class ProxyNCAPlusPlusLoss(ProxyNCALoss):
    """ProxyNCA++: Proxy-NCA with a low softmax temperature over all proxies (positive included).

    ``loss_i = -log softmax_p(-d(x_i, p) / T)[p(y_i)]`` with ``d`` the squared Euclidean distance
    between normalised embeddings and normalised proxies (proxy normalisation is built in).
    The paper's other ingredients are not part of the loss: fast-moving proxies are a much
    larger learning rate for ``loss.proxies`` in its own optimiser parameter group, and global
    max pooling / layer norm belong to the model.
    """

    _repr_keys = ("num_classes", "embedding_size", "proxies_per_class", "temperature", "assignment")

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        temperature: float = 1 / 9,
        proxies_per_class: float = 1,
        assignment: str = "static",
        proxy_init: str = "normal",
        seed: int = 0,
    ):
        validate_params(
            "ProxyNCAPlusPlusLoss",
            {"temperature": temperature},
            {"temperature": [Interval(float, 0, None, closed="neither")]},
        )
        super().__init__(
            num_classes, embedding_size, 1.0 / temperature, proxies_per_class, assignment, False, proxy_init, seed
        )
        self.temperature = float(temperature)
