"""``dmlkit.fit``: train a user's own model, loss and data with the engine a config runs.

The objects replace what a config would build; every other field comes from the config sections
given as keyword arguments (``train={"max_steps": 200}``, ``sampler={"batch_size": 32}``,
``seed=1``), then from the recipe, exactly as ``dmlkit train`` fills them. The run directory,
checkpoints, exact resume, validation and selection, the test evaluation and the report are
the config path's (:class:`dmlkit.engine.trainer.Trainer`; docs/python-api.md).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import typing
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from dmlkit.config.schema import RunConfig, config_from_dict, config_to_dict
from dmlkit.core.json_files import read_json
from dmlkit.core.messages import LOGGER_NAME, console
from dmlkit.core.validation import short_repr
from dmlkit.data.user import UserDataset, user_splits
from dmlkit.engine import run_layout as layout
from dmlkit.engine.callbacks import Callback
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.given import GivenObjects
from dmlkit.engine.loggers import flat_params
from dmlkit.engine.run_dir import release_locks
from dmlkit.engine.trainer import TrainResult
from dmlkit.exceptions import ConfigError, RecordError
from dmlkit.launch import launch


def object_name(component: object) -> str:
    """``object:module.Class``: how a run's config names a component passed as an object."""
    kind = type(component)
    return f"object:{kind.__module__}.{kind.__qualname__}"


@torch.no_grad()
def embedding_size_of(model: nn.Module, dataset) -> int:
    """The width ``D`` of ``model``'s embedding of the first training image (eval mode, no gradient)."""
    was_training = model.training
    model.eval()
    try:
        out = model(dataset[0][0].unsqueeze(0))
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        raise ConfigError(f"The model must map images [B, C, H, W] to embeddings [B, D]; {type(model).__name__} "
                          f"returned {getattr(out, 'shape', type(out).__name__)} for one image.")
    return int(out.shape[1])


def check_sections(config: Any, sections: dict) -> None:
    """A ConfigError naming every ``fit`` argument that is not what it must be: ``config`` a dict of sections, and
    each section of the config (``model``, ``data``, ``train``...) a dict of its settings."""
    if config is not None and not isinstance(config, dict):
        raise ConfigError(f"config must be a dict of config sections (config={{'train': {{'max_steps': 100}}}}). "
                          f"Got {short_repr(config)} ({type(config).__name__}).")
    hints = typing.get_type_hints(RunConfig)
    problems = [f"the config section {key!r} must be a dict of its settings ({key}={{...}}, as in a config file). "
                f"Got {short_repr(value)} ({type(value).__name__})."
                for key, value in {**(config or {}), **sections}.items()
                if dataclasses.is_dataclass(hints.get(key)) and value is not None and not isinstance(value, dict)]
    if problems:
        raise ConfigError(problems)


def config_for_objects(model: nn.Module | str, loss: nn.Module | None, splits, sections: dict, *,
                       miner: nn.Module | None = None) -> RunConfig:
    """The run config of a training from objects: ``sections`` (a nested config dict) validated, then the objects named.

    The fields an object makes moot are set so the recipe leaves them alone: a model object means
    one model, no shift averaging and the model's own embedding size; a user's dataset (not one of
    dmlkit's) applies its own transforms, so no batch augmentation.
    """
    data: dict = {key: dict(value) if isinstance(value, dict) else value for key, value in sections.items()}
    for key in ("model", "data", "loss"):
        data[key] = data.get(key) or {}  # absent or None: the section's defaults
    if isinstance(model, str):
        data["model"].setdefault("name", model)
    else:
        data["model"].setdefault("ensemble", 1)
        data["model"].setdefault("shift_average", 0)
        data["model"].setdefault("embedding_size", embedding_size_of(model, splits.train))
    if isinstance(splits.train, UserDataset):
        data["data"].setdefault("augment", "none")
    cfg = config_from_dict(data)
    named = {}  # the objects' names where the sections name none (object:module.Class)
    if not isinstance(model, str):
        named["model"] = replace(cfg.model, name=object_name(model))
    if isinstance(splits.train, UserDataset):
        named["data"] = replace(cfg.data, name=splits.name)
    if loss is not None or miner is not None:
        miner_section = replace(cfg.loss.miner, name=object_name(miner), args={}) if miner is not None else cfg.loss.miner
        named["loss"] = replace(cfg.loss, miner=miner_section,
                                **(dict(name=object_name(loss), args={}) if loss is not None else {}))
    cfg = replace(cfg, **named)
    if "name" not in sections:
        cfg = replace(cfg, name=f"{type(model).__name__ if not isinstance(model, str) else model}-"
                                f"{cfg.loss.name.rsplit('.', 1)[-1]}")
    return cfg


#: What a ``fit`` call asked for, kept in its run directory: a later call resumes only the same request.
REQUEST_FILE = layout.REQUEST_FILE
_PLAIN = (int, float, str, bool, type(None))


def describe_object(component: object | None) -> dict[str, str]:
    """``{"class": ..., "args.NAME": ..., "shapes": ...}``: a component's class, the constructor arguments it kept
    as attributes of the same name (where a class keeps them) and, for a module, its parameters' shapes."""
    if component is None:
        return {"class": "None"}
    out = {"class": f"{type(component).__module__}.{type(component).__qualname__}"}
    try:
        names = [n for n in inspect.signature(type(component).__init__).parameters if n != "self"]
    except (TypeError, ValueError):  # a builtin or C extension's constructor
        names = []
    for name in names:
        value = getattr(component, name, inspect.Parameter.empty)
        if isinstance(value, _PLAIN) or (isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value)):
            out[f"args.{name}"] = repr(value)
    if isinstance(component, nn.Module):
        out["shapes"] = repr([(k, tuple(v.shape)) for k, v in component.state_dict().items()])
    if isinstance(component, torch.optim.Optimizer):
        out.update({f"args.{k}": repr(v) for k, v in sorted(component.defaults.items()) if isinstance(v, _PLAIN + (tuple,))})
    return out


