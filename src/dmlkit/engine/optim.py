"""Optimisers with parameter groups, learning-rate schedules and warm-up.

Groups: the trunk at ``lr``, the embedding head at ``lr * head_lr_multiplier`` (1 unless a
pretrained backbone fine-tunes under a new head), and the loss's own parameters (proxies,
learnable margins) at the head's rate ``* loss_lr_multiplier`` (x100 in Proxy-Anchor and the ASAP
comparisons).
During ``warmup_steps`` the trunk's learning rate is 0: only the head and the loss train.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
from torch import nn

from dmlkit.config.schema import OptimizerConfig


def _params(module_params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    return [p for p in module_params if p.requires_grad]


def parameter_groups(model: nn.Module, loss: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """``[trunk, head, loss]`` groups (empty ones dropped), each tagged with a ``name``."""
    if hasattr(model, "trunk_parameters") and hasattr(model, "head_parameters"):
        trunk = _params(model.trunk_parameters())
        head = _params(model.head_parameters())
    else:
        trunk, head = [], _params(model.parameters())
    head_lr = cfg.lr * (cfg.head_lr_multiplier or 1.0)
    groups = [
        {"name": "trunk", "params": trunk, "lr": cfg.lr},
        {"name": "head", "params": head, "lr": head_lr},
        {"name": "loss", "params": _params(loss.parameters()), "lr": head_lr * cfg.loss_lr_multiplier},
    ]
    return [g for g in groups if g["params"]]


#: Devices with PyTorch's fused Adam/AdamW kernels.
FUSED_DEVICES = ("cuda", "cpu")


def fused_capable(groups: list[dict]) -> bool:
    """Whether every parameter of ``groups`` is a floating-point tensor on one device type of :data:`FUSED_DEVICES`."""
    params = [p for g in groups for p in g["params"]]
    types = {p.device.type for p in params}
    return len(types) == 1 and types <= set(FUSED_DEVICES) and all(p.is_floating_point() for p in params)


def build_optimizer(model: nn.Module, loss: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """Adam, AdamW, RMSprop or SGD over :func:`parameter_groups`.

    Adam and AdamW take PyTorch's fused kernels when every parameter is a floating-point tensor on a
    CUDA device or the CPU (one kernel per parameter instead of several passes over each list; the
    same update rule). On a CPU that is a third of the foreach step's time for the small models
    trained from scratch (0.36 against 0.92 ms for three glyph ensemble members,
    ``benchmarks/bench_optimizer_step.py``); on a GPU it also skips a non-finite update by itself
    (``found_inf``), so the step needs no host read there (``training/step_checks.py``).
    """
    groups = parameter_groups(model, loss, cfg)
    wd = cfg.weight_decay
    adam = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": wd}
    if cfg.name in ("adam", "adamw") and fused_capable(groups):
        adam["fused"] = True
    if cfg.name == "adam":
        return torch.optim.Adam(groups, **adam)
    if cfg.name == "adamw":
        return torch.optim.AdamW(groups, **adam)
    if cfg.name == "rmsprop":
        return torch.optim.RMSprop(groups, lr=cfg.lr, eps=cfg.eps, momentum=cfg.momentum, weight_decay=wd)
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=wd)
    raise ValueError(f"optimizer.name must be one of adam, adamw, rmsprop, sgd. Got {cfg.name!r}.")


#: Optimiser and schedule names (``optimizer.name``, ``optimizer.scheduler``).
OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
SCHEDULERS = ("none", "step", "cosine", "wsd")


def _cosine(done: float) -> float:
    """Half a cosine from 1 at ``done`` = 0 to 0 at ``done`` = 1."""
    return 0.5 * (1.0 + math.cos(math.pi * min(max(done, 0.0), 1.0)))


def schedule_factor(cfg: OptimizerConfig, step: int, max_steps: int) -> float:
    """Multiplier of the base learning rate at ``step`` of a ``max_steps`` horizon.

    ``step``: ``gamma`` every ``step_size`` steps. ``cosine``: half a cosine over the horizon. ``wsd``
    (warmup-stable-decay; Hu et al., "MiniCPM", 2024): the rate holds, then half a cosine over the
    horizon's last ``decay_fraction``, so a horizon cut short (a time budget on a loaded machine) keeps
    its full rate for most of its steps instead of a cosine compressed into fewer. ``none``: constant.
    """
    if cfg.scheduler is None:
        raise ValueError("optimizer.scheduler is unset: one of " + ", ".join(SCHEDULERS)
                         + " (dmlkit's recipe chooses it when it plans the run).")
    horizon = max(max_steps, 1)
    if cfg.scheduler == "step":
        return cfg.gamma ** (step // cfg.step_size)
    if cfg.scheduler == "cosine":
        return _cosine(min(step, max_steps) / horizon)  # a horizon of 0 steps: no decay, as before
    if cfg.scheduler == "wsd":
        decay = cfg.decay_fraction * horizon
        return _cosine((step - (horizon - decay)) / decay)
    return 1.0


class HorizonLR(torch.optim.lr_scheduler.LambdaLR):
    """A per-group LambdaLR whose horizon (the steps a cosine decays over) is ``horizon()``, read at every step.

    The trainer points it at its schedule (:meth:`follow`), which a run planned to its time budget
    (:mod:`dmlkit.recipe.budget_planner`) re-plans while it trains. The horizon is not part of the state: a
    checkpoint holds what LambdaLR's holds, and a resumed trainer points it at its restored schedule.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: OptimizerConfig, horizon: Callable[[], int]):
        self.horizon = horizon

        def trunk(step: int) -> float:
            return 0.0 if step < cfg.warmup_steps else schedule_factor(cfg, step, self.horizon())

        def other(step: int) -> float:
            return schedule_factor(cfg, step, self.horizon())

        super().__init__(optimizer, [trunk if g.get("name") == "trunk" else other for g in optimizer.param_groups])

    def follow(self, horizon: Callable[[], int]) -> None:
        """Read the horizon from ``horizon()`` from the next step on."""
        self.horizon = horizon

    def state_dict(self) -> dict:
        state = super().state_dict()
        del state["horizon"]
        return state


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimizerConfig, max_steps: int | Callable[[], int]
) -> HorizonLR:
    """Per-group LambdaLR: schedule factor, and a zero trunk rate during warm-up.

    ``max_steps`` (a count, or a callable read at every step) is the decay's horizon until the trainer
    points it at its schedule (:meth:`HorizonLR.follow`).
    """
    return HorizonLR(optimizer, cfg, max_steps if callable(max_steps) else (lambda: max_steps))
