"""scripts/loss_catalogue_results.py: its loss list is registered, required arguments build, failures are rows."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def catalogue(script_loader):
    return script_loader("loss_catalogue_results")


def test_every_default_loss_is_registered_and_required_args_build(catalogue):
    """Each default name is in the registry; the losses with required arguments construct with the script's."""
    from dmlkit.losses import LOSSES

    missing = [name for name in catalogue.DEFAULT_LOSSES if name not in LOSSES]
    assert missing == []
    for name, (args, _) in catalogue.REQUIRED_ARGS.items():
        sets = catalogue.loss_overrides(name, embedding_size=16)
        values = {s.split("=")[0].removeprefix("loss.args."): float(s.split("=")[1]) for s in sets[1:]}
        values = {k: int(v) if k in ("l", "K") else v for k, v in values.items()}
        assert set(values) == set(args)
        assert LOSSES.create(name, **values) is not None


def test_a_failing_run_is_a_row_and_the_table_says_why(catalogue, tmp_path):
    """An unknown loss name gives a non-zero exit status and its error in the table, not an exception."""
    row = catalogue.run_one("no_such_loss", tmp_path / "x", [], seed=0, embedding_size=64, timeout=120)
    assert row["status"] not in (0, "timeout")
    assert "loss.name" in row["error"]
    ok = {"loss": "arcface", "overrides": ["loss.name=arcface"], "status": 0, "wall": 12.3,
          "map_at_r": 0.5, "precision_at_1": 0.9, "kept_pretrained": True, "best_step": 0, "selected_on": "val"}
    table = catalogue.markdown([ok, row])
    assert "| arcface | 0.5000 | 0.9000 | pretrained | - | 12 | ok |" in table
    assert "| no_such_loss | - | - | - |" in table


def test_rows_mode_tabulates_saved_runs_with_their_validation_path(catalogue, tmp_path, capsys):
    """``--rows`` re-reads each finished run: kept weights from metrics.json, step-0 and best trained val MAP@R."""
    run = tmp_path / "supcon"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps({"map_at_r": 0.75, "precision_at_1": 0.93, "kept_pretrained": False,
                                                  "best_step": 20, "selected_on": "val"}))
    (run / "wall.json").write_text(json.dumps({"wall": 99.4}))
    records = [{"kind": "eval", "split": "val", "step": step, "map_at_r": value}
               for step, value in ((0, 0.85), (10, 0.84), (20, 0.87))]
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in [{"kind": "train", "step": 10}, *records]))
    rows = [{"loss": "supcon", "overrides": ["loss.name=supcon"], "status": 0},
            {"loss": "pnp", "overrides": ["loss.name=pnp"], "status": 1, "error": "DataError: x", "wall": 3.0}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert catalogue.main(["--rows", str(tmp_path / "rows.json"), "--table", str(tmp_path / "t.md")]) == 0
    table = (tmp_path / "t.md").read_text()
    assert table == capsys.readouterr().out
    assert "| supcon | 0.7500 | 0.9300 | fine-tuned (step 20) | 0.8500 -> 0.8700 (20) | 99 | ok |" in table
    assert "| pnp | - | - | - | - | 3 | 1: DataError: x |" in table
