"""Default output paths of the commands: two commands in the same second never share one."""

from __future__ import annotations

import subprocess
import sys

from dmlkit.cli import common


def test_a_second_run_in_the_same_second_gets_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(common.time, "strftime", lambda fmt: "20261125-110120")
    first = common.new_output_dir(tmp_path / "runs", "digits-proxy-anchor")
    second = common.new_output_dir(tmp_path / "runs", "digits-proxy-anchor")
    third = common.new_output_dir(tmp_path / "runs", "digits-proxy-anchor")
    assert first.name == "20261125-110120-digits-proxy-anchor"
    assert second.name == "20261125-110120-digits-proxy-anchor-2" and third.name.endswith("-3")
    assert first.is_dir() and second.is_dir() and third.is_dir()


def test_an_evaluation_in_the_same_second_does_not_replace_the_previous_file(tmp_path, monkeypatch):
    monkeypatch.setattr(common.time, "strftime", lambda fmt: "20261125-110120")
    first = common.new_output_file(tmp_path, "test", ".json")
    first.write_text("{}")
    second = common.new_output_file(tmp_path, "test", ".json")
    assert (first.name, second.name) == ("20261125-110120-test.json", "20261125-110120-test-2.json")


def test_two_trainings_started_together_without_out_both_finish(tmp_path):
    cmd = [sys.executable, "-m", "dmlkit", "train", "--set", "data.name=digits", "--set", "train.max_steps=1",
           "--set", "train.eval_every=1", "--set", "eval.clustering=false", "--quiet", "--no-report"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all((tmp_path / "runs" / r / "metrics.json").exists() for r in runs), runs
