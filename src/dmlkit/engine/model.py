"""The run's model from its config: ``model.*`` passed on to ``dmlkit.models.create_model``, an ensemble's members
each from its own seed."""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.config.schema import RunConfig
from dmlkit.exceptions import ConfigError, InvalidParameterError


def model_arguments(cfg: RunConfig) -> dict:
    """What :func:`build_model` passes ``dmlkit.models.create_model`` for one model (or ensemble member)."""
    m = cfg.model
    return dict(
        embedding_size=m.embedding_size,
        normalization=m.normalization,
        pooling=m.pooling,
        pretrained=m.pretrained,
        weights=m.weights,
        freeze_bn=m.freeze_bn,
        frozen_stages=m.frozen_stages or 0,
        shift_average=m.shift_average or 0,
        flip_average=bool(m.flip_average),
        head_init=m.head_init or "kaiming",  # the recipe's identity head for a pretrained backbone
        **m.args,
    )


def build_model(cfg: RunConfig, *, first_member: nn.Module | None = None) -> nn.Module:
    """The embedding model named by ``cfg.model`` (``dmlkit.models.create_model``).

    With ``model.ensemble=N > 1`` an :class:`~dmlkit.models.EmbedderEnsemble`: the first member is
    built from the global RNG as a single model would be, member ``i`` from the stream
    ``derive_seed(seed, "ensemble member", i)``. ``first_member`` (a model already built from ``cfg`` as a single
    model) is taken as the first member rather than built again; the global RNG is left as it was.
    """
    from dmlkit.core.seeds import derive_seed
    from dmlkit.models import EmbedderEnsemble, create_model

    m = cfg.model

    def member() -> nn.Module:
        try:
            return create_model(m.name, **model_arguments(cfg))
        except TypeError as exc:  # a timm model's keyword arguments are known only to timm
            if isinstance(exc, InvalidParameterError) and str(exc).startswith("Unknown model"):
                raise ConfigError(f"model.name: {exc}") from None  # the name is at fault, not the recipe's args
            if not m.args:
                raise
            raise ConfigError(f"model.args {m.args} do not fit model {m.name!r} (passed on to timm): {exc}") from None

    size = m.ensemble or 1
    if size == 1:
        return first_member if first_member is not None else member()
    members = [first_member if first_member is not None else member()]
    state = torch.random.get_rng_state()
    for i in range(1, size):
        torch.manual_seed(derive_seed(cfg.seed, "ensemble member", i))
        members.append(member())
    torch.random.set_rng_state(state)  # what comes after the model draws as it would after one member
    return EmbedderEnsemble(members)


__all__ = ["build_model", "model_arguments"]
