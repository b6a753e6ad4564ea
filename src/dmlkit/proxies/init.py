"""Initialisers for a proxy matrix ``[P, D]``.

``"normal"`` is Proxy-Anchor's choice (Sec. 4.1: "initialized using a normal distribution to
ensure that they are uniformly distributed on the unit hypersphere"), implemented as
kaiming-normal with ``mode="fan_out"`` like PML's ProxyAnchorLoss. ``"uniform"`` is
kaiming-uniform with ``a=sqrt(5)`` (PML's SoftTripleLoss default). Both only matter up to
scale for cosine losses. ``"standard_normal"`` is ``N(0, 1)`` per entry (PML's classification
losses: ``torch.nn.init.normal_`` on ``W``). Every draw uses an explicit :class:`torch.Generator`.
"""

from __future__ import annotations

import math

import torch

PROXY_INITS = ("normal", "uniform", "standard_normal")


@torch.no_grad()
def init_proxies_(proxies: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """Fill ``proxies [P, D]`` in place with the initialiser named ``kind``."""
    if kind == "normal":
        return torch.nn.init.kaiming_normal_(proxies, mode="fan_out", generator=generator)
    if kind == "standard_normal":
        return proxies.normal_(generator=generator)
    if kind == "uniform":
        return torch.nn.init.kaiming_uniform_(proxies, a=math.sqrt(5), generator=generator)
    raise ValueError(f"unknown proxy initialiser {kind!r}; expected one of {PROXY_INITS}")


def fractional_class_to_proxy(num_classes: int, num_proxies: int, generator: torch.Generator) -> torch.Tensor:
    """A random, balanced pre-assignment of ``num_classes`` classes to fewer proxies ``[C]``.

    Proxy-NCA Sec. 6.5 ("randomly pre-assign semantic labels to proxies"): a random permutation
    of the classes is dealt round-robin, so every proxy serves ``floor`` or ``ceil(C / P)`` classes.
    """
    order = torch.randperm(num_classes, generator=generator)
    mapping = torch.empty(num_classes, dtype=torch.int64)
    mapping[order] = torch.arange(num_classes, dtype=torch.int64) % num_proxies
    return mapping


def sample_rows_per_class(
    labels: torch.Tensor, num_classes: int, per_class: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick ``per_class`` random row indices of each class: ``(rows [C, K], present [C])``.

    Classes with fewer than ``per_class`` rows reuse rows (cyclically over a random order);
    classes with no rows are flagged ``present=False`` and get index 0.
    """
    labels = labels.to("cpu", torch.int64)
    # Random order, then a stable sort by label groups each class's rows in random order.
    shuffle = torch.randperm(labels.numel(), generator=generator)
    sorted_labels, order = torch.sort(labels[shuffle], stable=True)
    rows_sorted = shuffle[order]
    counts = torch.bincount(sorted_labels, minlength=num_classes)[:num_classes]
    starts = torch.cumsum(counts, 0) - counts
    present = counts > 0
    offsets = torch.arange(per_class, dtype=torch.int64)[None, :] % counts.clamp_min(1)[:, None]
    pick = (starts[:, None] + offsets).clamp_max(max(labels.numel() - 1, 0))
    rows = rows_sorted[pick] if labels.numel() else torch.zeros_like(pick)
    return torch.where(present[:, None], rows, torch.zeros_like(rows)), present
