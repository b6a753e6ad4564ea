"""A data root without a data set name is the user's folder, never MNIST read silently."""

import pytest
from PIL import Image

from dmlkit.cli.main import main
from dmlkit.config import load_config
from dmlkit.exceptions import ConfigError


def test_a_root_alone_is_a_folder_data_set():
    assert load_config(overrides=["data.root=/photos"]).data.name == "folder"
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["data.root=/photos"])
    assert (cfg.data.name, cfg.data.root, cfg.name) == ("folder", "/photos", "folder-proxy-anchor")


def test_a_root_in_a_config_file_is_a_folder_data_set(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("data:\n  root: /photos\n")
    assert load_config(preset="mnist-proxy-anchor", path=path).data.name == "folder"


def test_a_built_in_data_set_named_with_a_root_is_refused():
    with pytest.raises(ConfigError, match="data.name=mnist is built into dmlkit and reads no files.*data.name=folder"):
        load_config(overrides=["data.name=mnist", "data.root=/photos"])


def test_a_benchmark_keeps_its_root():
    cfg = load_config(overrides=["data.name=cub200", "data.root=/data/CUB_200_2011"])
    assert (cfg.data.name, cfg.data.root) == ("cub200", "/data/CUB_200_2011")


def test_validate_says_which_data_it_checked(tmp_path, capsys):
    for breed in ("a", "b"):
        (tmp_path / breed).mkdir()
        for i in range(2):
            Image.new("RGB", (8, 8)).save(tmp_path / breed / f"{i}.png")
    assert main(["validate", "--set", f"data.root={tmp_path}"]) == 0
    assert f"data folder at {tmp_path}" in capsys.readouterr().out
