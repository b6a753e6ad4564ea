"""Helpers for end-to-end tests: run the real CLI in-process or as a subprocess."""

from __future__ import annotations

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


def run_cli(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m dmlkit ARGS`` in a subprocess (2 threads), returning the completed process."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "dmlkit", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dmlkit {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def quick_args() -> list[str]:
    return list(QUICK)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
