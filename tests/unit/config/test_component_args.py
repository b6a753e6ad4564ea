"""Arguments travel with their component and are checked against it (item 3)."""

from __future__ import annotations

import pytest

from dmlkit.config import load_config
from dmlkit.exceptions import ConfigError


def test_a_new_loss_on_the_command_line_drops_the_presets_loss_args(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {name: small_cnn, args: {width: 32}}\n")
    cfg = load_config(preset="mnist-proxy-anchor", path=path,
                      overrides=["loss.name=multi_similarity", "loss.miner.name=multi_similarity"])
    assert cfg.loss.name == "multi_similarity" and cfg.loss.args == {}
    assert cfg.model.args == {"width": 32}  # the model was not renamed: its args stay


def test_args_given_in_the_same_layer_as_the_new_name_are_kept():
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["loss.args.alpha=3", "loss.name=multi_similarity"])
    assert cfg.loss.args == {"alpha": 3}


def test_the_same_name_again_keeps_the_args():
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["loss.name=proxy_anchor"])
    assert cfg.loss.args == {"margin": 0.1, "alpha": 32}


def test_model_args_of_the_default_job_are_checked_against_the_small_cnn_and_refused_for_photos():
    from dmlkit.recipe.rules import DataProfile, resolve_model

    with pytest.raises(ConfigError, match=r"'model\.args\.widht' is not an argument of model 'small_cnn'"):
        load_config(preset="mnist-proxy-anchor", overrides=["model.args.widht=8"])
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["model.args.width=8"])
    photos = DataProfile(num_images=40, num_classes=4, median_per_class=10, min_per_class=10, channels=3, height=300,
                         width=400, in_memory=False, background=(0.5, 0.5, 0.5), kind="photo")
    with pytest.raises(ConfigError, match=r"set model.name=small_cnn to train the small CNN on them, or drop model.args"):
        resolve_model(cfg, photos)


def test_a_new_model_drops_the_previous_models_args(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {name: small_cnn, args: {width: 32}}\n")
    cfg = load_config(preset="mnist-proxy-anchor", path=path, overrides=["model.name=efficientnet_lite0"])
    assert cfg.model.args == {}


def test_a_config_file_layer_renaming_the_miner_drops_the_presets_miner_args(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("loss: {miner: {name: multi_similarity, args: {epsilon: 0.2}}}\n")
    cfg = load_config(path=base, overrides=["loss.miner.name=batch_hard"])
    assert cfg.loss.miner.name == "batch_hard" and cfg.loss.miner.args == {}
    kept = load_config(path=base)
    assert kept.loss.miner.args == {"epsilon": 0.2}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["loss.args.marign=0.1"], r"'loss\.args\.marign' is not an argument of loss 'proxy_anchor'\. "
                                   r"Did you mean 'loss\.args\.margin'\?"),
        (["model.args.widht=8"], r"'model\.args\.widht' is not an argument of model 'small_cnn'\. "
                                 r"Did you mean 'model\.args\.width'\?"),
        (["loss.miner.name=multi_similarity", "loss.miner.args.epsilonn=0.1"],
         r"'loss\.miner\.args\.epsilonn' is not an argument of miner 'multi_similarity'"),
        (["loss.miner.args.epsilon=0.1"], r"loss\.miner\.args are given but loss\.miner\.name is not set"),
        (["loss.args.alpha=0"], r"loss\.args\.alpha: The 'alpha' parameter of ProxyAnchorLoss must be a float > 0"),
    ],
)
def test_args_that_do_not_fit_the_component_are_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(preset="mnist-proxy-anchor", overrides=overrides)


def test_a_refused_loss_name_does_not_also_blame_its_args():
    with pytest.raises(ConfigError) as info:
        load_config(preset="mnist-proxy-anchor", overrides=["loss.name=proxy_anchr"])
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith("loss.name must be")


def test_distance_and_nested_loss_specifications_are_accepted():
    cfg = load_config(overrides=["loss.name=proxy_pair", "loss.args.pair_loss={name: contrastive}",
                                 "loss.miner.name=batch_hard", "loss.miner.args.distance=euclidean"])
    assert cfg.loss.miner.args == {"distance": "euclidean"}
