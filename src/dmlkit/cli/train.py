"""``dmlkit train``: train and evaluate one model; ``--resume RUN_DIR`` continues exactly."""

from __future__ import annotations

import argparse
from pathlib import Path

from dmlkit.cli.common import add_config_options, config_from_args, flag_overrides, new_output_dir
from dmlkit.evaluation.metrics import TABLE_KEYS
from dmlkit.exceptions import ConfigError

DEFAULT_PRESET = "mnist-proxy-anchor"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Train an embedding model and evaluate it on the test split.\n\n"
        "With no --preset/--config: the mnist-proxy-anchor preset: MNIST-5k (embedded), zero-shot\n"
        "split (digits 0-4 train, 5-9 test), a small CNN, Proxy-Anchor loss, m-per-class batches\n"
        "(timings in docs/results.md). --set overrides apply on top; --set data.root=DIR alone trains\n"
        "on your own images (DIR/<class>/<image>, data.name=folder); data.name=... with data.root=...\n"
        "trains on another data set. What a preset leaves unset (m, batch size, steps,\n"
        "evaluation schedule, proxy learning rate, augmentation, validation classes, shift-averaged\n"
        "embeddings, ensemble members, bf16 where native) the recipe chooses from the training split,\n"
        "prints, and saves in config.yaml (docs/recipes.md).\n"
        "The run directory gets config.yaml, metrics.json, log.jsonl, checkpoints/, embeddings/\n"
        "and report.html."
    )
    add_config_options(p)
    p.add_argument("--out", metavar="DIR", help="run directory: a new or empty folder, never one holding other "
        "files or another run (default: runs/<timestamp>-<name>; -2, -3... appended when that exists)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue an interrupted run from its last checkpoint (with its saved config, seed and folder; "
        "only --set train.device=... may be added, e.g. to continue a GPU run on another device)",
    )
    p.add_argument("--from-sweep", metavar="SWEEP_DIR", help="rerun the best trial of `dmlkit sweep` (later --set still apply)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="do not write report.html at the end")
    p.add_argument("--dry-run", action="store_true", help="resolve the run (data read, model built, the recipe's "
                   "measurements made) and print every part and what the recipe chose and why, then exit without "
                   "training or writing anything")
    p.add_argument("--list-backbones", action="store_true", help="list backbones whose pretrained weights are here "
                   "(installed package, Hugging Face or torch hub cache) and why the others are not, then exit")


def defer_dynamo_unless_compiling(cfg) -> None:
    """A run that asks for no compilation builds PyTorch's optimisers without importing ``torch._dynamo``
    (``engine/lazy_dynamo.py``: 1-1.5 s of start-up); a capture decided later restores them before compiling."""
    if not cfg.train.compile and cfg.train.step_capture != "compile":
        from dmlkit.engine.lazy_dynamo import defer_dynamo_import

        defer_dynamo_import()


def run(args: argparse.Namespace) -> int:
    from dmlkit.config import load_config
    from dmlkit.engine.resolve import resolve_run
    from dmlkit.engine.run_dir import claim_directory
    from dmlkit.engine.trainer import Trainer, format_metrics_table

    if args.list_backbones:
        return list_backbones()
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"--resume {str(run_dir)!r}: no config.yaml there; not a dmlkit run directory.")
        args.overrides = [*args.overrides, *flag_overrides(args)]
        device_only = all(o.split("=", 1)[0].strip() == "train.device" for o in args.overrides)
        if args.preset or args.config or not device_only or args.from_sweep:
            raise ConfigError(
                "--resume takes the run's saved config.yaml; --preset/--config/--set/--from-sweep cannot be combined "
                "with it (except --device or --set train.device=...)."
            )
        if args.seed is not None or args.out is not None:
            option = "--seed" if args.seed is not None else "--out"
            raise ConfigError(f"--resume continues the run in {str(run_dir)!r} with its own seed and folder; {option} "
                              "cannot be combined with it (start a new run with --out instead).")
        cfg = load_config(path=run_dir / "config.yaml", overrides=args.overrides)
        if args.dry_run:
            raise ConfigError("--dry-run resolves a new run; it cannot be combined with --resume.")
        defer_dynamo_unless_compiling(cfg)
    else:
        if args.from_sweep:
            if args.preset or args.config:
                raise ConfigError("--from-sweep rebuilds the best trial's config; it cannot be combined with --preset/--config.")
            from dmlkit.sweep import best_trial_overrides

            args.overrides = best_trial_overrides(args.from_sweep) + list(args.overrides)
        if not (args.preset or args.config or args.from_sweep):
            args.preset = DEFAULT_PRESET
        cfg = config_from_args(args)
        defer_dynamo_unless_compiling(cfg)
        if args.dry_run:  # the resolved run, printed; no folder made or claimed, nothing trained or written
            print(resolve_run(cfg, echo=lambda _line: None).format())
            return 0
        run_dir = Path(args.out) if args.out else new_output_dir("runs", cfg.name)
    claim = claim_directory(run_dir, "train", resume=bool(args.resume), option="--resume" if args.resume else "--out")
    if args.quiet:
        cfg.train.progress = False
    callbacks = []
    if not args.no_report:  # before the config's trackers, which store the report as an artifact
        try:
            from dmlkit.report import WriteReport

            callbacks.append(WriteReport())
        except ImportError:
            pass
    try:
        # train.time_budget counts from the command's start (cli.main: a shell command's process start, imports included)
        trainer = Trainer(resolve_run(cfg, started=getattr(args, "_started", None)), run_dir, resume=bool(args.resume),
                          callbacks=callbacks)
    except BaseException:
        claim.release()  # nothing was written: the folder is as it was
        raise
    result = trainer.fit()
    if not trainer.dist.is_main:
        return 0
    print()
    print(f"test metrics ({cfg.name}; weights selected on: {result.selected_on}, step {result.best_step} of {result.steps})")
    print(format_metrics_table(result.test_metrics, [k for k in TABLE_KEYS if k in result.test_metrics]))
    if callbacks and callbacks[0].path is not None:
        print(f"report: {callbacks[0].path}")
    print(f"run directory: {run_dir}")
    return 0


def list_backbones() -> int:
    """Print which backbones ``model.pretrained=true`` fills here without the network, and why the others are not."""
    from dmlkit.models.availability import backbone_table
    from dmlkit.models.hub import hf_cache_dir, is_offline, torch_cache_dir

    rows = backbone_table()
    width = max(len(name) for name, _, _ in rows)
    print(f"{'backbone'.ljust(width)}  here  where the weights are, or why not")
    for name, here, why in rows:
        print(f"{name.ljust(width)}  {'yes ' if here else 'no  '}  {why}")
    print(f"\nHugging Face cache: {hf_cache_dir()}; torch hub cache: {torch_cache_dir()}; downloads "
          + ("forbidden (HF_HUB_OFFLINE=1)." if is_offline() else "allowed when a run asks for weights (model.pretrained=true)."))
    print("Photos (model.name=auto) get the largest EfficientNet-Lite with weights here that the time budget affords.")
    return 0
