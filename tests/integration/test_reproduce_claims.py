"""``scripts/reproduce.py claims``: every glyph claim end to end on Omniglot with a tiny budget, tables and claims.json
written and recomputed, resumable from the records; a photo arm on grocery fine-tuned from its pretrained start."""

import json
from pathlib import Path

import pytest

from dmlkit.claims import ARMS, CLAIMS, run_claims
from dmlkit.claims.catalogue import is_photo_claim
from dmlkit.claims.runner import Budget, train_run
from dmlkit.claims.verify import verify

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"



#: One claim of every mechanism (early curves at two rates, TOST, an ablation tuned with its reference, ASAP's
#: projections, alphabet labels on disjoint alphabets, the papers' values with the rate alone tuned); `--quick`
#: runs every arm, and the catalogue test checks every claim's arms statically.
GLYPH_CLAIMS = ["proxy-nca-convergence", "proxy-nca-fewer-proxies", "eps-disjoint-alphabets", "asap-vs-one-problem",
                "proxy-anchor-accuracy-paper-values"]
TINY = Budget(steps=2, eval_every=1, patience=None, curve_steps=2, curve_every=1, threads=1, extend=False)


@pytest.mark.slow
def test_glyph_claims_run_end_to_end_write_tables_that_recompute_and_resume(tmp_path, monkeypatch):
    assert not any(is_photo_claim(c) for c in GLYPH_CLAIMS)
    out = tmp_path / "claims"
    summaries = run_claims(GLYPH_CLAIMS, out, str(DATA), quick=True, budget=TINY, subset=4, echo=lambda s: None)
    convergence = [c for c in GLYPH_CLAIMS if CLAIMS[c].metric == "steps_to_threshold"]
    assert set(summaries) == set(GLYPH_CLAIMS) | {f"{c}@every arm at lr 0.001" for c in convergence}
    data = json.loads((out / "claims.json").read_text())
    assert data["meta"]["seeds"] == [0, 1] and data["meta"]["quick"] is True
    assert verify(data) == []  # every printed statistic recomputes from the per-seed values
    table = (out / "claims.md").read_text()
    for claim in map(CLAIMS.get, GLYPH_CLAIMS):
        assert f"### {claim.paper}, {claim.source}" in table
        rows = data["claims"][claim.name]["comparisons"]
        assert len(rows) == len(claim.comparisons) and all(r["verdict"] and "p_holm_global" in r for r in rows)
        assert all(a["seeds"] == 2 and a["tuning"]["grid"] for a in data["claims"][claim.name]["arms"])
    assert "(only 2 seeds, not a result)" in table or "no verdict" in table
    assert (out / "figures" / "proxy-nca-convergence.png").stat().st_size > 0
    # tuning runs are never results, and no seed tests a tuning class
    tune = json.loads((out / "runs" / "proxy-nca" / "tuning.json").read_text())
    assert tune["chosen"] == {"lr": 1e-3, "softmax_scale": 8.0}
    assert json.loads((out / "runs" / "proxy-anchor@paper" / "tuning.json").read_text())["chosen"] == {"lr": 1e-3}
    pool = set(json.loads(next((out / "runs" / "proxy-nca" / "tune").glob("*.json")).read_text())["test_classes"])
    for seed in (0, 1):
        record = json.loads(next((out / "runs" / "proxy-nca" / f"seed{seed}").glob("lr*.json")).read_text())
        assert record["purpose"] == "result" and not pool & set(record["test_classes"])
    # a fresh clone holding only the committed records re-runs nothing: the run folders beside them are gone
    import shutil

    import dmlkit

    for folder in [d for d in (out / "runs").rglob("*") if d.is_dir() and d.parent.name.startswith(("seed", "tune"))]:
        shutil.rmtree(folder)
    shutil.rmtree(out / "data", ignore_errors=True)

    monkeypatch.setattr(dmlkit, "fit", lambda *a, **k: pytest.fail("a recorded run was trained again"))
    assert set(run_claims(["asap-vs-one-problem"], out, str(DATA), quick=True, budget=TINY, subset=4,
                          echo=lambda s: None)) == {"asap-vs-one-problem"}


def test_claims_command_lists_and_refuses_unknown_claims(capsys, script_loader):
    reproduce = script_loader("reproduce")
    assert reproduce.main(["claims", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in CLAIMS) and "untested:" in listed
    assert reproduce.main(["claims", "no-such-claim", "--quick", "--out", "unused"]) == 2
    assert "Unknown claims ['no-such-claim']" in capsys.readouterr().err


@pytest.mark.slow
def test_photo_arms_fine_tune_on_one_shared_store_and_coarse_labels_are_scored_on_fine_products(tmp_path, monkeypatch):
    from dmlkit.claims.photos import coarse_classes, photo_tuning_pool
    from dmlkit.models import Embedder

    tiny = Budget(photo_steps=2, photo_eval_every=1, photo_cap=3, photo_size=64, photo_patience=None, threads=1)
    prefix_images = []
    prefix = Embedder.prefix
    monkeypatch.setattr(Embedder, "prefix", lambda self, x: (prefix_images.append(len(x)), prefix(self, x))[1])
    arm = ARMS["grocery-coarse/eps-triplet"]
    record = train_run(arm, 0, {"lr": 1e-4, "margin": 0.2}, tiny, tmp_path, str(DATA), None, lambda s: None)
    assert record["steps"] == 2 and [v["step"] for v in record["val_curve"]] == [1, 2] and record["best_step"] in (1, 2)
    assert 0 < record["start"]["test"]["fine_map_at_r"] <= 1 and 0 < record["test"]["fine_map_at_r"] <= 1
    assert record["tuning_score"] == record["test"]["fine_map_at_r"] and 0 < record["selected_val_map_at_r"] <= 1
    stored = sum(prefix_images)
    # every photo's 5 stored views (4 training crops, the evaluation view) once, and the builder's one-image probes
    assert 81 * 3 * 5 <= stored < 81 * 3 * 5 + 10
    mapping = coarse_classes(DATA)
    fine = set(record["test_classes"])
    assert not photo_tuning_pool(list(mapping)) & fine and len(fine) == (81 - 16) // 2
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
    assert resumed["steps"] == 2 and resumed["val_curve"] == json.loads(json.dumps(record["val_curve"]))
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
