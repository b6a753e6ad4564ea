"""``dmlkit validate``: check a config (preset, file, overrides) and its data root without training."""

from __future__ import annotations

import argparse

from dmlkit.cli.common import add_config_options, config_from_args


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Check a config without training, exactly as `dmlkit train` would read it (with no --preset or\n"
        "--config: the mnist-proxy-anchor preset, as train): every field, the model name, the args of the\n"
        "loss, miner and model (a timm model is built once to check them), and that data.root holds the\n"
        "data set's layout. Exit code 2 with every problem listed when something is wrong."
    )
    add_config_options(p)
    p.add_argument("--print", action="store_true", dest="print_config", help="print the resolved config as YAML")


def run(args: argparse.Namespace) -> int:
    from dmlkit.cli.train import DEFAULT_PRESET
    from dmlkit.config import dump_config
    from dmlkit.data.info import root_problems
    from dmlkit.exceptions import ConfigError

    if not (args.preset or args.config):  # exactly what `dmlkit train` runs with the same options
        args.preset = DEFAULT_PRESET
    cfg = config_from_args(args)
    problems = [] if _will_download(cfg) else root_problems(cfg.data.name, cfg.data.root, cfg.data.label)
    problems += _model_name_problems(cfg) or _timm_args_problems(cfg)
    if problems:
        raise ConfigError(problems)
    if args.print_config:
        print(dump_config(cfg), end="")
    else:
        where = f" at {cfg.data.root}" if cfg.data.root else ""
        print(f"config OK: {cfg.name} (data {cfg.data.name}{where}, model {cfg.model.name}, loss {cfg.loss.name})")
    return 0


def _will_download(cfg) -> bool:
    """``data.download=true`` for a downloadable data set with a root: `train` fetches it, so a missing copy is fine."""
    from dmlkit.data.sources import DOWNLOADS

    d = cfg.data
    return bool(d.download and d.root and d.name in DOWNLOADS and DOWNLOADS.get(d.name).archives)


def _model_name_problems(cfg) -> list[str]:
    """``model.name``: a dmlkit model, a timm model, or ``auto`` (the recipe chooses); as ``train`` checks it."""
    from dmlkit.models import MODELS
    from dmlkit.models._factory import _unknown_model_message
    from dmlkit.models.timm_trunk import is_timm_model

    name = cfg.model.name
    if name == "auto" or name in MODELS or is_timm_model(name):
        return []
    return [f"model.name: {_unknown_model_message(name)}"]


def _timm_args_problems(cfg) -> list[str]:
    """``model.args`` of a timm model: timm alone knows its keyword arguments, so the model is built once."""
    from dmlkit.models import MODELS

    if not cfg.model.args or cfg.model.name in MODELS:
        return []
    from dmlkit.models._factory import create_trunk

    try:  # the trunk alone, without weights: the fields the recipe resolves later do not matter here
        create_trunk(cfg.model.name, pretrained=False, **cfg.model.args)
    except TypeError as exc:
        return [f"model.args {cfg.model.args} do not fit model {cfg.model.name!r} (passed on to timm): {exc}"]
    return []
