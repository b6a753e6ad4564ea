"""Helpers for end-to-end tests: run the real CLI in-process or as a subprocess."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

QUICK = [
    "--quiet",
    "--no-progress",
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


class LocalHub:
    """``huggingface_hub`` as far as :mod:`dmlkit.sharing` uses it, with repositories as folders under ``root``:
    ``HfApi.create_repo`` / ``upload_folder`` for a push, ``snapshot_download`` for a load; no network."""

    def __init__(self, root: Path, fail: bool = False):
        self.root, self.fail, self.created = root, fail, []

    def module(self) -> types.SimpleNamespace:
        hub = self

        class HfApi:
            def __init__(self, token=None):
                self.token = token

            def create_repo(self, repo_id, repo_type="model", private=False, exist_ok=False):
                if hub.fail:
                    raise ConnectionError("no route to host")
                hub.created.append((repo_id, private))
                (hub.root / repo_id).mkdir(parents=True, exist_ok=exist_ok)

            def upload_folder(self, folder_path, repo_id, repo_type="model", commit_message=""):
                shutil.copytree(folder_path, hub.root / repo_id, dirs_exist_ok=True)
                (hub.root / repo_id / ".commit").write_text(commit_message)

        def snapshot_download(repo_id, revision=None, token=None, repo_type="model"):
            path = hub.root / repo_id
            if not path.is_dir():
                raise FileNotFoundError(f"404 Repository Not Found for {repo_id}")
            return str(path)

        return types.SimpleNamespace(HfApi=HfApi, snapshot_download=snapshot_download)


@pytest.fixture
def local_hub(tmp_path, monkeypatch) -> LocalHub:
    """A :class:`LocalHub` under ``tmp_path / "hub"`` standing in for the Hugging Face Hub in dmlkit."""
    from dmlkit import sharing

    hub = LocalHub(tmp_path / "hub")
    monkeypatch.setattr(sharing, "_hub", hub.module)
    return hub
