"""What `dmlkit train` shows at each verbosity, and RUN/train.log, which keeps every message in every mode."""

from __future__ import annotations

import io
import sys

import pytest

from dmlkit.cli.main import main

TINY = ["--set", "data.name=digits", "--set", "train.max_steps=2", "--set", "eval.clustering=false",
        "--set", "model.shift_average=0", "--no-report", "--no-progress"]  # no shifts: the test embedding in a second, not eight


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """``{mode: (stdout, stderr, train.log)}`` of the default job on scikit-learn's 8x8 digits (a third of MNIST-5k's
    images, so a third of the evaluation), 2 steps, run in-process once per mode."""
    out = {}
    capture = pytest.MonkeyPatch()
    for mode, flags in {"quiet": ["--quiet"], "default": [], "verbose": ["-v"]}.items():
        stdout, stderr = io.StringIO(), io.StringIO()
        capture.setattr(sys, "stdout", stdout)
        capture.setattr(sys, "stderr", stderr)
        run = tmp_path_factory.mktemp(mode) / "run"
        try:
            assert main(["train", *flags, *TINY, "--out", str(run)]) == 0
        finally:
            capture.undo()
        out[mode] = (stdout.getvalue(), stderr.getvalue(), (run / "train.log").read_text())
    return out


def test_quiet_shows_the_metrics_table_and_the_run_directory_without_the_recipe(shown):
    stdout, stderr, _ = shown["quiet"]
    assert "test metrics (digits-proxy-anchor" in stdout and "map_at_r" in stdout and "run directory: " in stdout
    assert "recipe:" not in stdout + stderr and "run: " not in stderr


def test_default_shows_the_run_in_a_few_lines_and_not_each_choice(shown):
    stdout, stderr, _ = shown["default"]
    assert "recipe: training split: 901 images, 5 classes" in stderr
    assert "run: small_cnn (64-D embedding), loss proxy_anchor, on cpu" in stderr
    assert "recipe:   " not in stderr and "map_at_r" in stdout
    # before the first step: the classes and images that train and test (digits 0-4 train, 5-9 test)
    assert "split: 5 classes (901 images) train, 5 classes (" in stderr
    assert stderr.index("\nrun: ") < stderr.index("\nsplit: ") and "images train" in stderr
    assert len(stderr.strip().splitlines()) <= 4, stderr  # the training split, the run, the split, the plan's line


def test_verbose_shows_every_choice_of_the_recipe_with_its_reason(shown):
    _, stderr, _ = shown["verbose"]
    assert "recipe:   sampler.m = 16  (a fifth of 181 images per class" in stderr
    assert "recipe:   train.feature_cache = off" in stderr


@pytest.mark.parametrize("mode", ["quiet", "default", "verbose"])
def test_train_log_keeps_every_message_whatever_the_console_showed(shown, mode):
    _, _, log = shown[mode]
    assert "INFO dmlkit.recipe.planner: recipe: training split: 901 images" in log
    assert "DEBUG dmlkit.recipe.planner: recipe:   sampler.m = 16  (a fifth of 181 images per class" in log
    assert "run: small_cnn (64-D embedding)" in log
    assert "INFO dmlkit.engine.resolve: split: 5 classes (901 images) train" in log
