"""Smoke test of scripts/reproduce.py: claim registry, run/skip/resume machinery, summary JSON."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def repro(script_loader):
    return script_loader("reproduce")


def test_every_registered_method_has_a_valid_config(repro):
    """Each (claim, method) resolves to a validated config with the claim's budget and selection."""
    for claim in repro.CLAIMS.values():
        for method in claim.methods:
            cfg = repro.run_config(claim, method, seed=1, steps=40)
            assert cfg.train.max_steps == 40
            assert cfg.seed == 1 and cfg.protocol.seed == 1
            if claim.folds:  # class-disjoint k-fold: the fold is the validation set
                assert cfg.protocol.num_folds == claim.folds and cfg.protocol.val_fraction == 0.0
            else:
                assert cfg.protocol.val_fraction == 0.2
            assert cfg.train.num_threads == repro.THREADS
            assert cfg.train.patience is None


def test_quick_claim_two_seeds_writes_summary(repro, tmp_path, monkeypatch):
    """Two methods x two seeds x 3 steps on sklearn digits: summary.json has mean/std per metric."""
    monkeypatch.setattr(repro, "FIGURES", tmp_path / "figures")
    tiny = ("data.name=digits", "model.embedding_size=8", "eval.save_embeddings=true", "eval.batch_size=256")
    claim = repro.Claim(
        name="smoke",
        title="smoke",
        methods=(
            repro.Method("proxy-anchor", "cpu-proxy-anchor-mnist", tiny),
            repro.Method("ms", "cpu-ms-mnist", tiny),
        ),
        steps=3,
        quick_steps=3,
        evals=1,
        metrics=("recall_at_1", "map_at_r", "nmi", "nmi_plus"),
        extras=("seconds_per_step",),
        figures=("val_curves",),
    )
    monkeypatch.setitem(repro.CLAIMS, "smoke", claim)
    assert repro.main(["smoke", "--quick", "--seeds", "0", "1", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "smoke" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["seeds"] == [0, 1]
    assert set(summary["methods"]) == {"proxy-anchor", "ms"}
    for entry in summary["methods"].values():
        assert entry["runs"] == 2
        assert entry["selected_on"] == ["val"]
        for key in ("recall_at_1", "map_at_r", "nmi", "nmi_plus", "train_seconds", "steps"):
            assert set(entry[key]) == {"mean", "std", "n"} and entry[key]["n"] == 2
            assert entry[key]["std"] >= 0
        assert 0.0 <= entry["recall_at_1"]["mean"] <= 1.0
        assert entry["steps"]["mean"] == 3
    assert (tmp_path / "figures" / "smoke-val-curves.png").stat().st_size > 0
    table = (tmp_path / "out" / "smoke" / "summary.md").read_text()
    assert table.count("\n") == 4 and "| proxy-anchor | 2 |" in table
    # a second call skips the finished runs: the metrics files are left untouched
    stamp = (tmp_path / "out" / "smoke" / "ms" / "seed1" / "metrics.json").stat().st_mtime_ns
    assert repro.main(["smoke", "--quick", "--seeds", "0", "1", "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    assert (tmp_path / "out" / "smoke" / "ms" / "seed1" / "metrics.json").stat().st_mtime_ns == stamp


def test_fold_claim_reports_fold_average_and_ensemble(repro, tmp_path, monkeypatch):
    """A k-fold claim trains one model per (seed, fold) and reports their average and the concatenated ensemble."""
    monkeypatch.setattr(repro, "FIGURES", tmp_path / "figures")
    tiny = ("data.name=digits", "model.embedding_size=8", "eval.batch_size=256", "sampler.batch_size=16", "sampler.m=8")
    claim = repro.Claim(
        name="smoke-folds",
        title="smoke",
        methods=(repro.Method("ms", "cpu-ms-mnist", tiny),),
        steps=2,
        quick_steps=2,
        evals=1,
        metrics=("map_at_r", "precision_at_1"),
        figures=("fold_ensemble",),
        folds=2,
    )
    monkeypatch.setitem(repro.CLAIMS, "smoke-folds", claim)
    assert repro.main(["smoke-folds", "--quick", "--seeds", "0", "--out", str(tmp_path / "out")]) == 0
    entry = json.loads((tmp_path / "out" / "smoke-folds" / "summary.json").read_text())["methods"]["ms"]
    assert entry["runs"] == 2 and entry["selected_on"] == ["val"]
    assert entry["map_at_r"]["n"] == 2 and entry["ensemble_map_at_r"]["n"] == 1
    assert 0.0 <= entry["ensemble_precision_at_1"]["mean"] <= 1.0
    for fold in (0, 1):
        metrics = json.loads((tmp_path / "out" / "smoke-folds" / "ms" / "seed0" / f"fold{fold}" / "metrics.json").read_text())
        assert metrics["steps"] == 2 and "wall_seconds" in metrics
    assert "ensemble_map_at_r" in (tmp_path / "out" / "smoke-folds" / "summary.md").read_text()
    assert (tmp_path / "figures" / "smoke-folds-average-ensemble.png").stat().st_size > 0


def test_core_subset_keeps_every_claim_it_runs_non_empty(repro):
    """``--core`` (the 15-minute quick mode) runs at least one arm of every core claim and no non-core claim."""
    core = [c for c in repro.CLAIMS.values() if c.core]
    assert core and len(core) < len(repro.CLAIMS)
    for claim in core:
        assert any(m.core for m in claim.methods), claim.name
    assert sum(c.folds == 0 for c in core) == len(core)
