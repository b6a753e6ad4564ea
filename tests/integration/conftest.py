"""Helpers for end-to-end tests: run the real CLI in-process or as a subprocess."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

QUICK = [
    "--quiet",
    "--set", "train.max_steps=30",
    "--set", "train.log_every=5",
    "--set", "train.checkpoint_every=10",
    "--set", "eval.clustering=false",
]


SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    """Import ``scripts/<name>.py`` as module ``name`` (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m dmlkit ARGS`` in a subprocess (2 threads), returning the completed process."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "dmlkit", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dmlkit {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def script_loader():
    """:func:`load_script`, for tests of ``scripts/``."""
    return load_script


@pytest.fixture
def quick_args() -> list[str]:
    return list(QUICK)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
