"""Fixtures for the reliability tests: a tiny finished run, the real CLI in a subprocess or in-process, snapshots."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

#: A finished run small enough to build in a few seconds (8x8 digits, small CNN, 4 steps).
TINY_RUN_OVERRIDES = [
    "train.max_steps=4",
    "train.checkpoint_every=2",
    "train.eval_every=2",
    "train.log_every=1",
    "train.progress=false",
    "eval.clustering=false",
    "eval.save_embeddings=false",
    "protocol.val_fraction=0.2",
    "sampler.batch_size=16",
    "sampler.m=4",
    "model.embedding_size=16",
    "data.name=digits",
]


def subprocess_env() -> dict[str, str]:
    """One thread per subprocess: deterministic and does not oversubscribe the 2 shared cores."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def run_dmlkit(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m dmlkit ARGS`` in a subprocess; never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "dmlkit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(),
        cwd=cwd,
    )


def run_dmlkit_in_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``dmlkit ARGS`` through :func:`dmlkit.cli.main.main` in this process, as :func:`run_dmlkit` reports it
    (exit code, stdout, stderr) without a process start and its imports (5-10 s each on the loaded machine).

    Run in ``cwd`` (restored afterwards); an exception ``main`` lets through is written to stderr as its
    traceback with exit code 1, as the interpreter would, so "no traceback" is checked the same way."""
    from dmlkit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd or Path.cwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception:  # noqa: BLE001 - what a user would see as a traceback
            traceback.print_exc(file=err)
            code = 1
    return subprocess.CompletedProcess(["dmlkit", *args], int(code or 0), out.getvalue(), err.getvalue())


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes); empty when ``root`` does not exist."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished run directory (config.yaml, checkpoints/last.pt and best.pt, log.jsonl, metrics.json)."""
    from dmlkit.config import load_config
    from dmlkit.recipe import Trainer

    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    Trainer(load_config(overrides=TINY_RUN_OVERRIDES), run_dir, echo=lambda _: None).fit()
    return run_dir


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """A private copy of :func:`tiny_run` that a test may modify."""
    target = tmp_path / "run"
    shutil.copytree(tiny_run, target)
    return target


@pytest.fixture
def dmlkit_cli():
    return run_dmlkit


@pytest.fixture
def dmlkit_in_process():
    return run_dmlkit_in_process


@pytest.fixture
def snap():
    return snapshot
