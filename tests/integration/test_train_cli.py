"""The main job end to end through the real CLI (shortened budget)."""

import json

import pytest
import yaml

from dmlkit.cli.main import build_parser, main

METRIC_KEYS = {"precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "r_precision", "map_at_r", "nmi"}


def test_default_job_short_budget_writes_run_directory(tmp_path, cli):
    out = tmp_path / "run"
    proc = cli("train", "--out", str(out), "--quiet", "--set", "train.max_steps=40", "--no-report")
    for key in ("precision_at_1", "recall_at_8", "map_at_r", "nmi"):
        assert key in proc.stdout  # the final table
    metrics = json.loads((out / "metrics.json").read_text())
    assert METRIC_KEYS <= metrics.keys()
    assert all(0.0 <= metrics[k] <= 1.0 for k in METRIC_KEYS)
    assert metrics["selected_on"] == "last" and metrics["steps"] == 40
    assert metrics["map_at_r"] > 0.2  # 40 steps already beat an untrained net on unseen digits
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["loss"]["name"] == "proxy_anchor" and cfg["train"]["max_steps"] == 40
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "train"] == [10, 20, 30, 40]
    assert log[-1]["kind"] == "eval" and log[-1]["split"] == "test"
    assert (out / "checkpoints" / "best.pt").is_file() and (out / "checkpoints" / "last.pt").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest) - {"eval_input"} == {"train", "test"} and manifest["train"]["classes"] == 5
    # zero-shot: the test digits are 5-9 and none of them is a training digit (labels are re-indexed per split)
    assert manifest["train"]["class_names"] == ["0", "1", "2", "3", "4"]
    assert manifest["test"]["class_names"] == ["5", "6", "7", "8", "9"]
    assert set(manifest["test"]["labels"]) == {0, 1, 2, 3, 4}
    env = json.loads((out / "env.json").read_text())
    assert env["seed"] == 0 and env["versions"]["torch"]
    # `dmlkit evaluate` on the saved weights reproduces the run's own test metrics
    again = json.loads(cli("evaluate", str(out), "--checkpoint", "last").stdout.strip().splitlines()[-1])
    for key in ("precision_at_1", "r_precision", "map_at_r"):
        assert again[key] == pytest.approx(metrics[key], abs=1e-9), key
    assert len(list((out / "evaluations").glob("*-test.json"))) == 1


def test_bad_override_fails_before_training_and_writes_nothing(tmp_path, cli):
    out = tmp_path / "run"
    proc = cli("train", "--out", str(out), "--set", "optimizer.lr=-1", "--set", "modle.name=x", check=False)
    assert proc.returncode == 2
    assert "optimizer.lr must be None or a float > 0. Got -1" in proc.stderr
    assert "Unknown key 'modle'. Did you mean 'model'?" in proc.stderr
    assert not out.exists()


def test_help_lists_every_option():
    parser = build_parser()
    text = parser.format_help()
    for verb in ("train", "validate", "presets", "datasets", "report", "compare"):
        assert verb in text
    sub = parser._subparsers._group_actions[0].choices["train"].format_help()
    for opt in ("--preset", "--config", "--set", "--seed", "--out", "--resume", "--quiet"):
        assert opt in sub


def test_validate_verb_prints_resolved_config(capsys):
    assert main(["validate", "--set", "optimizer.lr=0.5", "--print"]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out)["optimizer"]["lr"] == 0.5


def test_validate_verb_reports_problems(capsys):
    assert main(["validate", "--set", "sampler.batch_size=30", "--set", "sampler.m=16"]) == 2
    assert "divisible by sampler.m" in capsys.readouterr().err
