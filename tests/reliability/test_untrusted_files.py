"""Untrusted files: checkpoints and weights load with weights_only=True, configs with yaml.safe_load,
manifests stay inside their root unless allowed, and no shell ever sees a user-supplied string."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import dmlkit
from dmlkit.config import load_config, read_yaml
from dmlkit.data import build_splits
from dmlkit.engine.checkpoint_files import load_checkpoint
from dmlkit.exceptions import CheckpointError, ConfigError, DataError
from dmlkit.models.weights import read_state_dict

SOURCE = Path(dmlkit.__file__).resolve().parent


class _TouchOnLoad:
    """Unpickling this object would create ``marker`` (a stand-in for arbitrary code)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _source_calls():
    """Every call in dmlkit's source as (file, dotted callee name, ast.Call)."""
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield path.relative_to(SOURCE), ast.unparse(node.func), node


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


@pytest.mark.parametrize("loader", [load_checkpoint, read_state_dict], ids=["run-checkpoint", "model-weights"])
def test_pickled_code_in_a_checkpoint_is_refused_and_never_runs(tmp_path, loader):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.pt"
    torch.save({"format": "dmlkit-checkpoint-1", "model": {"w": torch.ones(1)}, "x": _TouchOnLoad(marker)}, path)
    with pytest.raises(CheckpointError, match=r"evil\.pt"):
        loader(path)
    assert not marker.exists()


def test_yaml_tags_that_build_python_objects_are_refused(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f"name: !!python/object/apply:pathlib.Path.touch [!!python/object/apply:pathlib.Path ['{marker}']]\n")
    with pytest.raises(ConfigError, match=r"evil\.yaml' is not valid YAML"):
        read_yaml(path)
    tagged = f"!!python/object/apply:pathlib.Path.touch [{marker}]"
    assert load_config(overrides=[f"name={tagged}"]).name == tagged  # an override is read as plain text
    assert not marker.exists()


def _manifest(root: Path, image_path: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rows = ["path,label,split"]
    for i, cls in enumerate("abcd"):
        img = root / f"{cls}.png"
        Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(img)
        rows.append(f"{img.name},{cls},{'train' if cls in 'ab' else 'test'}")
    rows.append(f"{image_path},a,train")
    (root / "manifest.csv").write_text("\n".join(rows) + "\n")
    return root / "manifest.csv"


def test_manifest_cannot_leave_its_root_unless_allowed(tmp_path):
    outside = tmp_path / "outside.png"
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(outside)
    manifest = _manifest(tmp_path / "data", "../outside.png")
    with pytest.raises(DataError, match=r"line 6 of .* points outside the manifest's folder"):
        build_splits("csv", root=manifest)
    splits = build_splits("csv", root=manifest, allow_outside_root=True)
    assert str(tmp_path / "data" / ".." / "outside.png") in splits.train.paths


def test_manifest_symlink_escaping_the_root_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(secret / "key.png")
    root = tmp_path / "data"
    manifest = _manifest(root, "link/key.png")
    (root / "link").symlink_to(secret, target_is_directory=True)
    with pytest.raises(DataError, match=r"points outside the manifest's folder \('link/key\.png'"):
        build_splits("csv", root=manifest)
    absolute = _manifest(tmp_path / "data2", str(secret / "key.png"))
    with pytest.raises(DataError, match=r"points outside the manifest's folder"):
        build_splits("csv", root=absolute)


def test_source_loads_checkpoints_only_with_weights_only():
    loads = [(f, c) for f, name, c in _source_calls() if name == "torch.load"]
    assert loads, "expected torch.load calls in dmlkit"
    for file, call in loads:
        value = _keyword(call, "weights_only")
        assert isinstance(value, ast.Constant) and value.value is True, f"{file}:{call.lineno} torch.load without weights_only=True"


def test_source_reads_yaml_and_arrays_safely():
    for file, name, call in _source_calls():
        assert name not in ("yaml.load", "yaml.unsafe_load", "yaml.full_load", "pickle.load", "pickle.loads"), \
            f"{file}:{call.lineno} uses {name}"
        if name in ("np.load", "numpy.load"):
            value = _keyword(call, "allow_pickle")
            assert value is None or (isinstance(value, ast.Constant) and value.value is False), \
                f"{file}:{call.lineno} np.load with allow_pickle"


def test_source_never_spawns_a_shell():
    for file, name, call in _source_calls():
        assert name not in ("os.system", "os.popen", "eval", "exec", "subprocess.getoutput",
                            "subprocess.getstatusoutput"), f"{file}:{call.lineno} calls {name}"
        if re.fullmatch(r"subprocess\.\w+", name):
            shell = _keyword(call, "shell")
            assert shell is None or (isinstance(shell, ast.Constant) and shell.value is False), \
                f"{file}:{call.lineno} subprocess with shell=True"
            assert call.args and isinstance(call.args[0], (ast.List, ast.Tuple)), \
                f"{file}:{call.lineno} subprocess command must be an argument list"
