"""What the engine minimises: a loss with its optional miner and cross-batch memory (one per ensemble member), and
its build from the config (``loss.*``: the loss, its miner and memory)."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from dmlkit.config.schema import RunConfig
from dmlkit.exceptions import ConfigError
from dmlkit.models.ensemble import split_embeddings


def is_dmlkit(component: nn.Module | None) -> bool:
    """Whether ``component`` is one of dmlkit's own classes (else pytorch-metric-learning's, or PML-style)."""
    return component is not None and type(component).__module__.startswith("dmlkit.")


class TrainingObjective(nn.Module):
    """Loss + optional miner + optional cross-batch memory, called as ``objective(emb, labels)``.

    ``loss`` and ``miner`` are dmlkit's or pytorch-metric-learning's (any object with PML's calls:
    ``miner(embeddings, labels) -> indices_tuple``, ``loss(embeddings, labels, indices_tuple)``).
    dmlkit's miners hand dmlkit's losses their selection directly; across the two libraries the
    selection travels as PML's index tuple. A PML loss gets fp32 embeddings with autocast off, as
    dmlkit's losses do to themselves.
    """

    def __init__(self, loss: nn.Module, miner: nn.Module | None = None, memory: nn.Module | None = None):
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.memory = memory
        native_miner = miner is None or is_dmlkit(miner)
        # a dmlkit miner called PML's way, kept out of the module tree (it holds ``miner`` again)
        self.__dict__["_indices_miner"] = miner.as_pml() if miner is not None and native_miner else miner
        self._native = (is_dmlkit(loss), native_miner)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        native_loss, native_miner = self._native
        # fp16/bf16 embeddings (autocast) reach every loss as fp32, so the loss is fp32: a loss returns its
        # input's dtype (PML's contract), and an fp16 loss would overflow when GradScaler scales it. dmlkit's
        # losses accumulate in fp32 anyway, so the value and the gradient are the same as from the half batch.
        if embeddings.dtype in (torch.float16, torch.bfloat16):
            embeddings = embeddings.float()
        if self.memory is not None:
            return self.memory(embeddings, labels)
        if not native_loss:
            with torch.autocast(embeddings.device.type, enabled=False):
                embeddings = embeddings.float()
                indices = None if self.miner is None else self._indices_miner(embeddings, labels)
                return self.loss(embeddings, labels, indices)
        if self.miner is None:
            return self.loss(embeddings, labels)
        if native_miner:
            return self.loss(embeddings, labels, pairs=self.miner(embeddings, labels))
        return self.loss(embeddings, labels, indices_tuple=self.miner(embeddings, labels))

    @property
    def proxies(self) -> torch.Tensor | None:
        return getattr(self.loss, "proxies", None)


class EnsembleObjective(nn.Module):
    """One :class:`TrainingObjective` per member of an ``EmbedderEnsemble``; their losses add up.

    ``objective(ensemble_embeddings, labels)`` splits the ensemble's embedding into the members'
    own (``sizes`` columns each, rescaled by ``sqrt(N)`` back to the member's norm) and applies
    member ``i``'s loss, miner and memory to part ``i`` alone: each member learns as if it were
    trained by itself, with its own proxies.

    ``member_labels`` (``protocol.member_folds``): the batch is ``N`` blocks of rows, block ``i`` member
    ``i``'s own batch (``EmbedderEnsemble.member_batches``); member ``i``'s loss sees block ``i`` of its
    columns, its labels mapped by ``member_labels[i]`` (the run's label ``c`` -> the member's own
    ``0..C_i-1``; its proxies are its training classes only).
    """

    def __init__(self, objectives: list[TrainingObjective], sizes: list[int],
                 member_labels: list[torch.Tensor] | None = None):
        super().__init__()
        if len(objectives) != len(sizes):
            raise ValueError(f"EnsembleObjective got {len(objectives)} objectives for {len(sizes)} members.")
        if member_labels is not None and len(member_labels) != len(sizes):
            raise ValueError(f"EnsembleObjective got {len(member_labels)} label maps for {len(sizes)} members.")
        self.objectives = nn.ModuleList(objectives)
        self.sizes = list(sizes)
        self.member_labels = member_labels is not None
        for i, lookup in enumerate(member_labels or ()):  # buffers: they follow the objective to its device
            self.register_buffer(f"member_labels_{i}", lookup.clone(), persistent=False)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        parts = split_embeddings(embeddings, self.sizes)
        if not self.member_labels:
            return torch.stack([objective(part, labels) for objective, part in zip(self.objectives, parts)]).sum()
        rows = embeddings.shape[0] // len(self.sizes)
        losses = []
        for i, (objective, part) in enumerate(zip(self.objectives, parts)):
            own = getattr(self, f"member_labels_{i}")[labels[i * rows:(i + 1) * rows]]
            losses.append(objective(part[i * rows:(i + 1) * rows], own))
        return torch.stack(losses).sum()


# ----------------------------------------------------------------------------- built from the config


def _resolve_distance(args: dict) -> dict:
    """``distance: euclidean`` (or ``{name, args}``) in loss/miner args becomes a distance object."""
    from dmlkit.distances import DISTANCES

    spec = args.get("distance")
    if isinstance(spec, str):
        args["distance"] = DISTANCES.create(spec)
    elif isinstance(spec, dict):
        if "name" not in spec or not set(spec) <= {"name", "args"}:
            raise ConfigError(f"distance must be a name or a mapping {{name: ..., args: {{...}}}}. Got {spec!r}.")
        args["distance"] = DISTANCES.create(spec["name"], **dict(spec.get("args") or {}))
    return args


def _nested_loss(spec):
    """A loss inside a loss (``ProxyPairLoss(pair_loss=...)``): a name or ``{name, args}``."""
    from dmlkit.losses import LOSSES

    if isinstance(spec, str):
        return LOSSES.create(spec)
    if isinstance(spec, dict) and "name" in spec and set(spec) <= {"name", "args"}:
        return LOSSES.create(spec["name"], **_resolve_distance(dict(spec.get("args") or {})))
    raise ConfigError(
        f"loss.args.pair_loss must be a loss name or a mapping {{name: ..., args: {{...}}}}. Got {spec!r}."
    )


def build_objective(cfg: RunConfig, num_classes: int, *, loss: nn.Module | None = None,
                    miner: nn.Module | None = None, member_folds=None) -> TrainingObjective | EnsembleObjective:
    """Loss from the registry (proxy losses get ``num_classes``/``embedding_size``), miner, memory.

    A ``loss`` or ``miner`` object (dmlkit's or pytorch-metric-learning's) is used instead of the
    config's. With ``model.ensemble=N > 1``: N such objectives, one per member
    (:class:`EnsembleObjective`; config-built losses only); with ``member_folds``
    (:class:`~dmlkit.engine.member_folds.MemberFolds`) each over its member's own training classes.
    """
    size = cfg.model.ensemble or 1
    if size > 1:
        if loss is not None or miner is not None:
            raise ConfigError(f"model.ensemble={size} trains one loss per member; it cannot share one loss or "
                              "miner object. Set model.ensemble=1, or name the loss in the config.")
        if member_folds is not None:
            return EnsembleObjective([build_member_objective(cfg, count) for count in member_folds.class_counts()],
                                     [cfg.model.embedding_size] * size, member_labels=member_folds.label_maps)
        return EnsembleObjective([build_member_objective(cfg, num_classes) for _ in range(size)],
                                 [cfg.model.embedding_size] * size)
    return build_member_objective(cfg, num_classes, loss, miner)


def build_member_objective(cfg: RunConfig, num_classes: int, loss: nn.Module | None = None,
                           miner: nn.Module | None = None) -> TrainingObjective:
    """One model's objective: the loss (the config's, or ``loss``), miner and cross-batch memory; what
    :func:`build_objective` gives each ensemble member (and the glyph plan times with a member's step)."""
    from dmlkit.mining import MINERS

    lc = cfg.loss
    if loss is None:
        loss = _config_loss(cfg, num_classes)
    if miner is None and lc.miner.name:
        miner = MINERS.create(lc.miner.name, **_resolve_distance(dict(lc.miner.args)))
    memory = None
    if lc.memory.memory_size > 0:
        from dmlkit.memory import CrossBatchMemory

        memory = CrossBatchMemory(
            loss,
            embedding_size=cfg.model.embedding_size,
            memory_size=lc.memory.memory_size,
            miner=miner,
            warmup_steps=lc.memory.warmup_steps,
        )
    return TrainingObjective(loss, miner, memory)


def _config_loss(cfg: RunConfig, num_classes: int) -> nn.Module:
    """The loss ``cfg.loss`` names, with the arguments the run and the enabled method add."""
    from dmlkit.losses import LOSSES
    from dmlkit.methods import loss_arguments

    lc = cfg.loss
    factory = LOSSES.get(lc.name)
    args = _resolve_distance(dict(lc.args))
    for key, value in (("num_classes", num_classes), ("embedding_size", cfg.model.embedding_size)):
        if key not in args and key in inspect.signature(factory).parameters:
            args[key] = value
    if "pair_loss" in args:
        args["pair_loss"] = _nested_loss(args["pair_loss"])
    args = loss_arguments(cfg, factory, args)
    try:
        return factory(**args)
    except TypeError as exc:
        raise ConfigError(f"loss.args do not fit loss {lc.name!r}: {exc}") from None
