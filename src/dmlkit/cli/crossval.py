"""``dmlkit crossval``: the 4-fold class-disjoint protocol (ASAP Table 1): average and ensemble."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dmlkit.cli.common import add_config_options, add_verbosity_options, config_from_args, new_output_dir


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Train one model per fold of the training classes (each selected on its held-out fold),\n"
        "embed the test split with each, and report the per-model average ± std and the\n"
        "concatenated-embedding ensemble, for each seed and over seeds. Re-running the same\n"
        "command with the same --out resumes: finished folds are kept, interrupted ones resume."
    )
    add_config_options(p)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds (default: 0)")
    p.add_argument("--folds", type=int, nargs="+", help="fold indices (default: all protocol.num_folds)")
    p.add_argument("--out", metavar="DIR", help="output directory: a new or empty folder, or this "
        "cross-validation's own to resume it (default: runs/<timestamp>-<name>-crossval; -2, -3... appended when "
        "that exists)")
    add_verbosity_options(p)


def run(args: argparse.Namespace) -> int:
    from dmlkit.crossval import format_crossval, run_crossval
    from dmlkit.engine.run_dir import claim_directory
    from dmlkit.exceptions import DmlkitError

    cfg = config_from_args(args)
    if args.no_progress:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, progress=False))
    out = Path(args.out) if args.out else new_output_dir("runs", f"{cfg.name}-crossval")
    claim = claim_directory(out, "crossval", resume=True)  # rerunning the same command resumes its own folds
    try:
        summary = run_crossval(cfg, out, seeds=args.seeds, folds=args.folds)
    except DmlkitError:
        claim.release()  # a fold refused before anything was written leaves the folder as it was
        raise
    print(format_crossval(summary))
    print(f"summary: {out / 'crossval.json'}")
    return 0
