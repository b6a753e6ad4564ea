"""Config schema: defaults, overrides, and every problem reported at once with did-you-mean."""

import pytest

from dmlkit.config import apply_overrides, config_from_dict, field_paths, load_config, parse_override
from dmlkit.exceptions import ConfigError


def test_defaults_are_the_main_job():
    cfg = config_from_dict({})
    assert (cfg.data.name, cfg.loss.name, cfg.model.name, cfg.sampler.name) == (
        "mnist", "proxy_anchor", "small_cnn", "m_per_class")


def test_overrides_reach_nested_fields_and_dict_args():
    cfg = load_config(overrides=["optimizer.lr=0.01", "loss.args.margin=0.2", "eval.ks=[1, 10]", "protocol.fold=1"])
    assert cfg.optimizer.lr == 0.01
    assert cfg.loss.args == {"margin": 0.2}
    assert cfg.eval.ks == [1, 10]
    assert cfg.protocol.fold == 1


def test_int_accepted_for_float_but_not_bool_for_int():
    assert config_from_dict({"optimizer": {"lr": 1}}).optimizer.lr == 1.0
    with pytest.raises(ConfigError, match="train.max_steps must be int"):
        config_from_dict({"train": {"max_steps": True}})


def test_unknown_key_suggests_and_lists_valid_keys():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"optimizer": {"learning_rate": 0.1}})
    msg = str(info.value)
    assert "Unknown key 'optimizer.learning_rate'" in msg
    assert "Valid keys at 'optimizer'" in msg and "lr" in msg


def test_all_problems_collected():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"optimiser": {}, "model": {"embedding_size": -3}, "sampler": {"batch_size": 30, "m": 4}})
    problems = info.value.problems
    assert len(problems) == 3
    assert any("Did you mean 'optimizer'" in p for p in problems)
    assert any("model.embedding_size must be None or an int > 0, at most 1048576. Got -3." in p for p in problems)
    assert any("divisible by sampler.m" in p for p in problems)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("optimizer.name=adamm", "optimizer.name must be one of {'adam', 'adamw', 'sgd', 'rmsprop'}"),
        ("loss.name=proxy_anchr", "loss.name must be one of {'angular', 'arcface', 'binomial_deviance'"),  # from the LOSSES registry
        ("loss.miner.name=hard", "loss.miner.name must be None or one of {"),
        ("data.name=cifar", "data.name must be one of {"),
        ("data.augment=rotate", "data.augment must be one of {'auto', 'none', 'translate', 'affine', 'crop'}"),
        ("sampler.name=balanced", "sampler.name must be one of {'m_per_class', 'one_per_class', 'random'}"),
        ("optimizer.lr=-1", "optimizer.lr must be None or a float > 0"),
        ("optimizer.scheduler=linear", "optimizer.scheduler must be None or one of {'none', 'step', 'cosine', 'wsd'}"),
        ("optimizer.decay_fraction=0", "optimizer.decay_fraction must be a float in the range (0, 1]. Got 0.0"),
        ("model.normalization=unit", "model.normalization must be one of"),
        ("sampler.batch_size=1", "sampler.batch_size must be None or an int >= 2"),
        ("protocol.fold=7", "protocol.fold must be None or an int in [0, 3]"),
        ("eval.ks=[0]", "eval.ks must be a non-empty list of ints >= 1"),
        ("train.mixed_precision=fp8", "train.mixed_precision must be one of"),
        ("train.device=gpu", "train.device must be one of 'auto', 'cpu', 'cuda', 'cuda:N' (N a GPU index). Got 'gpu'"),
        ("train.device=cuda:x", "train.device must be one of 'auto', 'cpu', 'cuda', 'cuda:N'"),
        ("train.compile=3", "train.compile must be bool. Got 3"),
        ("train.step_capture=graphs", "train.step_capture must be one of {'auto', 'off', 'compile'}"),
        ("train.step_capture=on", "train.step_capture must be one of {'auto', 'off', 'compile'}. Got 'on'"),
        ("train.tensorboard=sometimes", "train.tensorboard must be bool. Got 'sometimes'"),
        ("data=3", "data must be a mapping"),
    ],
)
def test_value_errors_name_the_field(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert fragment in str(info.value)


def test_a_bare_on_or_off_is_the_word_for_a_field_of_words():
    # YAML 1.1 reads `off` as False: `--set train.feature_cache=off` means the word, as in the docs
    cfg = load_config(overrides=["train.feature_cache=off", "train.step_capture=off"])
    assert (cfg.train.feature_cache, cfg.train.step_capture) == ("off", "off")
    assert load_config(overrides=["train.feature_cache=on"]).train.feature_cache == "on"


def test_device_values_are_checked_without_looking_for_a_gpu():
    # a GPU config must load on a CPU-only machine (validate it there, evaluate its runs there);
    # whether the GPU exists is checked when training starts (tests/unit/engine/test_trainer_device.py)
    for value in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        assert load_config(overrides=[f"train.device={value}"]).train.device == value
    assert load_config().train.device == "auto"


def test_asap_needs_pool_at_least_proxies():
    with pytest.raises(ConfigError, match="cannot exceed asap.pool_size"):
        load_config(overrides=["asap.enabled=true", "asap.proxies_per_class=8", "asap.pool_size=4", "protocol.fold=0"])


def test_parse_override_reads_yaml_values():
    assert parse_override("a.b=0.5") == (["a", "b"], 0.5)
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=text") == (["a"], "text")
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        parse_override("novalue")
    assert apply_overrides({"x": {"y": 1}}, ["x.z=2"]) == {"x": {"y": 1, "z": 2}}


def test_field_paths_cover_sections():
    paths = field_paths()
    assert "loss.memory.memory_size" in paths and "asap.pool_size" in paths and "seed" in paths
