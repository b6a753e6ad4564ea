"""``dmlkit presets``: list the packaged presets, or ``presets show NAME`` to print one."""

from __future__ import annotations

import argparse


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["list", "show"], default="list", help="list (default) or show")
    p.add_argument("name", nargs="?", help="preset name (for show)")


def run(args: argparse.Namespace) -> int:
    from dmlkit.config import list_presets, preset_info
    from dmlkit.exceptions import ConfigError

    if args.action == "show":
        if not args.name:
            raise ConfigError("`dmlkit presets show` needs a preset NAME; `dmlkit presets` lists them.")
        info = preset_info(args.name)
        print(info.text, end="" if info.text.endswith("\n") else "\n")
        return 0
    presets = list_presets()
    width = max((len(p.name) for p in presets), default=0)
    for p in presets:
        print(f"{p.name.ljust(width)}  {p.summary}")
    return 0
