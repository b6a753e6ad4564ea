"""train.loggers: trackers named in the config, the records and parameters they receive."""

import pytest

from dmlkit.config import load_config
from dmlkit.engine.loggers import (
    MLflowLogger,
    TensorBoardLogger,
    WandbLogger,
    build_loggers,
    flat_params,
    scalars_of,
    wandb_logged_in,
)
from dmlkit.exceptions import ConfigError


def test_records_become_scalars_named_by_split_or_kind():
    record = {"kind": "eval", "split": "val", "step": 8, "time": 1.5, "map_at_r": 0.25, "kept_pretrained": True,
              "note": "text"}
    assert scalars_of(record) == {"val/time": 1.5, "val/map_at_r": 0.25}
    assert scalars_of({"kind": "train", "step": 3, "loss": 2}) == {"train/loss": 2.0}


def test_the_config_becomes_dotted_parameters():
    params = flat_params({"seed": 0, "loss": {"name": "ms", "args": {"alpha": 2.0}, "miner": {"args": {}}}})
    assert params == {"seed": "0", "loss.name": "ms", "loss.args.alpha": "2.0", "loss.miner.args": "{}"}


def test_loggers_named_in_the_config():
    cfg = load_config(overrides=["train.loggers=[mlflow, wandb, tensorboard]", "train.tensorboard=true",
                                 "train.tracking_uri=http://tracking:5000"])
    loggers = build_loggers(cfg)
    assert [type(x) for x in loggers] == [MLflowLogger, WandbLogger, TensorBoardLogger]  # tensorboard once
    assert loggers[0].tracking_uri == "http://tracking:5000"
    assert build_loggers(load_config()) == []


def test_an_unknown_logger_is_a_config_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"train\.loggers.*tensorboard.*mlflow.*wandb"):
        load_config(overrides=["train.loggers=[neptune]"])


def test_wandb_runs_offline_without_credentials(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("NETRC", raising=False)
    assert not wandb_logged_in()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_logged_in()
