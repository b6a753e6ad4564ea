"""``dmlkit datasets``: list the supported data sets, or check a folder (``info NAME --root DIR``)."""

from __future__ import annotations

import argparse
import json


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="?", choices=["list", "info"], default="list", help="list (default) or info")
    p.add_argument("name", nargs="?", help="data set name (for info)")
    p.add_argument("--root", help="folder holding the data set in its official layout (for info)")


def run(args: argparse.Namespace) -> int:
    from dmlkit.data import list_datasets
    from dmlkit.data.info import dataset_info
    from dmlkit.exceptions import ConfigError

    if args.action == "info":
        if not args.name:
            raise ConfigError("`dmlkit datasets info` needs a data set NAME; `dmlkit datasets list` lists them.")
        info = dataset_info(args.name, args.root)
        print(json.dumps(info, indent=2))
        return 0 if info.get("matches_published", True) or not info.get("problems") else 1
    for name in list_datasets():
        print(name)
    return 0
