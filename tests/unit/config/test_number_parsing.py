"""Numbers as users write them (``3e-4``, ``1E-3``, ``.5``) reach float fields from every path."""

import pytest

from dmlkit.config import config_from_dict, load_config, loading, parse_override
from dmlkit.config.loading import parse_yaml
from dmlkit.config.schema import as_float


@pytest.mark.parametrize("text, value", [("3e-4", 3e-4), ("1e-3", 1e-3), ("1E-3", 1e-3), (".5", 0.5), ("2e2", 200.0)])
def test_set_reads_exponent_floats(text, value):
    assert parse_override(f"optimizer.lr={text}")[1] == value
    assert load_config(overrides=[f"optimizer.lr={text}"]).optimizer.lr == value


def test_yaml_file_reads_exponent_floats(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: 1e-3\n  weight_decay: 5E-4\nasap:\n  proximal_lambda: 2e-4\n")
    cfg = load_config(path=path)
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay, cfg.asap.proximal_lambda) == (1e-3, 5e-4, 2e-4)


def test_preset_reads_exponent_floats(monkeypatch):
    text = "# a preset\noptimizer:\n  lr: 3e-4\n"
    monkeypatch.setattr(loading, "preset_info", lambda name: loading.PresetInfo(name, "", "", "", text))
    assert load_config(preset="mine").optimizer.lr == 3e-4


def test_words_and_versions_stay_strings():
    assert parse_yaml("a: 2e\nb: e5\nc: 1.2.3\nd: inf5\ne: 10") == {"a": "2e", "b": "e5", "c": "1.2.3", "d": "inf5", "e": 10}


def test_a_float_field_given_a_number_string_gets_the_float():
    assert config_from_dict({"optimizer": {"lr": "3e-4", "gamma": ".5"}}).optimizer.lr == 3e-4
    assert [as_float(t) for t in ("1_000", "abc", "nan", "1e", ".")] == [1000.0, None, None, None, None]


def test_a_word_for_a_float_is_still_refused():
    with pytest.raises(Exception, match="optimizer.lr must be float"):
        config_from_dict({"optimizer": {"lr": "fast"}})
