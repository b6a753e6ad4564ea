"""``dmlkit`` command line: one module per verb, each exposing ``add_parser`` and ``run``."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import time

from dmlkit import __version__
from dmlkit.cli.common import console_level
from dmlkit.core.messages import console
from dmlkit.exceptions import DmlkitError

# Help (`dmlkit --help`, `dmlkit VERB --help`) builds every verb's parser: the modules of cli/ import torch,
# numpy and the rest of dmlkit inside the functions that run a verb, never at the top (tests/unit/cli/test_cli_startup.py).

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
    parser.verb_parsers = {}  # verb -> its parser, so an unknown option is reported with the verb's usage
    for verb, (module_name, help_text) in VERBS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(verb, help=help_text, description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_parser(p)
        p.set_defaults(_run=module.run)
        parser.verb_parsers[verb] = p
    return parser


def unknown_option_message(unknown: list[str], verb_parser: argparse.ArgumentParser) -> str:
    """``unrecognized arguments: ...`` and, for a verb that reads a config, the ``--set KEY=VALUE`` that was
    probably meant (``--max-steps 3`` -> ``--set train.max_steps=3`` when no flag exists for it)."""
    message = f"unrecognized arguments: {' '.join(unknown)}"
    if not any("--set" in action.option_strings for action in verb_parser._actions):
        return message
    from dmlkit.config.schema import field_paths

    paths = field_paths()
    option = next((u for u in unknown if u.startswith("--")), None)
    if option is None:
        return message + ". Config fields are set with --set KEY=VALUE (e.g. --set train.max_steps=100)."
    name, _, value = option[2:].partition("=")
    name = name.replace("-", "_")
    if not value:
        position = unknown.index(option)
        value = unknown[position + 1] if position + 1 < len(unknown) and not unknown[position + 1].startswith("-") else "VALUE"
    exact = [p for p in paths if p == name or p.endswith(f".{name}")]
    close = exact or [p for p in paths if p.rsplit(".", 1)[-1] in difflib.get_close_matches(
        name, [q.rsplit(".", 1)[-1] for q in paths], n=1, cutoff=0.75)]
    hint = f" Did you mean --set {close[0]}={value}?" if close else ""
    return message + f". Config fields are set with --set KEY=VALUE.{hint}"


def main(argv: list[str] | None = None) -> int:
    # a command from the shell (argv None) counts its time budget from the process's start; one called in a
    # running Python process (main([...])) from this call
    started = None if argv is None else time.perf_counter()
    from dmlkit.engine.openmp import wait_passively  # before anything imports torch: OpenMP reads it then

    wait_passively()
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)  # --help prints and exits here, before torch is imported
    if started is None:
        from dmlkit.engine.timing import process_started  # the process's start, whenever it is read

        started = process_started()
    if unknown:
        verb_parser = parser.verb_parsers.get(getattr(args, "verb", None) or "")
        (verb_parser or parser).error(unknown_option_message(unknown, verb_parser) if verb_parser
                                      else f"unrecognized arguments: {' '.join(unknown)}")
    args._started = started
    if not getattr(args, "verb", None):
        parser.print_help()
        return 2
    from dmlkit.engine.allocator import tune_cpu_allocator  # ctypes: not needed for help

    tune_cpu_allocator()
    try:
        with console(console_level(args)):  # the library's messages: the one place a command shows them
            return _dispatch(args)
    finally:
        from dmlkit.engine.run_dir import release_locks

        release_locks()  # a command run in-process lets the next one claim its folder


def _dispatch(args: argparse.Namespace) -> int:
    """Run the verb; a DmlkitError (or a full disk) is a message and exit code 2, Ctrl-C exit code 130."""
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # `dmlkit presets | head`: the reader has what it wanted; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout at exit: let that write go nowhere
        return 0
    except DmlkitError as exc:
        print(f"dmlkit {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a write that is not atomic (a report, TensorBoard events) found the disk full; a bad path
        from dmlkit.core.paths import path_error
        from dmlkit.engine.checkpoint_files import raise_if_out_of_space

        try:
            raise_if_out_of_space(exc, exc.filename or "a file of this command")
        except DmlkitError as full:
            print(f"dmlkit {args.verb}: error: {full}", file=sys.stderr)
            return 2
        said = path_error(exc)  # a path too long, on a read-only mount, not permitted: the path and why
        if said is not None:
            print(f"dmlkit {args.verb}: error: {said}", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:
        print(f"dmlkit {args.verb}: interrupted; the last checkpoint is kept (resume with --resume RUN_DIR)", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
