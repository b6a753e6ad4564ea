"""``dmlkit sweep``: Optuna hyperparameter search on validation MAP@R, resumable from its directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dmlkit.cli.common import add_config_options, add_verbosity_options, config_from_args, new_output_dir


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Search hyperparameters with Optuna. Each trial trains the config (--preset/--config/--set) with\n"
        "the trial's values into DIR/trials/<number> and is scored by its best validation MAP@R; the\n"
        "config must hold out validation data (protocol.fold or protocol.val_fraction), test metrics\n"
        "are never used. The study is DIR/study.db (SQLite): rerun the same command to resume an\n"
        "interrupted sweep (--trials is the total; a trial cut off mid-way continues from its last\n"
        "checkpoint). One process per sweep directory. Trials never evaluate the test split.\n"
        "DIR/sweep.json holds every trial and the best parameters, DIR/report.html plots the score\n"
        "against each parameter. Rerun the best trial with `dmlkit train --from-sweep DIR`."
    )
    add_config_options(p)
    p.add_argument(
        "--param", metavar="SPEC", action="append", default=[], dest="params",
        help="a searched config field: PATH=float:LOW:HIGH[:log], PATH=int:LOW:HIGH[:log] or "
        "PATH=choice:a,b,c, e.g. loss.args.margin=float:0.01:0.5:log (repeatable)",
    )
    p.add_argument("--trials", type=int, default=20, metavar="N", help="total number of trials (default: 20)")
    p.add_argument("--sampler", choices=["tpe", "gp", "random"], default="tpe",
                   help="tpe (default), gp (Gaussian process, for a few continuous parameters) or random")
    p.add_argument("--sampler-seed", type=int, metavar="N", help="seed of the sampler (default: the config seed)")
    p.add_argument("--startup-trials", type=int, default=10, metavar="N",
                   help="random trials before tpe/gp model the scores (default: 10)")
    p.add_argument("--prune", action="store_true",
                   help="stop trials whose validation scores fall below the median of earlier trials")
    p.add_argument("--out", metavar="DIR", help="sweep directory: a new or empty folder, or this sweep's own to "
        "resume it (default: sweeps/<timestamp>-<name>; -2, -3... appended when that exists)")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    add_verbosity_options(p, progress=False)


def run(args: argparse.Namespace) -> int:
    from dmlkit.engine.run_dir import claim_directory
    from dmlkit.exceptions import DmlkitError
    from dmlkit.sweep import parse_param, run_sweep, write_sweep_report

    specs = [parse_param(text) for text in args.params]
    cfg = config_from_args(args)
    out = Path(args.out) if args.out else new_output_dir("sweeps", cfg.name)
    claim = claim_directory(out, "sweep", resume=True)  # rerunning the same command resumes its own sweep
    try:
        result = run_sweep(
            cfg, specs, out, trials=args.trials, sampler=args.sampler, seed=args.sampler_seed,
            startup_trials=args.startup_trials, prune=args.prune,
        )
    except DmlkitError:
        claim.release()  # refused before anything was written: the folder is as it was
        raise
    except KeyboardInterrupt:
        print(f"dmlkit sweep: interrupted; rerun the same command (--out {out}) to resume", file=sys.stderr)
        return 130
    print()
    if result.best_params is None:
        print("no trial completed")
    else:
        print(f"best validation MAP@R {result.best_value:.4f} with:")
        for key, value in result.best_params.items():
            print(f"  {key} = {value}")
    if not args.no_report:
        print(f"report: {write_sweep_report(out)}")
    print(f"sweep directory: {out}  (rerun the best trial: dmlkit train --from-sweep {out})")
    return 0
