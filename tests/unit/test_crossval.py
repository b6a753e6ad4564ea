"""dmlkit.crossval: each fold's run starts as every run does (launch: the folder claimed, train.log kept)."""

from __future__ import annotations

import json

import pytest

from dmlkit.crossval import run_crossval
from dmlkit.engine import run_layout as layout
from dmlkit.engine.run_dir import release_locks

DIGITS = ("data.name=digits", "protocol.num_folds=2", "train.max_steps=2", "model.ensemble=1", "sampler.m=16")


def test_each_fold_is_a_claimed_run_with_its_messages_and_a_rerun_resumes(tmp_path, tiny_config):
    cfg = tiny_config(*DIGITS)
    try:
        summary = run_crossval(cfg, tmp_path, seeds=[0], folds=[0], echo=lambda _: None)
        fold = tmp_path / "seed0" / "fold0"
        assert json.loads((fold / layout.CLAIM_FILE).read_text())["kind"] == "train"
        assert "training seed 0 fold 0" not in (fold / layout.MESSAGES_FILE).read_text()  # the fold's own messages
        assert (fold / layout.MESSAGES_FILE).stat().st_size > 0 and (fold / layout.METRICS_FILE).is_file()
        assert summary["runs"][0]["run_dir"] == str(fold)
        # a finished fold is read back, not trained again; a leftover fold without a checkpoint is trained anew
        again = run_crossval(cfg, tmp_path, seeds=[0], folds=[0], echo=lambda _: None)
        assert again["average"] == summary["average"]
        leftover = tmp_path / "seed0" / "fold1"
        leftover.mkdir()
        (leftover / layout.CLAIM_FILE).write_text(json.dumps({"kind": "train"}))
        both = run_crossval(cfg, tmp_path, seeds=[0], folds=[0, 1], echo=lambda _: None)
        assert [run["fold"] for run in both["runs"]] == [0, 1] and (leftover / layout.METRICS_FILE).is_file()
    finally:
        release_locks()


def test_a_fold_folder_holding_other_files_is_refused(tmp_path, tiny_config):
    from dmlkit.exceptions import ConfigError

    fold = tmp_path / "seed0" / "fold0"
    fold.mkdir(parents=True)
    (fold / "notes.txt").write_text("mine")
    try:
        with pytest.raises(ConfigError, match="not a dmlkit train run"):
            run_crossval(tiny_config(*DIGITS), tmp_path, seeds=[0], folds=[0], echo=lambda _: None)
    finally:
        release_locks()
    assert (fold / "notes.txt").read_text() == "mine"
