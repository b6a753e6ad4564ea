"""``scripts/reproduce.py claims``: every claim's arms end to end on Omniglot with a tiny budget, tables written, resumable."""

import json
from pathlib import Path

import pytest

from dmlkit.claims import ARMS, CLAIMS, run_claims
from dmlkit.claims.catalogue import default_claims
from dmlkit.claims.runner import Budget, train_run

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"

pytestmark = pytest.mark.skipif(not (DATA / "omniglot").exists(), reason="needs ../shared/data/omniglot")


GLYPH_CLAIMS = default_claims("cpu")


@pytest.mark.slow
def test_every_glyph_claim_runs_end_to_end_writes_tables_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "claims"
    tiny = Budget(steps=2, eval_every=1, threads=1)
    summaries = run_claims(GLYPH_CLAIMS, out, str(DATA), quick=True, budget=tiny, subset=4, echo=lambda s: None)
    assert set(summaries) == set(GLYPH_CLAIMS)
    data = json.loads((out / "claims.json").read_text())
    assert data["meta"]["seeds"] == [0, 1] and data["meta"]["quick"] is True
    table = (out / "claims.md").read_text()
    for claim in map(CLAIMS.get, GLYPH_CLAIMS):
        assert f"### {claim.paper}, {claim.source}" in table
        rows = data["claims"][claim.name]["comparisons"]
        assert len(rows) == len(claim.comparisons) and all(r["verdict"] for r in rows)
        assert all(a["seeds"] == 2 for a in data["claims"][claim.name]["arms"])
    assert "(only 2 seeds, not a result)" in table or "no verdict" in table
    assert (out / "figures" / "proxy-anchor-convergence.png").stat().st_size > 0
    # a second call reads every finished run back instead of training it again
    import dmlkit

    monkeypatch.setattr(dmlkit, "fit", lambda *a, **k: pytest.fail("a recorded run was trained again"))
    assert set(run_claims(["asap-vs-pairs"], out, str(DATA), quick=True, budget=tiny, subset=4,
                          echo=lambda s: None)) == {"asap-vs-pairs"}


def test_claims_command_lists_and_refuses_unknown_claims(capsys, script_loader):
    reproduce = script_loader("reproduce")
    assert reproduce.main(["claims", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in CLAIMS) and "untested:" in listed
    assert reproduce.main(["claims", "no-such-claim", "--quick", "--out", "unused"]) == 2
    assert "Unknown claims ['no-such-claim']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "miniimagenet64" / "images").exists(), reason="needs ../shared/data/miniimagenet64")
def test_a_photo_arm_fine_tunes_the_pretrained_backbone_and_scores_its_starting_point(tmp_path):
    tiny = Budget(photo_steps=2, photo_eval_every=1, photo_cap=3, threads=2)
    record = train_run(ARMS["miniimagenet/proxy-anchor"], 0, {"lr": 1e-5}, tiny, tmp_path, str(DATA), None, lambda s: None)
    assert record["steps"] == 2 and [v["step"] for v in record["val_curve"]] == [1, 2]
    assert 0 < record["start"]["test"]["map_at_r"] <= 1 and 0 < record["test"]["map_at_r"] <= 1
    assert record["learned"] == (record["best_step"] > 0)
    split = tmp_path / "data" / "miniimagenet-3-seed0"
    classes = {p.name for p in (split / "train").iterdir()}, {p.name for p in (split / "test").iterdir()}
    assert len(classes[0]) == len(classes[1]) == 32 and not classes[0] & classes[1]
    assert all((split / "test" / c).iterdir() for c in classes[1]) and (split / "test").joinpath(
        next(iter(classes[1]))).iterdir().__next__().is_symlink()


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
