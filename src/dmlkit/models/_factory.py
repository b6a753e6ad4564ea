"""Model registry and factories: ``register_model``, ``create_model``, ``list_models`` (timm-style).

Names registered here (BN-Inception, ResNetV2-20, the EPS MNIST net, ...) take precedence; any
other name is looked up in timm, so ``create_model("resnet50")`` builds timm's ResNet-50 trunk.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from typing import Any, Callable

from torch import nn

from dmlkit._registry import Registry
from dmlkit._validation import NONE, InstanceOf, Interval, Options, validate_params
from dmlkit.distances.normalization import NORMALIZATIONS
from dmlkit.exceptions import InvalidParameterError
from dmlkit.models.embedder import POOLINGS, Embedder, GlobalPool, make_linear_head

MODELS: Registry[nn.Module] = Registry("model")


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Register a trunk builder ``fn(in_chans=None, **kwargs) -> nn.Module`` under ``name``.

    The trunk maps ``[B, C, H, W]`` to a feature map ``[B, F, h, w]`` (or ``[B, F]``) and exposes
    ``num_features`` (F) and ``pretrained_cfg`` (see :func:`dmlkit.models.preprocessing.make_cfg`).
    Offline weights for timm names are declared with
    :func:`dmlkit.models.timm_trunk.register_offline_weights`.
    """
    return MODELS.register(name)


def _timm_names(pattern: str = "*") -> list[str]:
    import timm

    return list(timm.list_models(pattern))


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names accepted by :func:`create_model` matching a shell pattern (dmlkit's and timm's)."""
    names = set(MODELS.names(pattern)) | {n for n in _timm_names(pattern) if fnmatch.fnmatch(n, pattern)}
    return sorted(names)


def _unknown_model_message(name: str) -> str:
    candidates = MODELS.names() + _timm_names()
    close = difflib.get_close_matches(str(name), candidates, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (
        f"Unknown model {name!r}.{hint} dmlkit models: {', '.join(MODELS.names())}; "
        "see dmlkit.models.list_models() for the timm names."
    )


def has_offline_weights(name: str) -> bool:
    """Whether ``create_model(name, pretrained=True)`` can fill the backbone without a file."""
    from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS

    return name not in MODELS and name in OFFLINE_TIMM_WEIGHTS


def create_trunk(name: str, *, pretrained: bool = False, in_chans: int | None = None, **kwargs: Any) -> nn.Module:
    """Build the backbone registered (here or in timm) as ``name``, without pooling or head.

    ``pretrained=True`` is only valid for backbones with offline weights (see
    :func:`has_offline_weights`); other weights come from a file via :func:`create_model`.
    """
    if pretrained and not has_offline_weights(name):
        raise InvalidParameterError(_no_offline_message(name))
    if name in MODELS:
        return MODELS.get(name)(in_chans=in_chans, **kwargs)
    from dmlkit.models.timm_trunk import TimmTrunk, is_timm_model

    if is_timm_model(name):
        return TimmTrunk(name, pretrained=pretrained, in_chans=in_chans, **kwargs)
    raise InvalidParameterError(_unknown_model_message(name))


def _no_offline_message(name: str) -> str:
    from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS

    return (
        f"No offline pretrained weights ship for model {name!r} and dmlkit never downloads. "
        f"Pass weights=PATH to a local state_dict (offline weights exist for: "
        f"{', '.join(sorted(OFFLINE_TIMM_WEIGHTS))})."
    )


def create_model(
    name: str,
    *,
    embedding_size: int | None = 128,
    pretrained: bool = False,
    weights: str | os.PathLike | None = None,
    normalization: str = "l2",
    pooling: str = "avg",
    freeze_bn: bool = False,
    frozen_stages: int = 0,
    in_chans: int | None = None,
    shift_average: int = 0,
    flip_average: bool = False,
    head_init: str = "kaiming",
    **kwargs: Any,
) -> Embedder:
    """Build an :class:`Embedder`: backbone ``name`` + global pooling + linear head + normalisation.

    ``pretrained=True`` uses weights shipped offline (e.g. ``efficientnet_lite0``) or, for any
    backbone, the local file ``weights=PATH`` (a trunk-only or full-embedder state_dict, read
    with ``weights_only=True``; what matched is in ``model.weights_report``). Nothing is ever
    downloaded. ``shift_average=r`` makes eval-mode embeddings the mean over input shifts of up
    to ``r`` pixels and ``flip_average=True`` over the image and its mirror (see :class:`Embedder`).
    ``embedding_size=None`` keeps the backbone's feature size; ``frozen_stages=k`` stops training
    the trunk up to the end of its k-th feature stage (timm backbones; the stem included);
    ``head_init="identity"`` (with that size) starts the head as the identity, so the untrained
    embedding is the pooled pretrained feature itself. Extra ``kwargs`` go to the backbone builder
    (timm's ``create_model`` for timm names).
    """
    validate_params(
        "create_model",
        dict(
            name=name, embedding_size=embedding_size, pretrained=pretrained, weights=weights,
            normalization=normalization, pooling=pooling, freeze_bn=freeze_bn, in_chans=in_chans,
            frozen_stages=frozen_stages,
        ),
        dict(
            name=[InstanceOf((str,))],
            embedding_size=[NONE, Interval(int, 1, None)],
            pretrained=[Options((True, False))],
            weights=[NONE, InstanceOf((str, os.PathLike))],
            normalization=[Options(NORMALIZATIONS)],
            pooling=[Options(POOLINGS)],
            freeze_bn=[Options((True, False))],
            in_chans=[NONE, Interval(int, 1, None)],
            frozen_stages=[Interval(int, 0, None)],
        ),
    )
    offline = pretrained and has_offline_weights(name)
    if pretrained and weights is None and not offline:
        if name not in MODELS:
            _ensure_known(name)
        raise InvalidParameterError(_no_offline_message(name))
    trunk = create_trunk(name, pretrained=offline, in_chans=in_chans, **kwargs)
    if frozen_stages:
        if not hasattr(trunk, "freeze_stages"):
            raise InvalidParameterError(
                f"frozen_stages={frozen_stages}: model {name!r} has no feature stages to freeze (timm backbones do); "
                "use frozen_stages=0.")
        trunk.freeze_stages(frozen_stages)
    embedder = Embedder(
        trunk,
        GlobalPool(pooling),
        make_linear_head(trunk.num_features, embedding_size or trunk.num_features, head_init),
        normalization,
        freeze_bn=freeze_bn,
        shift_average=shift_average,
        flip_average=flip_average,
    )
    embedder.weights_report = getattr(trunk, "offline_weights_report", None)
    if weights is not None:
        from dmlkit.models.weights import load_embedder_weights

        embedder.weights_report = load_embedder_weights(embedder, weights)
    return embedder


def _ensure_known(name: str) -> None:
    from dmlkit.models.timm_trunk import is_timm_model

    if name not in MODELS and not is_timm_model(name):
        raise InvalidParameterError(_unknown_model_message(name))
