"""Atomic writes and safe checkpoint loading."""

import os

import pytest
import torch

from dmlkit.engine.checkpoint_files import (
    atomic_write_bytes,
    atomic_write_json,
    config_fingerprint,
    load_checkpoint,
    save_checkpoint,
)
from dmlkit.exceptions import CheckpointError


def test_round_trip(tmp_path):
    state = {"format": "dmlkit-checkpoint-1", "w": torch.arange(4.0), "step": 3}
    save_checkpoint(tmp_path / "c.pt", state)
    back = load_checkpoint(tmp_path / "c.pt")
    assert back["step"] == 3 and torch.equal(back["w"], state["w"])


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "x.bin"
    atomic_write_bytes(target, b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]  # no temp file left behind


def test_truncated_checkpoint_is_refused_with_file_name(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"format": "dmlkit-checkpoint-1", "w": torch.randn(1000)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="last.pt"):
        load_checkpoint(path)


class Evil:
    """Any non-tensor object: loading it would run arbitrary pickle code."""


def test_pickled_objects_are_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "dmlkit-checkpoint-1", "obj": Evil()}, path)
    with pytest.raises(CheckpointError, match="cannot be read safely"):
        load_checkpoint(path)


def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match="not a dmlkit checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_json_written_atomically(tmp_path):
    atomic_write_json(tmp_path / "m.json", {"b": 1, "a": 2})
    assert (tmp_path / "m.json").read_text().startswith('{\n  "a": 2')


def test_fingerprint_ignores_budget_but_not_model():
    a = {"model": {"embedding_size": 64}, "train": {"max_steps": 10}}
    b = {"model": {"embedding_size": 64}, "train": {"max_steps": 20}}
    c = {"model": {"embedding_size": 32}, "train": {"max_steps": 10}}
    assert config_fingerprint(a) == config_fingerprint(b) != config_fingerprint(c)
