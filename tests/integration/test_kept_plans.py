"""One command and seed give one run on one machine: a run's measurements are kept and replayed (the same
command again, ``--dry-run`` included), and ``dmlkit train --plan RUN`` replays a run's plan exactly."""

import json
import logging

import pytest

from dmlkit.cli.main import main
from dmlkit.recipe import measurements

# MNIST's default recipe with a budget that binds, so its steps come from measured speeds
BUDGETED = ["--set", "train.time_budget=8", "--set", "model.shift_average=0", "--set", "eval.clustering=false",
            "--set", "train.num_threads=1", "--quiet", "--no-report"]


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(measurements.STORE_VARIABLE, str(tmp_path / "plans"))
    # the suite's other worker loads the machine: its timings would be said busy and not kept
    monkeypatch.setattr(measurements, "load_problem", lambda: None)
    monkeypatch.setattr(measurements, "BUSY_SPREAD", float("inf"))
    monkeypatch.setattr(measurements, "SLOWER", float("inf"))
    monkeypatch.setattr(measurements, "SHARED_BELOW", 0.0)  # nor its share of the cores
    return tmp_path / "plans"


def steps_and_metrics(run):
    metrics = json.loads((run / "metrics.json").read_text())
    plans = [r for r in map(json.loads, (run / "log.jsonl").read_text().splitlines()) if r.get("kind") == "plan"]
    return [(p["step"], p["max_steps"], p["eval_every"]) for p in plans], metrics


def test_kept_measurements_replay_and_plan_reproduces_a_run(tmp_path, store, capsys, caplog):
    first = tmp_path / "first"
    assert main(["train", "--out", str(first), *BUDGETED]) == 0
    assert "measurements: kept in" in (first / "train.log").read_text()  # a message: logged (--quiet hides it)
    resolved = json.loads((first / "resolved.json").read_text())
    recorded = json.loads((first / "training.json").read_text())  # what training measured too: --plan replays it
    names = [entry["name"] for entry in recorded["measurements"]["tape"]]
    assert "training speeds" in names and any(name.startswith("glyph step") for name in names)
    planned, metrics = steps_and_metrics(first)
    assert planned and planned[0][1] < 1250  # the budget bound: steps from measured speeds

    # the same command, resolved again: the kept numbers, not new ones, so the same steps
    assert main(["train", "--dry-run", *BUDGETED]) == 0
    out = capsys.readouterr().out
    assert "measurements: replayed" in out
    assert resolved["choices"]["train.max_steps"]["value"] == int(
        out.split("train.max_steps = ")[1].split()[0])

    # --plan: the first run's plan replayed, whatever this machine's clock says: the same run
    again = tmp_path / "again"
    assert main(["train", "--plan", str(first), "--out", str(again), "--quiet", "--no-report"]) == 0
    replanned, replayed_metrics = steps_and_metrics(again)
    with caplog.at_level(logging.WARNING, logger="dmlkit"):  # the run sealed its request and tape as it wrote them
        measurements.Measurements.from_run(first)
    assert "edited" not in caplog.text
    resolved["request"]["seed"] = 5  # the same file edited by hand: said
    (first / "resolved.json").write_text(json.dumps(resolved))
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        measurements.Measurements.from_run(first)
    assert "edited after the run wrote them" in caplog.text
    assert replanned == planned
    assert replayed_metrics["map_at_r"] == metrics["map_at_r"]
    assert replayed_metrics["precision_at_1"] == metrics["precision_at_1"]


def test_plan_refuses_changes(tmp_path, capsys):
    assert main(["train", "--plan", str(tmp_path), "--set", "optimizer.lr=0.1"]) == 2
    assert "--plan replays an earlier run's config" in capsys.readouterr().err
