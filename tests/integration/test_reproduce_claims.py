"""``scripts/reproduce.py claims``: every glyph claim end to end on Omniglot with a tiny budget, tables and claims.json
written and recomputed, resumable from the records; a photo arm on grocery fine-tuned from its pretrained start."""

import json
from pathlib import Path

import pytest

from dmlkit.claims import ARMS, CLAIMS
from dmlkit.claims.runner import Budget, train_run
from dmlkit.claims.verify import verify

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"



#: ``--quick``'s promise: every claim end to end within 10 minutes of work on an idle 2-core machine.
QUICK_SECONDS_ON_TWO_CORES = 600


@pytest.mark.slow
def test_quick_runs_every_claim_end_to_end_within_ten_minutes_writes_tables_that_recompute_and_resumes(
        tmp_path, monkeypatch, script_loader, capsys):
    reproduce = script_loader("reproduce")
    out = tmp_path / "claims"
    # one worker: the suite's own processes hold the cores already
    assert reproduce.main(["claims", "--quick", "--workers", "1", "--out", str(out)]) == 0
    assert "quick check: not a result" in capsys.readouterr().out
    data = json.loads((out / "claims.json").read_text())
    meta = data["meta"]
    # the work of every process of the command (the machine may be shared: its CPU time, not the wall clock)
    assert meta["cpu_seconds_this_call"] / 2 <= QUICK_SECONDS_ON_TWO_CORES, meta["costs"]
    assert meta["seeds"] == [0, 1] and meta["quick"] is True
    convergence = [c for c in CLAIMS if CLAIMS[c].metric == "steps_to_threshold"]
    assert set(data["claims"]) == set(CLAIMS) | {f"{c}@every arm at lr 0.001" for c in convergence}
    assert verify(data) == []  # every printed statistic recomputes from the per-seed values
    table = (out / "claims.md").read_text()
    for claim in CLAIMS.values():
        assert f"### {claim.paper}, {claim.source}" in table
        rows = data["claims"][claim.name]["comparisons"]
        assert len(rows) == len(claim.comparisons) and all(r["verdict"] and "p_holm_global" in r for r in rows)
        assert all(a["seeds"] == 2 and a["tuning"]["grid"] for a in data["claims"][claim.name]["arms"])
    assert (out / "figures" / "proxy-nca-convergence.png").stat().st_size > 0
    # figures are named relative to the output folder: claims.json reads the same on every clone
    assert meta["figures"] and all(not Path(f).is_absolute() and (out / f).stat().st_size > 0
                                   for f in meta["figures"].values())
    # tuning runs are never results, and no seed tests a tuning class
    assert json.loads((out / "runs" / "proxy-nca" / "tuning.json").read_text())["chosen"] == {
        "lr": 1e-3, "softmax_scale": 8.0}
    for arm in ("proxy-nca", "grocery/proxy-nca"):
        pool = set(json.loads(next((out / "runs" / arm / "tune").glob("*.json")).read_text())["test_classes"])
        for seed in (0, 1):
            record = json.loads(next((out / "runs" / arm / f"seed{seed}").glob("lr*.json")).read_text())
            assert record["purpose"] == "result" and not pool & set(record["test_classes"])
    # a fresh clone holding only the committed records re-runs nothing: the run folders and the photo store are gone
    import shutil

    import dmlkit.claims.runner as runner

    for folder in [d for d in (out / "runs").rglob("*") if d.is_dir() and d.parent.name.startswith(("seed", "tune"))]:
        shutil.rmtree(folder)
    shutil.rmtree(out / "data", ignore_errors=True)
    monkeypatch.setattr(runner, "train_run", lambda *a, **k: pytest.fail("a recorded run was trained again"))
    assert reproduce.main(["claims", "--quick", "--workers", "1", "--out", str(out)]) == 0
    assert verify(json.loads((out / "claims.json").read_text())) == []


