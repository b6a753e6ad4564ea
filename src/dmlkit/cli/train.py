"""``dmlkit train``: train and evaluate one model; ``--resume RUN_DIR`` continues exactly."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from dmlkit.cli.common import add_config_options, add_verbosity_options, config_from_args, flag_overrides, new_output_dir
from dmlkit.core.json_files import read_json
from dmlkit.engine import run_layout as layout
from dmlkit.exceptions import ConfigError, RecordError

if TYPE_CHECKING:
    from dmlkit.config.schema import RunConfig
    from dmlkit.recipe.measurements import Measurements

DEFAULT_PRESET = "mnist-proxy-anchor"


def add_parser(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Train an embedding model and evaluate it on the test split.\n\n"
        "With no --preset/--config: the mnist-proxy-anchor preset: MNIST-5k (embedded), zero-shot\n"
        "split (digits 0-4 train, 5-9 test), a small CNN, Proxy-Anchor loss, m-per-class batches\n"
        "(timings in docs/results.md). --set overrides apply on top; --set data.root=DIR alone trains\n"
        "on your own images (DIR/<class>/<image>, data.name=folder); data.name=... with data.root=...\n"
        "trains on another data set. What a preset leaves unset (m, batch size, steps,\n"
        "evaluation schedule, learning rates and their schedule, augmentation, validation classes,\n"
        "shift-averaged embeddings, ensemble members, bf16 where native) the recipe chooses from the\n"
        "training split and saves in config.yaml, each choice with its reason in resolved.json and\n"
        "train.log (shown with -v; docs/recipes.md).\n"
        "The run directory gets config.yaml, resolved.json, metrics.json, log.jsonl (the metrics),\n"
        "training.json (what training measured and decided), train.log (every message of the run),\n"
        "checkpoints/, embeddings/ and report.html."
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
    p.add_argument("--plan", metavar="RUN", help="replay the plan of an earlier run (its folder, or its training.json or "
                   "resolved.json): its config as asked and the machine's measurements it planned from, so the same "
                   "steps, backbone and choices, on any machine (only --device, --out and the output options may be added)")
    p.add_argument("--replan", action="store_true", help="measure this machine again instead of replaying what an "
                   "earlier run of the same config kept here, and keep the new measurements")
    add_verbosity_options(p)
    p.add_argument("--no-report", action="store_true", help="do not write report.html at the end")
    p.add_argument("--dry-run", action="store_true", help="resolve the run (data read, model built, the recipe's "
                   "measurements made) and print every part and what the recipe chose and why, then exit without "
                   "training or writing a run (the machine's measurements are kept, as a run keeps them)")
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
    from dmlkit.engine.trainer import format_metrics_table
    from dmlkit.evaluation.metrics import TABLE_KEYS
    from dmlkit.launch import dry_run, launch
    from dmlkit.recipe.measurements import Measurements

    if args.list_backbones:
        return list_backbones()
    measurements = None
    if args.plan:
        cfg, measurements = _replayed(args)
        run_dir = Path(args.out) if args.out else new_output_dir("runs", cfg.name)
        if args.dry_run:
            print(dry_run(cfg, echo=lambda _line: None, measurements=measurements).format())
            return 0
    elif args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / layout.CONFIG_FILE).is_file():
            raise ConfigError(f"--resume {str(run_dir)!r}: no {layout.CONFIG_FILE} there; not a dmlkit run directory.")
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
        cfg = load_config(path=run_dir / layout.CONFIG_FILE, overrides=args.overrides)
        measurements = Measurements.live().forgo("a resumed run")  # it plans from its own speeds
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
        if args.dry_run:  # the resolved run, printed; no folder made or claimed, nothing trained: the machine's
            resolved = dry_run(cfg, echo=_progress_only, replan=args.replan,  # measurements are kept
                               started=getattr(args, "_started", None))  # the budget counts from the command
            print(resolved.format())
            print(resolved.measurements.keep())
            return 0
        run_dir = Path(args.out) if args.out else new_output_dir("runs", cfg.name)
    if args.no_progress:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, progress=False))
    # train.time_budget counts from the command's start (cli.main: a shell command's process start, imports included)
    with launch(cfg, run_dir, resume=bool(args.resume), option="--resume" if args.resume else "--out",
                report=not args.no_report, started=getattr(args, "_started", None), measurements=measurements,
                replan=args.replan) as trainer:
        result = trainer.fit()
    if not trainer.dist.is_main:
        return 0
    print()
    print(f"test metrics ({cfg.name}; weights selected on: {result.selected_on}, step {result.best_step} of {result.steps})")
    print(format_metrics_table(result.test_metrics, [k for k in TABLE_KEYS if k in result.test_metrics]))
    print(f"run directory: {run_dir}")
    return 0


def _progress_only(line: str) -> None:
    """A dry run's messages while it plans: what it reads and measures now, and a budget too small to train
    (stderr), so no ten seconds pass in silence; the plan itself is printed whole at the end."""
    if line.startswith(("plan: reading", "plan: measuring", "plan: machine is shared", "plan: the ")):
        print(line, file=sys.stderr, flush=True)


def _replayed(args: argparse.Namespace) -> tuple[RunConfig, Measurements]:
    """``--plan RUN``: the run's config as asked (``--device`` may change it) and its measurements, replayed."""
    from dmlkit.config.loading import parse_override
    from dmlkit.config.schema import config_from_dict
    from dmlkit.recipe.measurements import Measurements

    extra = [*args.overrides, *flag_overrides(args)]
    if args.resume or args.preset or args.config or args.from_sweep or args.replan or args.seed is not None \
            or any(o.split("=", 1)[0].strip() != "train.device" for o in extra):
        raise ConfigError("--plan replays an earlier run's config and measurements as they were; only --device (or "
                          "--set train.device=...), --out and the output options may be added to it. To change the "
                          "run, start from its config: --config RUN/config.yaml.")
    request, measurements = Measurements.from_run(_plan_file(Path(args.plan)))
    for override in extra:  # train.device=VALUE; a key without '=' is a ConfigError saying how to write it
        device = parse_override(override)[1]
        train = request.get("train", {})
        if isinstance(train, dict):  # else config_from_dict says what 'train' must be
            request = {**request, "train": {**train, "device": device}}
    return config_from_dict(request), measurements


def _plan_file(plan: Path) -> Path:
    """What ``--plan RUN`` replays: the run's training record when training kept its measurements there (the time
    budget's included), else ``plan`` itself (a run folder's ``resolved.json``, or the file given)."""
    record = plan / layout.TRAINING_RECORD_FILE
    if plan.is_dir() and record.is_file():
        try:
            if "measurements" in read_json(record):
                return record
        except (OSError, RecordError, TypeError):  # the replay reads it again and says what is wrong
            pass
    return plan


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
