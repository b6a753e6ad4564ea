"""Pooling and the mirror average of a pretrained backbone, chosen on the validation classes.

A fixed GeM pooling (p = 3) with the mirror average was measured first. On the 84-px
development set that untrained embedding scored below the plain average-pooled backbone a user
would try first (test MAP@R 0.354 against 0.373), and the mirror doubles every embedding's cost.
So the untrained backbone's feature maps of the validation images and of their mirror images are
computed once (:class:`PooledViews`) and every configuration (pooling x mirror) is scored from them
as per-query AP@R, the way :mod:`dmlkit.recipe.view_size` scores view sizes. The rule
(:func:`choose_pooling`): the plain configuration (average pooling, no mirror) stands unless another
beats it by more than :data:`REQUIRED_ERRORS` standard errors of the paired differences; among those
that do, the best; and the mirror average is dropped when the same pooling without it is within
:data:`TOLERATED_ERRORS` standard error (it would cost twice the embedding time for noise).

The standard error is taken over classes (:func:`class_paired_gain`: the spread of the per-class
mean differences), not over queries: the queries of one class move together, and a run has few
validation classes. On the 84-px development set GeM + mirror beat average pooling on the 498
validation queries by +0.0069 with a per-query error of 0.0025, while on the test classes it scored
0.354 against 0.373; over its 6 validation classes the gain is within one error.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch
from torch import nn

from dmlkit.distances import normalize
from dmlkit.evaluation.retrieval import paired_gain
from dmlkit.models.embedder import GlobalPool

#: Poolings compared (``dmlkit.models.embedder.POOLINGS``): average (p = 1), generalised mean (p = 3), max, avg+max.
POOLING_CANDIDATES = ("avg", "gem", "max", "avg+max")

#: What a user would try first, and the configuration a run falls back to.
PLAIN = ("avg", False)

#: Another configuration replaces the plain one only with a paired gain above this many standard errors.
REQUIRED_ERRORS = 1.0

#: The mirror average is kept only when dropping it loses more than this many standard errors.
TOLERATED_ERRORS = 1.0

Configuration = tuple[str, bool]  # (model.pooling, model.flip_average)


def is_embedder(model: nn.Module) -> bool:
    """Whether ``model`` is trunk -> pool -> head -> normalisation (:class:`dmlkit.models.Embedder`)."""
    return all(hasattr(model, name) for name in ("trunk", "pool", "head", "normalization", "flip_average"))


class PooledViews(nn.Module):
    """The trunk's feature map of each image and of its mirror, pooled every way in ``poolings``.

    ``[B, C, H, W] -> [B, 2 * P * F]`` (fp32): image-major, then view (the image, its mirror), then
    pooling. It shares ``trunk`` with the model it was made from; one trunk pass serves every
    configuration of :func:`embeddings_by_configuration`.
    """

    def __init__(self, trunk: nn.Module, poolings: Sequence[str]):
        super().__init__()
        self.trunk = trunk
        self.pools = nn.ModuleList(GlobalPool(p) for p in poolings)
        self.train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maps = self.trunk(torch.cat([x, x.flip(-1)]))
        maps = maps.float() if maps.dtype in (torch.bfloat16, torch.float16) else maps
        with torch.autocast(maps.device.type, enabled=False):
            pooled = torch.stack([pool(maps) for pool in self.pools], dim=1)  # [2B, P, F]
        return pooled.unflatten(0, (2, len(x))).transpose(0, 1).flatten(1)


def embeddings_by_configuration(model: nn.Module, pooled: torch.Tensor, poolings: Sequence[str],
                                mirrors: Iterable[bool]) -> dict[Configuration, torch.Tensor]:
    """``{(pooling, mirror): [N, E]}`` from :class:`PooledViews`' output ``[N, 2 * P * F]``.

    Each view is embedded as :class:`~dmlkit.models.Embedder` embeds it (its head and normalisation,
    in fp32); with the mirror the embedding is the normalised sum of the two views' embeddings
    (the Embedder's ``flip_average``).
    """
    views = pooled.unflatten(1, (2, len(poolings), -1))  # [N, 2, P, F]
    head_device = next((t.device for t in (*model.head.parameters(), *model.head.buffers())), pooled.device)
    out: dict[Configuration, torch.Tensor] = {}
    with torch.no_grad():
        for p, name in enumerate(poolings):
            # the head where its weights are (the card), the embeddings back where the pooled views were
            image, mirror = (normalize(model.head(views[:, v, p].to(head_device)), model.normalization).to(pooled.device)
                             for v in (0, 1))
            for flip in mirrors:
                out[(name, flip)] = normalize(image + mirror, model.normalization) if flip else image
    return out


def class_paired_gain(per_query: torch.Tensor, baseline: torch.Tensor,
                      labels: torch.Tensor | None) -> tuple[float, float]:
    """Mean per-query AP@R gain over ``baseline`` and its standard error over classes.

    The error is the standard deviation of the per-class mean differences over the square root of
    the number of classes (a cluster-robust error for equally sized classes); ``labels`` None: the
    per-query error of :func:`dmlkit.evaluation.retrieval.paired_gain`.
    """
    gain, error = paired_gain(per_query, baseline)
    if labels is None:
        return gain, error
    both = ~(per_query.isnan() | baseline.isnan())
    diff = (per_query - baseline)[both].double()
    classes, inverse = labels[both].unique(return_inverse=True)
    if len(classes) < 2:
        return gain, float("inf")
    sums = torch.zeros(len(classes), dtype=torch.float64).index_add_(0, inverse, diff)
    counts = torch.zeros(len(classes), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(diff))
    means = sums / counts
    return gain, max(error, float(means.std() / len(classes) ** 0.5))


def describe(config: Configuration) -> str:
    """``avg``, ``gem + mirror``."""
    return config[0] + (" + mirror" if config[1] else "")


def mean_ap(per_query: torch.Tensor) -> float:
    return float(per_query.nanmean())


def best_configuration(per_query: Mapping[Configuration, torch.Tensor]) -> Configuration:
    """The configuration with the highest validation MAP@R; ties go to the first listed."""
    return max(per_query, key=lambda config: mean_ap(per_query[config]))


def choose_pooling(per_query: Mapping[Configuration, torch.Tensor], labels: torch.Tensor | None = None,
                   plain: Configuration = PLAIN) -> tuple[Configuration, str]:
    """The configuration kept (``{(pooling, mirror): [N] per-query AP@R}``, the same queries, of classes
    ``labels`` ``[N]``) and why.

    ``plain`` (when measured; else the first listed) stands unless a configuration's paired gain over it
    exceeds :data:`REQUIRED_ERRORS` standard errors (:func:`class_paired_gain`); the best of those that do is
    taken, and then its pooling without the mirror when that is not worse by more than
    :data:`TOLERATED_ERRORS` standard error.
    """
    def paired_gain(ap: torch.Tensor, base: torch.Tensor) -> tuple[float, float]:
        return class_paired_gain(ap, base, labels)

    if not per_query:
        raise ValueError("choose_pooling needs at least one measured configuration.")
    base = plain if plain in per_query else next(iter(per_query))
    better = {c: ap for c, ap in per_query.items() if c != base
              and (lambda g: g[0] > REQUIRED_ERRORS * g[1])(paired_gain(ap, per_query[base]))}
    if not better:
        return base, (f"{describe(base)}: no other pooling or mirror beat its validation MAP@R "
                      f"{mean_ap(per_query[base]):.4f} by more than {REQUIRED_ERRORS:g} standard error")
    chosen = best_configuration(better)
    gain, error = paired_gain(per_query[chosen], per_query[base])
    why = (f"{describe(chosen)}: validation MAP@R {mean_ap(per_query[chosen]):.4f}, {gain:+.4f} +- {error:.4f} "
           f"over {describe(base)}")
    single = (chosen[0], False)
    if chosen[1] and single in per_query:
        loss, loss_error = paired_gain(per_query[single], per_query[chosen])
        if loss >= -TOLERATED_ERRORS * loss_error:
            return single, (f"{describe(single)}: the mirror average adds only {-loss:+.4f} +- {loss_error:.4f} "
                            f"(within {TOLERATED_ERRORS:g} standard error) for twice the embedding time; "
                            + why.replace(describe(chosen) + ": ", "with it "))
    return chosen, why


def candidates(model_choices: Mapping[str, tuple], model: nn.Module) -> tuple[tuple[str, ...], tuple[bool, ...]]:
    """The poolings and mirror settings to compare: all of them for a field the recipe chose, else the user's."""
    poolings = POOLING_CANDIDATES if "model.pooling" in model_choices else (model.pool.pooling,)
    mirrors = (False, True) if "model.flip_average" in model_choices else (bool(model.flip_average),)
    return poolings, mirrors


def apply_to_model(model: nn.Module, config: Configuration) -> None:
    """Give ``model`` (an Embedder) the pooling and mirror setting of ``config`` (pooling has no weights)."""
    model.pool = GlobalPool(config[0])
    model.flip_average = bool(config[1])


__all__ = ["PLAIN", "POOLING_CANDIDATES", "PooledViews", "apply_to_model", "best_configuration", "candidates",
           "choose_pooling", "describe", "embeddings_by_configuration", "is_embedder"]