def test_claims_command_lists_and_refuses_unknown_claims(capsys, script_loader):
    reproduce = script_loader("reproduce")
    assert reproduce.main(["claims", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in CLAIMS) and "untested:" in listed
    assert reproduce.main(["claims", "no-such-claim", "--quick", "--out", "unused"]) == 2
    assert "Unknown claims ['no-such-claim']" in capsys.readouterr().err


@pytest.mark.slow
def test_photo_arms_fine_tune_on_one_shared_store_and_coarse_labels_are_scored_on_fine_products(tmp_path, monkeypatch):
    from dmlkit.claims.photos import PHOTO_TEST_FRACTION, coarse_classes, photo_tuning_pool
    from dmlkit.models import Embedder

    tiny = Budget(photo_steps=2, photo_eval_every=1, photo_cap=3, photo_size=64, photo_patience=None, threads=1)
    prefix_images = []
    prefix = Embedder.prefix
    monkeypatch.setattr(Embedder, "prefix", lambda self, x: (prefix_images.append(len(x)), prefix(self, x))[1])
    arm = ARMS["grocery-coarse/eps-triplet"]
    record = train_run(arm, 0, {"lr": 1e-4, "margin": 0.2}, tiny, tmp_path, str(DATA), None, lambda s: None)
    steps = tiny.photo_steps * arm.photo_steps_scale  # the EPS photo arms train to twice the photo cap
    assert steps == 4 and record["steps"] == steps and record["budget_steps"] == steps
    assert [v["step"] for v in record["val_curve"]] == [1, 2, 3, 4] and record["best_step"] in (1, 2, 3, 4)
    assert 0 < record["start"]["test"]["fine_map_at_r"] <= 1 and 0 < record["test"]["fine_map_at_r"] <= 1
    assert record["tuning_score"] == record["test"]["fine_map_at_r"] and 0 < record["selected_val_map_at_r"] <= 1
    stored = sum(prefix_images)
    # every photo's 5 stored views (4 training crops, the evaluation view) once, and the builder's one-image probes
    assert 81 * 3 * 5 <= stored < 81 * 3 * 5 + 10
    mapping = coarse_classes(DATA)
    fine = set(record["test_classes"])
    assert not photo_tuning_pool(list(mapping)) & fine and len(fine) == round((81 - 16) * PHOTO_TEST_FRACTION)
    # another arm and setting reads the same store: no prefix pass; a record is never trained again
    other = train_run(ARMS["grocery/proxy-anchor"], 0, {"lr": 1e-4, "alpha": 32.0}, tiny, tmp_path, str(DATA), None,
                      lambda s: None)
    assert sum(prefix_images) == stored and len(list((tmp_path / "data").glob("*.pt"))) == 1
    assert "map_at_r" in other["test"] and set(other["test_classes"]) == fine  # one seed, one draw of test products
    assert other["start"]["test"]["map_at_r"] == pytest.approx(record["start"]["test"]["fine_map_at_r"])
    assert train_run(arm, 0, {"lr": 1e-4, "margin": 0.2}, tiny, tmp_path, str(DATA), None, lambda s: None) == \
        json.loads(json.dumps(record))
    # a run stopped before its record was written resumes from its checkpoint (nothing trained again)
    from dmlkit.claims.runner import record_path

    record_path(tmp_path, arm.name, 0, {"lr": 1e-4, "margin": 0.2}, "result").unlink()
    resumed = train_run(arm, 0, {"lr": 1e-4, "margin": 0.2}, tiny, tmp_path, str(DATA), None, lambda s: None)
    assert resumed["steps"] == steps and resumed["val_curve"] == json.loads(json.dumps(record["val_curve"]))
    assert resumed["test"] == pytest.approx(record["test"])


def test_claims_refuse_an_out_that_is_a_file_and_the_cli_exits_2(tmp_path, capsys, script_loader):
    from dmlkit.claims import run_claims
    from dmlkit.exceptions import DataError

    out = tmp_path / "out"
    out.write_text("mine")
    with pytest.raises(DataError, match="is a file; expected a folder"):
        run_claims(["proxy-anchor-accuracy"], out, "unused", quick=True)
    assert out.read_text() == "mine"
    reproduce = script_loader("reproduce")
    assert reproduce.main(["claims", "proxy-anchor-accuracy", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is a file; expected a folder" in err and "Traceback" not in err
