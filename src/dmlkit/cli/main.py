"""``dmlkit`` command line: one module per verb, each exposing ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from dmlkit import __version__
from dmlkit.engine.allocator import tune_cpu_allocator
from dmlkit.engine.timing import process_started
from dmlkit.exceptions import DmlkitError

#: verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "train": ("dmlkit.cli.train", "train a model (default: MNIST-5k zero-shot, Proxy-Anchor) and evaluate it"),
    "validate": ("dmlkit.cli.validate", "check a config (preset, file, overrides) without training"),
    "evaluate": ("dmlkit.cli.evaluate", "re-evaluate a run's selected checkpoint, optionally on another split"),
    "crossval": ("dmlkit.cli.crossval", "the 4-fold protocol: train the fold models, report average ± std and ensemble"),
    "embed": ("dmlkit.cli.embed", "write embeddings of a data set split to .npz/.npy/.parquet with labels and paths"),
    "search": ("dmlkit.cli.search", "nearest neighbours of query images or embeddings in an embedded gallery"),
    "index": ("dmlkit.cli.index", "build, extend and query a saved search index over a gallery (faiss)"),
    "presets": ("dmlkit.cli.presets", "list packaged presets, or show one with its source"),
    "datasets": ("dmlkit.cli.datasets", "list data sets, check a data set folder against published counts, or download one"),
    "report": ("dmlkit.cli.report", "write report.html for a run directory"),
    "compare": ("dmlkit.cli.compare", "write a side-by-side comparison page and table of several runs"),
    "sweep": ("dmlkit.cli.sweep", "hyperparameter search with Optuna on validation MAP@R (resumable)"),
    "export": ("dmlkit.cli.export", "write a run's embedding model as standalone TorchScript or ONNX"),
    "push": ("dmlkit.cli.push", "share a run as a Hugging Face model repository (weights, config, model card)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dmlkit",
        description="Deep metric learning: train, evaluate and compare embedding models fairly.",
        epilog="Run `dmlkit VERB --help` for the options of each verb.",
    )
    parser.add_argument("--version", action="version", version=f"dmlkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module_name, help_text) in VERBS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(verb, help=help_text, description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_parser(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    # a command from the shell (argv None) counts its time budget from the process's start; one called in a
    # running Python process (main([...])) from this call
    started = process_started() if argv is None else time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(argv)
    args._started = started
    if not getattr(args, "verb", None):
        parser.print_help()
        return 2
    tune_cpu_allocator()
    try:
        return _dispatch(args)
    finally:
        from dmlkit.engine.run_dir import release_locks

        release_locks()  # a command run in-process lets the next one claim its folder


def _dispatch(args: argparse.Namespace) -> int:
    """Run the verb; a DmlkitError (or a full disk) is a message and exit code 2, Ctrl-C exit code 130."""
    try:
        return int(args._run(args) or 0)
    except DmlkitError as exc:
        print(f"dmlkit {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a write that is not atomic (a report, TensorBoard events) found the disk full
        from dmlkit.engine.checkpoint import raise_if_out_of_space

        try:
            raise_if_out_of_space(exc, exc.filename or "a file of this command")
        except DmlkitError as full:
            print(f"dmlkit {args.verb}: error: {full}", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:
        print(f"dmlkit {args.verb}: interrupted; the last checkpoint is kept (resume with --resume RUN_DIR)", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
