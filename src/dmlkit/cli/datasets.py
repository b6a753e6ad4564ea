"""``dmlkit datasets``: list the supported data sets, check a folder (``info NAME --root DIR``), or fetch one
(``download NAME --root DIR``)."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", metavar="ACTION",
                               help="list (default), info (check a copy's counts) or download (fetch, verify, extract, check)")
    p.set_defaults(action="list")
    actions.add_parser("list", help="list the data sets dmlkit reads", description="List the data sets dmlkit reads.")
    for action, text in (("info", "check a copy of a data set in its official layout against the published counts"),
                         ("download", "fetch a data set into --root: terms printed, checksums verified, counts checked")):
        sub = actions.add_parser(action, help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument("name", nargs="?", help="data set name (cub200, cars196, sop, inshop)")
        sub.add_argument("--root", help="folder holding the data set in its official layout" if action == "info"
                         else "folder to put the data set in")
    download = actions.choices["download"]
    download.add_argument("--yes", "-y", action="store_true",
                          help="accept the printed terms of use without asking (without a terminal the terms are "
                               "printed and the download proceeds, as pytorch-metric-learning does)")
    download.add_argument("--mirror", metavar="URL",
                          help="a URL folder tried first for every file (the published checksums still apply)")
    download.add_argument("--keep-archives", action="store_true", help="keep the archives after extraction")


def _ask() -> bool:
    """Ask on the terminal whether the printed terms are accepted."""
    answer = input("Accept these terms and download? [y/N] ").strip().lower()
    return answer in ("y", "yes")


def _proceed() -> bool:
    """Without a terminal: say that the printed terms are taken as accepted, and go on."""
    print("stdin is not a terminal: proceeding without asking, as pytorch-metric-learning does "
          "(--yes says so explicitly).")
    return True


def run(args: argparse.Namespace) -> int:
    from dmlkit.data import list_datasets
    from dmlkit.data.info import dataset_info
    from dmlkit.exceptions import ConfigError

    if args.action in ("info", "download") and not getattr(args, "name", None):
        raise ConfigError(f"`dmlkit datasets {args.action}` needs a data set NAME; `dmlkit datasets list` lists them.")
    if args.action == "download":
        from dmlkit.data.download import download_dataset

        if not args.root:
            raise ConfigError("`dmlkit datasets download` needs --root DIR, the folder to put the data set in.")
        confirm = None if args.yes else _ask if sys.stdin.isatty() else _proceed
        info = download_dataset(args.name, args.root, confirm=confirm, mirror=args.mirror,
                                keep_archives=args.keep_archives)
        print(json.dumps(info["splits"], indent=2))
        return 0
    if args.action == "info":
        info = dataset_info(args.name, args.root)
        print(json.dumps(info, indent=2))
        return 0 if info.get("matches_published", True) or not info.get("problems") else 1
    for name in list_datasets():
        print(name)
    return 0
