"""``scripts/reproduce.py claims``: every claim's arms end to end on Omniglot with a tiny budget, tables written, resumable."""

import json
from pathlib import Path

import pytest

from dmlkit.claims import CLAIMS, run_claims
from dmlkit.claims.runner import Budget

REPO = Path(__file__).resolve().parents[2]
OMNIGLOT = REPO.parent / "shared" / "data" / "omniglot"

pytestmark = pytest.mark.skipif(not OMNIGLOT.exists(), reason="needs ../shared/data/omniglot")


@pytest.mark.slow
def test_every_claim_runs_end_to_end_writes_tables_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "claims"
    tiny = Budget(steps=2, eval_every=1, threads=1)
    summaries = run_claims(list(CLAIMS), out, str(OMNIGLOT), quick=True, budget=tiny, subset=4, echo=lambda s: None)
    assert set(summaries) == set(CLAIMS)
    data = json.loads((out / "claims.json").read_text())
    assert data["meta"]["seeds"] == [0, 1] and data["meta"]["quick"] is True
    table = (out / "claims.md").read_text()
    for claim in CLAIMS.values():
        assert f"### {claim.paper}, {claim.source}" in table
        rows = data["claims"][claim.name]["comparisons"]
        assert len(rows) == len(claim.comparisons) and all(r["verdict"] for r in rows)
        assert all(a["seeds"] == 2 for a in data["claims"][claim.name]["arms"])
    assert "(only 2 seeds, not a result)" in table or "no verdict" in table
    assert (out / "figures" / "proxy-anchor-convergence.png").stat().st_size > 0
    # a second call reads every finished run back instead of training it again
    import dmlkit

    monkeypatch.setattr(dmlkit, "fit", lambda *a, **k: pytest.fail("a recorded run was trained again"))
    assert set(run_claims(["asap-vs-pairs"], out, str(OMNIGLOT), quick=True, budget=tiny, subset=4,
                          echo=lambda s: None)) == {"asap-vs-pairs"}


def test_claims_command_lists_and_refuses_unknown_claims(capsys, script_loader):
    reproduce = script_loader("reproduce")
    assert reproduce.main(["claims", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in CLAIMS) and "untested:" in listed
    assert reproduce.main(["claims", "no-such-claim", "--quick", "--out", "unused"]) == 2
    assert "Unknown claims ['no-such-claim']" in capsys.readouterr().err
