"""Options shared by the verbs that build a run configuration."""

from __future__ import annotations

import argparse
import itertools
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from dmlkit.exceptions import ConfigError

if TYPE_CHECKING:
    from dmlkit.config import RunConfig

#: The options every user touches, as flags: ``--flag`` -> the config field it sets (``--lr 3e-4`` is
#: ``--set optimizer.lr=3e-4``); ``(dest, metavar, help)`` in the order they are listed.
CONFIG_FLAGS: dict[str, tuple[str, str, str]] = {
    "--data-root": ("data.root", "DIR", "your images: DIR/<class>/<image> (same as --set data.root=DIR; "
                    "without data.name this is data.name=folder)"),
    "--lr": ("optimizer.lr", "LR", "learning rate of the backbone (same as --set optimizer.lr=LR)"),
    "--batch-size": ("sampler.batch_size", "N", "images per batch (same as --set sampler.batch_size=N)"),
    "--max-steps": ("train.max_steps", "N", "training steps (same as --set train.max_steps=N)"),
    "--device": ("train.device", "DEVICE", "auto, cpu, cuda or cuda:N (same as --set train.device=DEVICE)"),
}


def flag_dest(flag: str) -> str:
    """The argparse attribute of a :data:`CONFIG_FLAGS` flag (``--max-steps`` -> ``max_steps``)."""
    return flag.lstrip("-").replace("-", "_")


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The ``KEY=VALUE`` overrides the :data:`CONFIG_FLAGS` given on the command line stand for."""
    return [f"{key}={getattr(args, flag_dest(flag))}" for flag, (key, _, _) in CONFIG_FLAGS.items()
            if getattr(args, flag_dest(flag), None) is not None]


def add_config_options(p: argparse.ArgumentParser) -> None:
    """``--preset``, ``--config``, ``--set``, ``--seed`` and the :data:`CONFIG_FLAGS`."""
    p.add_argument("--preset", metavar="NAME", help="start from a packaged preset (see `dmlkit presets`)")
    p.add_argument("--config", metavar="FILE", help="YAML config file, applied after the preset")
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override any config field by its dotted path, e.g. --set optimizer.lr=3e-4 "
        "--set loss.args.margin=0.2 (repeatable; values are read as YAML)",
    )
    p.add_argument("--seed", type=int, help="random seed (same as --set seed=N)")
    for flag, (_, metavar, help_text) in CONFIG_FLAGS.items():
        p.add_argument(flag, metavar=metavar, help=help_text)


def add_verbosity_options(p: argparse.ArgumentParser, *, progress: bool = True) -> None:
    """``-v/--verbose`` and ``--quiet`` (how much of the run's messages the console shows; :func:`console_level`)
    and, with ``progress``, ``--no-progress``."""
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("-v", "--verbose", action="store_true", help="also show every choice of the recipe with its "
                       "reason (always in the run's train.log and resolved.json)")
    shown.add_argument("--quiet", action="store_true", help="show only the progress bar, the final metrics and where "
                       "they were written (and warnings)")
    if progress:
        p.add_argument("--no-progress", action="store_true", help="no progress bar (for scripts and logs; same as "
                       "--set train.progress=false)")


def console_level(args: argparse.Namespace) -> int:
    """The level of the messages a command shows: DEBUG with ``-v``, WARNING with ``--quiet``, else INFO."""
    import logging

    if getattr(args, "verbose", False):
        return logging.DEBUG
    return logging.WARNING if getattr(args, "quiet", False) else logging.INFO


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Preset, then file, then ``--set`` overrides, then the flags and ``--seed``; validated at once."""
    overrides = [*args.overrides, *flag_overrides(args)]
    if getattr(args, "seed", None) is not None:
        overrides.append(f"seed={args.seed}")
    from dmlkit.config import load_config

    return load_config(preset=args.preset, path=args.config, overrides=overrides)


def require_split(splits, name: str, cfg: RunConfig):
    """The split ``name`` of ``splits``, or a ConfigError saying why this run has none."""
    dataset = getattr(splits, name, None)
    if dataset is not None:
        return dataset
    if name == "val":
        raise ConfigError(
            f"this run has no validation split (data set {cfg.data.name!r}: protocol.fold is unset and "
            "protocol.val_fraction and protocol.val_class_fraction are not set). Use --split test or --split train, "
            "or --set protocol.fold=N (or protocol.val_fraction / protocol.val_class_fraction) to cut one."
        )
    raise ConfigError(f"split {name!r} does not exist for data set {cfg.data.name!r} "
                      f"(it has {', '.join(n for n, _ in splits.items())}).")


def _timestamped_paths(parent: str | Path, name: str, suffix: str = "") -> Iterator[Path]:
    """``parent/<YYYYmmdd-HHMMSS>-<name><suffix>``, then the same with ``-2``, ``-3``... before ``suffix``."""
    name = re.sub(r"[\\/\x00]+", "-", name)  # a name like exp/one stays one folder: exp-one
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    yield Path(parent) / f"{stem}{suffix}"
    for n in itertools.count(2):
        yield Path(parent) / f"{stem}-{n}{suffix}"


def new_output_dir(parent: str | Path, name: str) -> Path:
    """``parent/<YYYYmmdd-HHMMSS>-<name>``, created here, for a command's default ``--out``.

    Creating it claims it: a second command started in the same second (one after the other, or in
    parallel) gets ``...-<name>-2``, then ``-3``, instead of finding the first one's run there.
    """
    from dmlkit.core.validation import short_repr  # imports torch: not for --help

    try:
        Path(parent).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create the folder {short_repr(str(parent))} for runs ({err.strerror or err}); "
                          "choose the folder with --out DIR.") from None
    for path in _timestamped_paths(parent, name):
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as err:  # a name too long, a read-only folder: said with the folder, not a traceback
            raise ConfigError(f"cannot create the run folder {short_repr(str(path))} ({err.strerror or err}); "
                              "choose the folder with --out DIR.") from None


def new_output_file(parent: str | Path, name: str, suffix: str) -> Path:
    """``parent/<YYYYmmdd-HHMMSS>-<name><suffix>`` that does not exist yet (``-2``, ``-3``... appended
    before ``suffix`` when it does), so a result written in the same second never replaces another."""
    return next(path for path in _timestamped_paths(parent, name, suffix) if not path.exists())


def check_output_file(path: str | Path, option: str, *, replaceable: Callable[[Path], bool] = lambda p: False,
                      what: str = "a file this command wrote") -> Path:
    """``path`` as a file this command may write: a ConfigError when it names a folder, when its folder
    is a file, or when it exists and ``replaceable`` says it is not ``what`` (so the user's file is kept)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is a folder; {option} names the file to write (e.g. "
                          f"{str(path / 'NAME')!r}).")
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{option} {str(path)!r}: {str(parent)!r} is a file, not a folder.")
    if path.exists() and not replaceable(path):
        raise ConfigError(f"{option} {str(path)!r} already exists and is not {what}; it is left as it is. "
                          f"Choose another {option} (or remove the file).")
    return path
