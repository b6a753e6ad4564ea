"""The published claims: every statistic printed in docs/claims-tables.md recomputes from docs/claims.json."""

import json
from pathlib import Path

from dmlkit.claims import CLAIMS
from dmlkit.claims.experiment import render_markdown
from dmlkit.claims.verify import verify

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_published_claims_recompute_from_their_per_seed_values_and_print_as_their_tables():
    data = json.loads((DOCS / "claims.json").read_text())
    assert data["claims"] and not data["meta"]["quick"]
    assert verify(data) == []  # every p-value, interval, MDD, ratio, Holm adjustment and verdict
    # claims.json keeps sorted keys: the tables list the claims in the catalogue's order, a variant after its claim
    order = sorted(data["claims"], key=lambda name: (list(CLAIMS).index(name.split("@")[0]), name))
    tables = render_markdown({name: data["claims"][name] for name in order}, data["meta"])
    assert (DOCS / "claims-tables.md").read_text() == tables
    assert len(data["meta"]["seeds"]) >= 8
