"""``dmlkit validate``: check a config (preset, file, overrides) and its data root without training."""

from __future__ import annotations

import argparse

from dmlkit.cli.common import add_config_options, config_from_args


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Check a config without training: every field, the args of the loss, miner and model (a timm\n"
        "model is built once to check them), and that data.root holds the data set's layout.\n"
        "Exit code 2 with every problem listed when something is wrong."
    )
    add_config_options(p)
    p.add_argument("--print", action="store_true", dest="print_config", help="print the resolved config as YAML")


def run(args: argparse.Namespace) -> int:
    from dmlkit.config import dump_config
    from dmlkit.data.info import root_problems
    from dmlkit.exceptions import ConfigError

    cfg = config_from_args(args)
    problems = root_problems(cfg.data.name, cfg.data.root, cfg.data.label)
    problems += _timm_args_problems(cfg)
    if problems:
        raise ConfigError(problems)
    if args.print_config:
        print(dump_config(cfg), end="")
    else:
        print(f"config OK: {cfg.name}")
    return 0


def _timm_args_problems(cfg) -> list[str]:
    """``model.args`` of a timm model: timm alone knows its keyword arguments, so the model is built once."""
    from dmlkit.models import MODELS

    if not cfg.model.args or cfg.model.name in MODELS:
        return []
    from dmlkit.engine.builders import build_model
    from dmlkit.exceptions import DmlkitError

    try:
        build_model(cfg)
    except DmlkitError as err:
        return [str(err)]
    return []
