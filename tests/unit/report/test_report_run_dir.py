"""Reading a run directory: required files, log parsing, embeddings checks, flattening."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dmlkit.exceptions import DataError
from dmlkit.report.run_reader import flatten_mapping, load_run, read_embeddings, read_log


def test_load_run_reads_every_piece(fake_run):
    run = load_run(fake_run("full", proxies=True, projections=2, train_steps=40, eval_every=20))
    assert run.name == "full"
    assert run.config["model"]["embedding_size"] == 16
    assert run.metrics["selected_on"] == "val"
    assert len(run.records_of("train")) == 40
    assert [r["step"] for r in run.records_of("eval", split="val")] == [20, 40]
    assert len(run.records_of("projection")) == 2
    assert run.env["git_commit"] == "abc123"
    assert run.embeddings.labels.dtype == np.int64
    assert run.embeddings.proxies.shape == (5, 16)
    assert run.embeddings.thumbnails.shape == (40, 12, 12)
    assert run.problems == {}
    assert "selected_on" not in run.metric_values() and run.metric_values()["nmi"] == pytest.approx(0.67)


def test_run_name_falls_back_to_directory(fake_run):
    run_dir = fake_run("dir-name", embeddings=False)
    (run_dir / "config.yaml").write_text("model: {name: resnet18}\n", encoding="utf-8")
    assert load_run(run_dir).name == "dir-name"


def test_truncated_last_log_line_is_dropped(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n\n{"kind": "train", "step": 2}\n{"kind": "tr', encoding="utf-8")
    assert [r["step"] for r in read_log(path)] == [1, 2]


def test_bad_log_line_in_the_middle_names_the_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"kind": "train"}\nnot json\n{"kind": "train"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        read_log(path)
    path.write_text('{"kind": "train"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 2 must be a JSON object. Got list"):
        read_log(path)


def _save(tmp_path, **arrays):
    path = tmp_path / "test.npz"
    np.savez(path, **arrays)
    return path


def test_embeddings_checks_quote_both_operands(tmp_path):
    emb = np.zeros((6, 4), np.float32)
    labels = np.arange(6, dtype=np.int64)
    with pytest.raises(DataError, match="embeddings has 6 rows but labels has 5"):
        read_embeddings(_save(tmp_path, embeddings=emb, labels=labels[:5]))
    with pytest.raises(DataError, match="proxies has shape \\(2, 3\\) but embeddings has 4 columns"):
        read_embeddings(_save(tmp_path, embeddings=emb, labels=labels, proxies=np.zeros((2, 3))))
    with pytest.raises(DataError, match="labels in .* must be an integer"):
        read_embeddings(_save(tmp_path, embeddings=emb, labels=labels.astype(np.float32)))
    with pytest.raises(DataError, match="has no 'labels' array"):
        read_embeddings(_save(tmp_path, embeddings=emb))
    with pytest.raises(DataError, match="thumbnails has shape \\(5, 8, 8\\)"):
        read_embeddings(_save(tmp_path, embeddings=emb, labels=labels, thumbnails=np.zeros((5, 8, 8), np.uint8)))


def test_corrupt_npz_is_a_data_error(tmp_path):
    path = tmp_path / "test.npz"
    path.write_bytes(b"not a zip file")
    with pytest.raises(DataError, match="could not be read as .npz"):
        read_embeddings(path)


def test_config_must_be_a_mapping(fake_run):
    run_dir = fake_run("cfg", embeddings=False)
    (run_dir / "config.yaml").write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(DataError, match="must hold a YAML mapping. Got list"):
        load_run(run_dir)
    (run_dir / "config.yaml").write_text("a: [unclosed\n", encoding="utf-8")
    with pytest.raises(DataError, match="is not valid YAML"):
        load_run(run_dir)


def test_flatten_mapping_uses_dotted_keys():
    nested = {"a": {"b": 1, "c": {"d": [1, 2]}, "empty": {}}, "e": None}
    assert flatten_mapping(nested) == {"a.b": 1, "a.c.d": [1, 2], "a.empty": {}, "e": None}
    assert flatten_mapping(json.loads("{}")) == {}
