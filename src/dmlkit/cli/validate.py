"""``dmlkit validate``: check a config (preset, file, overrides) without training."""

from __future__ import annotations

import argparse

from dmlkit.cli.common import add_config_options, config_from_args


def add_parser(p: argparse.ArgumentParser) -> None:
    add_config_options(p)
    p.add_argument("--print", action="store_true", dest="print_config", help="print the resolved config as YAML")


def run(args: argparse.Namespace) -> int:
    from dmlkit.config import dump_config

    cfg = config_from_args(args)
    if args.print_config:
        print(dump_config(cfg), end="")
    else:
        print(f"config OK: {cfg.name}")
    return 0
