"""``dmlkit report RUN_DIR``: (re)write the run's self-contained ``report.html``."""

from __future__ import annotations

import argparse


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `dmlkit train`")


def run(args: argparse.Namespace) -> int:
    from dmlkit.report import write_report

    print(write_report(args.run_dir))
    return 0
