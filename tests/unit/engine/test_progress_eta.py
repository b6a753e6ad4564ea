"""The training bar's remaining time counts the validations still to come."""

from __future__ import annotations

import io

from dmlkit.config import load_config
from dmlkit.engine.trainer import _progress


def test_the_bar_shows_the_remaining_time_it_is_given_not_the_step_rate_alone():
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["train.max_steps=20", "train.progress=true"])
    out = io.StringIO()
    bar = _progress(cfg, cfg.train.max_steps, initial=0, seconds_left=lambda: 100.0)
    bar.fp = out
    bar.update(10)
    text = str(bar)
    bar.close()
    assert "10/20" in text and "<01:40" in text  # 100 s left, whatever the 10 steps took


def test_without_an_estimate_the_bar_falls_back_to_its_own_rate():
    cfg = load_config(preset="mnist-proxy-anchor", overrides=["train.max_steps=20", "train.progress=true"])
    bar = _progress(cfg, cfg.train.max_steps, initial=0, seconds_left=lambda: None)
    bar.update(10)
    text = str(bar)
    bar.close()
    assert "10/20" in text and "<01:40" not in text