def fit_request(cfg: RunConfig, given: GivenObjects) -> dict[str, str]:
    """Every setting of a ``fit`` call as dotted strings: the config (every section) and the description of each
    object given but the data (``model``, ``loss``, ``miner``, ``optimizer``; ``None`` for one not given)."""
    request = flat_params(config_to_dict(cfg))
    for role in ("model", "loss", "miner", "optimizer"):
        component = getattr(given, role)
        request.update({f"{role}.{key}": value for key, value in describe_object(component).items()})
    return request


def check_same_request(run_dir: Path, request: dict[str, str]) -> None:
    """Resume ``run_dir`` only for the request that started it; else a ConfigError naming the differing settings."""
    path = run_dir / REQUEST_FILE
    if not path.is_file():  # a run of an older dmlkit: the checkpoint's own fingerprint check remains
        return
    try:
        before = read_json(path)
    except (OSError, RecordError):
        before = {}
    changed = sorted(k for k in before.keys() | request.keys() if before.get(k) != request.get(k))
    if not changed:
        return
    shown = "; ".join(f"{k}: {before.get(k, '(not set)')} -> {request.get(k, '(not set)')}" for k in changed[:8])
    more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
    raise ConfigError(f"out={str(run_dir)!r} holds a run started with other settings ({shown}{more}). To resume it, "
                      "call fit with the same settings and objects as before; to start a new run, pass another out=.")


def fit(
    model: nn.Module | str,
    loss: nn.Module | None,
    train_data,
    *,
    val_data=None,
    test_data=None,
    miner: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | dict | None = None,
    out: str | Path,
    callbacks: Iterable[Callback] = (),
    loggers: Iterable[Callback] = (),
    resume: bool | None = None,
    report: bool = True,
    echo: Callable[[str], None] | None = None,
    config: dict | None = None,
    **sections: Any,
) -> TrainResult:
    """Train ``model`` with ``loss`` on ``train_data`` into the run directory ``out``; returns the test result.

    ``model``: an ``nn.Module`` from images ``[B, C, H, W]`` to embeddings ``[B, D]`` (or a model
    name: ``"resnet50"``, ``"small_cnn"``); ``loss`` and ``miner``: dmlkit's or
    pytorch-metric-learning's objects (``loss=None``: the config's ``loss``; a loss's own
    parameters, such as proxies or ArcFace's ``W``, train in the optimiser's loss group);
    ``train_data`` / ``val_data`` / ``test_data``: map-style datasets of ``(image tensor, label)``
    (``val_data=None``: the recipe holds out validation classes of ``train_data``; ``test_data=None``:
    no test evaluation). ``optimizer``: an optimiser over the model's and the loss's parameters
    (default: the config's, with its parameter groups), or a dict: the config's ``optimizer`` section
    (``optimizer={"lr": 3e-4}``). ``callbacks`` and ``loggers`` run at the
    loop's events (:mod:`dmlkit.engine.callbacks`, :mod:`dmlkit.engine.loggers`), after the report
    is written. ``**sections``: config sections as dicts (``train={"max_steps": 100}``); ``config``:
    the same as one nested dict, for every section including ``model`` and ``loss``, whose names
    the objects take (``config={"loss": {"memory": {"memory_size": 1024}}}``). ``resume``:
    continue ``out``'s last checkpoint (``None``: when there is one); give the same objects and
    settings as the interrupted call.
    """
    check_sections(config, sections)
    splits = user_splits(train_data, val_data, test_data)
    sections = {**(config or {}), **sections}
    if isinstance(optimizer, dict):  # settings, not an optimiser: the config's section, merged over `config`'s
        sections["optimizer"] = {**(sections.get("optimizer") or {}), **optimizer}
        optimizer = None
    elif optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer must be a torch.optim.Optimizer or a dict of the config's optimizer settings "
                          f"(optimizer={{'lr': 3e-4}}). Got {type(optimizer).__name__}.")
    cfg = config_for_objects(model, loss, splits, sections, miner=miner)
    run_dir = Path(out)
    if resume is None:
        resume = (run_dir / layout.LAST_CHECKPOINT).exists()
    given = GivenObjects(model=None if isinstance(model, str) else model, loss=loss, miner=miner, data=splits,
                         optimizer=optimizer)
    request = fit_request(cfg, given)
    if resume:
        check_same_request(run_dir, request)
    # the application's logging, or (none configured) the key lines on stderr, as Lightning shows its own
    shown = nullcontext() if echo is not None or logging.getLogger(LOGGER_NAME).hasHandlers() else console(logging.INFO)
    try:
        # the folder is claimed as `dmlkit train --out` claims it: new, or this kind of run being resumed
        with shown, launch(cfg, run_dir, resume=resume, option="out", report=report,
                           callbacks=[*callbacks, *loggers], echo=echo, given=given) as trainer:
            if not resume:
                atomic_write_json(run_dir / REQUEST_FILE, request)
            return trainer.fit()
    finally:
        release_locks()


__all__ = ["check_same_request", "check_sections", "config_for_objects", "describe_object", "embedding_size_of", "fit",
           "fit_request", "object_name"]
