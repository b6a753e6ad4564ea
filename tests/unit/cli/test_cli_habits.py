"""The command line as users type it: flags for the common options, hints for unknown options,
did-you-mean for values, one-name lists, a closed pipe, each action's own help, the unknown model first."""

from __future__ import annotations

import io
import sys

import pytest

from dmlkit.cli.common import config_from_args
from dmlkit.cli.main import build_parser, main
from dmlkit.config import load_config
from dmlkit.exceptions import ConfigError


def test_flags_set_their_config_fields(tmp_path):
    args = build_parser().parse_args(["train", "--max-steps", "3", "--lr", "3e-4", "--batch-size", "32",
                                      "--device", "cpu", "--data-root", str(tmp_path), "--seed", "4"])
    cfg = config_from_args(args)
    assert (cfg.train.max_steps, cfg.optimizer.lr, cfg.sampler.batch_size, cfg.train.device, cfg.seed) == (
        3, 3e-4, 32, "cpu", 4)
    assert (cfg.data.name, cfg.data.root) == ("folder", str(tmp_path))


@pytest.mark.parametrize("verb", ["validate", "crossval", "sweep"])
def test_the_config_verbs_take_the_flags(verb):
    args = build_parser().parse_args([verb, "--max-steps", "5"])
    assert config_from_args(args).train.max_steps == 5


def test_validate_prints_what_the_flags_set(capsys):
    assert main(["validate", "--lr", "1e-3", "--max-steps", "7", "--print"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.001" in out and "max_steps: 7" in out


def test_resume_takes_the_device_flag_only(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    assert main(["train", "--resume", str(tmp_path), "--max-steps", "3"]) == 2
    assert "cannot be combined" in capsys.readouterr().err


@pytest.mark.parametrize("argv, hint", [
    (["train", "--maxsteps=3"], "Did you mean --set train.max_steps=3?"),
    (["train", "--eval-every", "5"], "Did you mean --set train.eval_every=5?"),
    (["validate", "--margin", "0.2"], "Config fields are set with --set KEY=VALUE"),
])
def test_an_unknown_option_hints_at_set(argv, hint, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and hint in err and f"usage: dmlkit {argv[0]}" in err


@pytest.mark.parametrize("override, suggestion", [("loss.name=proxyanchor", "proxy_anchor"),
                                                  ("optimizer.name=ADAM", "adam"),
                                                  ("train.loggers=[mlfow]", "mlflow")])
def test_values_get_a_did_you_mean(override, suggestion):
    with pytest.raises(ConfigError, match=f"Did you mean '{suggestion}'"):
        load_config(overrides=[override])


def test_one_tracker_name_is_a_one_element_list():
    assert load_config(overrides=["train.loggers=mlflow"]).train.loggers == ["mlflow"]


def test_an_unknown_model_is_named_before_the_recipes_arguments():
    from dmlkit.engine.model import build_model

    cfg = load_config(overrides=["model.name=resnet5", "model.args={in_chans: 1}"])
    with pytest.raises(ConfigError) as info:
        build_model(cfg)
    assert str(info.value).startswith("model.name: Unknown model 'resnet5'. Did you mean 'resnet50'")
    assert "in_chans" not in str(info.value)


class ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone (``dmlkit presets | head``): every write raises BrokenPipeError."""

    def __init__(self, fileno: int):
        self._fileno = fileno

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        return self._fileno


def test_a_closed_pipe_ends_quietly(tmp_path, monkeypatch, capsys):
    sink = open(tmp_path / "sink", "w")
    monkeypatch.setattr(sys, "stdout", ClosedPipe(sink.fileno()))
    try:
        assert main(["presets"]) == 0
    finally:
        sink.close()
    assert "Traceback" not in capsys.readouterr().err


def test_datasets_download_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["datasets", "download", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("usage: dmlkit datasets download") and "--mirror" in out
