"""Learnable proxies in a class-major layout, with their labels and assignment rules.

Layout: with ``K = proxies_per_class`` (an int >= 1) the proxy matrix is ``[C * K, D]`` and
class ``c`` owns rows ``c*K ... c*K + K - 1``; :attr:`ProxyBank.proxy_labels` is ``[C * K]``.
A fraction ``0 < f < 1`` (Proxy-NCA Sec. 6.5) gives ``P = ceil(C * f)`` shared proxies and a
seeded random pre-assignment ``class_to_proxy [C]``; then ``proxy_labels`` holds proxy ids
(``arange(P)``) and a sample's group is ``class_to_proxy[label]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from dmlkit.core import validation as _validation
from dmlkit.core.validation import Interval, Options, check_embeddings_labels, validate_params
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.proxies.init import PROXY_INITS, fractional_class_to_proxy, init_proxies_, sample_rows_per_class

ASSIGNMENTS = ("static", "nearest", "dynamic")
#: How the leaf parameter is stored: ``proxies [P, D]`` (dmlkit's) or ``weight [D, P]`` (PML's
#: classification losses' ``W``); either way :attr:`ProxyBank.proxies` reads ``[P, D]`` class-major.
LAYOUTS = ("class_major", "feature_major")


@dataclass(frozen=True)
class DynamicTriplets:
    """Proxy triplets ``(x_a, p(y), p(Z_a))`` of a batch under dynamic assignment (Proxy-NCA Sec. 4.1).

    ``anchors [T]`` and ``positive_proxies [T]``: one row per triplet; ``negative_proxies [B, P]``
    (bool): for each anchor, the proxies nearest to at least one of its negatives.
    """

    anchors: torch.Tensor
    positive_proxies: torch.Tensor
    negative_proxies: torch.Tensor


def dynamic_triplets(similarity: torch.Tensor, labels: torch.Tensor) -> DynamicTriplets:
    """The proxy triplets of a batch with dynamic proxy assignment (Proxy-NCA Eq. (5), Sec. 4.1, 6.6, 7).

    ``similarity [B, P]`` (larger is closer) between the batch and every proxy; ``labels [B]``
    only say which samples are similar. Each sample ``v`` gets its nearest proxy
    ``p(v) = argmax_p similarity[v, p]`` (Eq. (5); no gradient through the argmax). The sample
    triplets are every ordered pair ``(a, y)`` with ``y != a`` of the same label, with
    ``Z_a`` = every sample of another label; the proxy triplet is ``(x_a, p(y), p(Z_a))`` where
    ``p(Z_a) = {p(z) : z in Z_a}`` is a set (a proxy nearest to several negatives counts once;
    it may contain ``p(y)``). Anchors without a negative in the batch form no triplet.
    """
    nearest = similarity.detach().argmax(dim=1)  # [B], Eq. (5)
    different = labels[:, None] != labels[None, :]  # [B, B]: z is a negative of a
    nearest_of = torch.zeros_like(similarity, dtype=torch.bool)
    nearest_of[torch.arange(similarity.shape[0], device=similarity.device), nearest] = True  # [B, P]
    negative_proxies = (different.float() @ nearest_of.float()) > 0
    same = ~different
    same.fill_diagonal_(False)
    same &= different.any(dim=1, keepdim=True)
    anchors, positives = same.nonzero(as_tuple=True)
    return DynamicTriplets(anchors, nearest[positives], negative_proxies)


def num_proxies_for(num_classes: int, proxies_per_class: float) -> int:
    """``C * K`` for an integer ``K``, ``ceil(C * f)`` for a fraction ``f < 1``."""
    if proxies_per_class >= 1:
        return num_classes * int(proxies_per_class)
    return max(1, math.ceil(num_classes * proxies_per_class))


def validate_proxies_per_class(owner: str, proxies_per_class: float) -> None:
    """An int ``K >= 1`` or a float fraction in ``(0, 1)``."""
    validate_params(owner, {"proxies_per_class": proxies_per_class},
                    {"proxies_per_class": [Interval(float, 0, None, closed="neither")]})
    if proxies_per_class >= 1 and float(proxies_per_class) != int(proxies_per_class):
        raise InvalidParameterError(
            f"The 'proxies_per_class' parameter of {owner} must be an int >= 1 or a float in the "
            f"range (0, 1). Got {proxies_per_class!r} instead."
        )


class ProxyBank(nn.Module):
    """``num_proxies x embedding_size`` learnable proxies with class labels (class-major).

    Proxy-NCA (Movshovitz-Attias et al. 2017) Sec. 4.1 and 6.5; ASAP Eq. (4.11) with K per class.
    ``seed`` drives the initialisation and the fractional pre-assignment; the generator state is
    not needed afterwards because everything it produced lives in ``state_dict``.

    ``layout="feature_major"`` stores the leaf as ``weight [D, P]`` (the classification losses'
    PML-shaped ``W``, so ``loss.W`` is the parameter itself: its ``.grad``, an optimiser over it);
    ``proxies`` is then its transposed view, still ``[P, D]`` class-major, and every rule below is
    the same.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        proxies_per_class: float = 1,
        proxy_init: str = "normal",
        seed: int = 0,
        owner: str = "ProxyBank",
        layout: str = "class_major",
    ):
        super().__init__()
        validate_params(
            owner,
            {"num_classes": num_classes, "embedding_size": embedding_size, "proxy_init": proxy_init, "seed": seed,
             "layout": layout},
            {
                "num_classes": [Interval(int, 1, None)],
                "embedding_size": [Interval(int, 1, None)],
                "proxy_init": [Options(PROXY_INITS)],
                "seed": [Interval(int, 0, None)],
                "layout": [Options(LAYOUTS)],
            },
        )
        validate_proxies_per_class(owner, proxies_per_class)
        self.num_classes = int(num_classes)
        self.embedding_size = int(embedding_size)
        self.is_fractional = proxies_per_class < 1
        self.proxies_per_class = proxies_per_class if self.is_fractional else int(proxies_per_class)
        self.proxy_init = proxy_init
        self.seed = int(seed)
        self.num_proxies = num_proxies_for(self.num_classes, self.proxies_per_class)
        self.layout = layout
        if layout == "feature_major":
            self.weight = nn.Parameter(torch.empty(self.embedding_size, self.num_proxies))
        else:
            self.proxies = nn.Parameter(torch.empty(self.num_proxies, self.embedding_size))
        generator = torch.Generator().manual_seed(self.seed)
        init_proxies_(self.proxies, proxy_init, generator)
        if self.is_fractional:
            self.register_buffer("proxy_labels", torch.arange(self.num_proxies, dtype=torch.int64))
            self.register_buffer(
                "class_to_proxy", fractional_class_to_proxy(self.num_classes, self.num_proxies, generator)
            )
        else:
            self.register_buffer(
                "proxy_labels",
                torch.arange(self.num_classes, dtype=torch.int64).repeat_interleave(self.proxies_per_class),
            )
            self.class_to_proxy = None

    # ----------------------------------------------------------------------------- layout
    def __getattr__(self, name: str):
        if name == "proxies" and "weight" in self.__dict__["_parameters"]:
            return self.__dict__["_parameters"]["weight"].t()  # feature-major: [P, D] view of weight [D, P]
        return super().__getattr__(name)

    @property
    def parameter(self) -> nn.Parameter:
        """The leaf parameter: ``proxies [P, D]``, or ``weight [D, P]`` in the feature-major layout."""
        return self.weight if self.layout == "feature_major" else self.proxies

    def replace_parameter(self, rows: torch.Tensor) -> None:
        """Make ``rows [P, D]`` the proxies: the given Parameter itself (class-major), or its values
        copied into a new ``weight [D, P]`` (feature-major; assign ``weight`` to share one)."""
        if self.layout == "class_major":
            self.proxies = rows if isinstance(rows, nn.Parameter) else nn.Parameter(rows)
        else:
            self.weight = nn.Parameter(rows.detach().t().contiguous())

    @torch.no_grad()
    def promote_(self, dtype: torch.dtype) -> None:
        """Move the leaf parameter's values to ``dtype`` in place (it stays the same Parameter)."""
        self.parameter.data = self.parameter.data.to(dtype)

    def groups(self, labels: torch.Tensor, check: bool = True) -> torch.Tensor:
        """The proxy group of each sample ``[B]``: its class, or its pre-assigned proxy (fractional).

        ``check=False``: the caller has already run :meth:`check_labels` on these labels in this call.
        """
        if check:
            self.check_labels(labels)
        return labels if self.class_to_proxy is None else self.class_to_proxy[labels]

    def check_labels(self, labels: torch.Tensor) -> None:
        """Raise :class:`DataError` when a label is outside ``[0, num_classes)``.

        Labels in host memory are read here; labels on an accelerator are checked by an assertion
        queued with the kernels (``torch._assert_async``), so the check costs no host synchronisation.
        """
        if not labels.numel():
            return
        if not _validation.reads_on_host(labels):
            inside = torch.floor_divide(labels, self.num_classes).eq(0)  # 0 <= label < C, in two operators
            torch._assert_async(inside.all(), f"labels must lie in [0, {self.num_classes}) for num_classes={self.num_classes}")
            return
        if int(labels.min()) < 0 or int(labels.max()) >= self.num_classes:
            raise DataError(
                f"labels must lie in [0, {self.num_classes}) for num_classes={self.num_classes}; "
                f"got labels in [{int(labels.min())}, {int(labels.max())}]."
            )

    def per_class(self) -> torch.Tensor:
        """The proxies as ``[C, K, D]`` (integer ``K`` only); a view sharing storage."""
        if self.is_fractional:
            raise InvalidParameterError("per_class() needs an integer proxies_per_class, not a fraction.")
        return self.proxies.view(self.num_classes, self.proxies_per_class, self.embedding_size)

    def candidate_mask(self, labels: torch.Tensor, columns: torch.Tensor | None = None,
                       check: bool = True) -> torch.Tensor:
        """``[B, P]`` True where proxy ``p`` belongs to sample ``i``'s class (or its fractional proxy).

        With ``columns [U]`` only those proxies are compared: ``[B, U]``.
        """
        if columns is None:
            proxy_labels = self.proxy_labels
        else:  # one proxy per class: a column is its class (no lookup)
            proxy_labels = columns if self.proxies_per_class == 1 else self.proxy_labels[columns]
        return self.groups(labels, check)[:, None] == proxy_labels[None, :]

    def candidate_columns(self, labels: torch.Tensor) -> torch.Tensor:
        """``[B, K]`` indices of each sample's class proxies (``[B, 1]`` pre-assigned proxy when fractional)."""
        groups = self.groups(labels)
        if self.is_fractional:
            return groups[:, None]
        k = self.proxies_per_class
        if k == 1:
            return groups[:, None]
        return groups[:, None] * k + torch.arange(k, device=groups.device)[None, :]

    def present_columns(self, labels: torch.Tensor) -> torch.Tensor:
        """Sorted indices ``[U]`` of the proxies whose class (group) occurs in ``labels``.

        ``U`` depends on the labels' values (a host synchronisation on a card); the losses use
        :meth:`batch_columns`, the same set in a block whose size depends on shapes only.
        """
        return torch.unique(self.candidate_columns(labels))

    def batch_columns(self, labels: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The proxies of the classes (groups) in ``labels [B]`` as a block of static shape: ``(columns, first)``.

        ``columns [n]`` (``n = B*K``, or ``B`` when fractional) are the batch's candidate proxies sorted, each
        proxy of :meth:`present_columns` once or several times in a row; ``first [n]`` (bool) marks the first
        of each run, so a rule that counts every present proxy once keeps ``first`` and masks the repeats.
        No output is sized by the labels' values, so nothing waits for a card. When ``n >= num_proxies``
        the block would be no smaller than the whole bank: ``(None, None)`` then means every proxy.
        """
        candidates = self.candidate_columns(labels).reshape(-1)
        if candidates.numel() >= self.num_proxies:
            return None, None
        columns = torch.sort(candidates).values
        first = torch.ones_like(columns, dtype=torch.bool)
        torch.ne(columns[1:], columns[:-1], out=first[1:])
        return columns, first

    # ------------------------------------------------------------------------- assignment
    def assign(
        self,
        similarity: torch.Tensor,
        labels: torch.Tensor,
        assignment: str = "static",
        columns: torch.Tensor | None = None,
        check: bool = True,
        first: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positive [B, P], negative [B, P])`` proxy masks for each sample (``check``: see :meth:`groups`).

        ``similarity [B, P]`` is larger-is-closer; with ``columns [U]`` it holds only those
        proxies (``[B, U]``; for ``"nearest"`` they must include every candidate proxy of the
        batch, e.g. :meth:`present_columns`, or :meth:`batch_columns` with its ``first [U]``: then a
        repeated column is neither positive nor negative). Rules (Proxy-NCA Sec. 4.1, Eq. (5)):

        * ``"static"``: positives are all proxies of the sample's class (``K`` of them; the one
          pre-assigned proxy when fractional); negatives are all other proxies.
        * ``"nearest"``: the single most similar proxy of the sample's class is positive; the
          class's other proxies are neither; negatives as in static (equals static when K=1).

        ``"dynamic"`` is not a per-sample rule: its positive depends on the triplet's positive
        sample, see :func:`dynamic_triplets`.
        """
        if assignment == "dynamic":
            raise InvalidParameterError(
                "assignment='dynamic' forms proxy triplets from sample triplets; use dynamic_triplets(), not assign()."
            )
        candidates = self.candidate_mask(labels, columns, check)
        if assignment == "static" or (assignment == "nearest" and self.proxies_per_class == 1):
            positive = candidates
        elif assignment == "nearest":
            # argmax takes the first of equal maxima: a proxy's first column in a sorted block
            masked = similarity.detach().masked_fill(~candidates, float("-inf"))
            nearest = masked.argmax(dim=1)
            positive = torch.zeros_like(candidates)
            positive[torch.arange(similarity.shape[0], device=similarity.device), nearest] = True
        else:
            raise InvalidParameterError(f"assignment must be one of {ASSIGNMENTS}. Got {assignment!r} instead.")
        if first is None:
            return positive, ~candidates
        return positive & first, (~candidates).logical_and_(first)

    # ---------------------------------------------------------------------- initialisation
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Re-draw the proxies with ``proxy_init`` from ``seed`` (same values as at construction)."""
        init_proxies_(self.proxies, self.proxy_init, torch.Generator().manual_seed(self.seed))

    @torch.no_grad()
    def init_from(self, embeddings: torch.Tensor, labels: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        """Set each class's proxies to embeddings of randomly chosen samples of that class.

        ASAP Alg. 1 ("initialize rho* with random samples"). ``embeddings [N, D]``, ``labels [N]``.
        Classes absent from ``labels`` keep their proxies. Fractional banks use the mean of the
        chosen samples of the classes sharing a proxy. Returns ``present [C]`` (bool).
        """
        check_embeddings_labels(embeddings, labels)
        self.check_labels(labels)
        if embeddings.shape[1] != self.embedding_size:
            raise DataError(
                f"embeddings has {embeddings.shape[1]} columns but the proxies have {self.embedding_size}."
            )
        generator = torch.Generator().manual_seed(self.seed if seed is None else seed)
        per_class = 1 if self.is_fractional else self.proxies_per_class
        rows, present = sample_rows_per_class(labels, self.num_classes, per_class, generator)
        chosen = embeddings.detach().to(self.proxies.device, self.proxies.dtype)[rows.to(embeddings.device)]
        if self.is_fractional:
            self._init_fractional(chosen[:, 0], present.to(self.proxies.device))
        else:
            keep = present.to(self.proxies.device)
            view = self.per_class()
            view[keep] = chosen[keep]
        return present

    def _init_fractional(self, chosen: torch.Tensor, present: torch.Tensor) -> None:
        groups = self.class_to_proxy[present]
        sums = torch.zeros_like(self.proxies).index_add_(0, groups, chosen[present])
        counts = torch.bincount(groups, minlength=self.num_proxies)
        filled = counts > 0
        self.proxies[filled] = sums[filled] / counts[filled, None].to(sums.dtype)

    @torch.no_grad()
    def set_proxies(self, centers: torch.Tensor, classes: torch.Tensor | None = None) -> None:
        """Overwrite proxies with ``centers [C, K, D]`` (or ``[n, K, D]`` for the given ``classes [n]``)."""
        view = self.per_class()
        expected = (view.shape[0] if classes is None else classes.numel(),) + tuple(view.shape[1:])
        if tuple(centers.shape) != expected:
            raise DataError(f"centers has shape {tuple(centers.shape)} but the proxies expect {expected}.")
        centers = centers.to(view.device, view.dtype)
        if classes is None:
            view.copy_(centers)
        else:
            view[classes.to(view.device)] = centers

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, embedding_size={self.embedding_size}, "
            f"proxies_per_class={self.proxies_per_class}, num_proxies={self.num_proxies}"
        )
