"""claims.json: every printed statistic recomputes from its per-seed values with scipy alone."""

import json
import math
from pathlib import Path

import pytest

from dmlkit.claims import Claim, Comparison
from dmlkit.claims.analysis import add_global_holm, summarise_claim
from dmlkit.claims.verify import verify

DOCS = Path(__file__).resolve().parents[3] / "docs" / "claims.json"


def _record(arm, seed, test_map, curve=None, selected=0.7):
    return {"arm": arm, "seed": seed, "point": {"lr": 1e-3}, "steps": 60, "best_step": 50, "budget_steps": 60,
            "start": {"val": {"map_at_r": 0.2}, "test": {"map_at_r": 0.1}},
            "val_curve": curve or [{"step": 25, "time": 1.0, "map_at_r": 0.5}, {"step": 50, "time": 2.0, "map_at_r": 0.7}],
            "selected_val_map_at_r": selected, "test": {"map_at_r": test_map, "nmi": 0.5}, "projections": [],
            "budget": {"patience": 1, "eval_every": 25}}


def _summaries() -> dict:
    """A run's summaries with every kind of row: superiority, TOST, censored times, a 'did not learn'."""
    seeds = range(6)
    acc = {"proxy-anchor": [_record("proxy-anchor", s, 0.55 + 0.01 * (s % 3)) for s in seeds],
           "ms": [_record("ms", s, 0.5 + 0.005 * s) for s in seeds],
           "triplet-semihard": [_record("triplet-semihard", s, 0.54 + 0.004 * (s % 2), selected=0.7 if s else 0.2)
                                for s in seeds]}
    superior = Claim("acc", "Proxy-Anchor", "Table 2", "s", "n", "map_at_r",
                     (Comparison("proxy-anchor", "ms"), Comparison("proxy-anchor", "triplet-semihard")))
    equivalent = Claim("eq", "Proxy-NCA", "Sec. 6.5", "s", "n", "map_at_r",
                       (Comparison("proxy-anchor", "ms", "equivalent", 0.08),))
    fast = lambda k: [{"step": 5 * i, "time": i, "map_at_r": min(0.2 + k * i, 0.9)} for i in range(1, 13)]  # noqa: E731
    times = {"proxy-anchor": [_record("proxy-anchor", s, 0.5, curve=fast(0.05 + 0.01 * s)) for s in seeds],
             "ms": [_record("ms", s, 0.5, curve=fast(0.02 + 0.002 * s) if s != 3 else fast(0.001)) for s in seeds]}
    speed = Claim("speed", "Proxy-Anchor", "Fig. 1", "s", "n", "steps_to_threshold",
                  (Comparison("proxy-anchor", "ms"),), threshold=0.5)
    summaries = {"acc": summarise_claim(superior, acc), "eq": summarise_claim(equivalent, acc),
                 "speed": summarise_claim(speed, times)}
    add_global_holm(summaries)
    return json.loads(json.dumps({"meta": {}, "claims": summaries}))  # as written and read back


def test_every_statistic_of_a_run_recomputes_and_a_tampered_one_is_found():
    data = _summaries()
    rows = {r["test"] if "test" in r else "none" for s in data["claims"].values() for r in s["comparisons"]}
    assert rows == {"paired t", "TOST", "signed-rank"}
    speed = data["claims"]["speed"]["comparisons"][0]
    assert speed["observed_b"][3] is False  # a censored seed takes part
    assert data["claims"]["acc"]["comparisons"][1]["not_learned"] == {"triplet-semihard": [0]}
    assert verify(data) == []
    for key, value in (("p", 0.5), ("p_holm", 0.01), ("mdd", 0.9), ("ci_low", -3.0)):
        tampered = json.loads(json.dumps(data))
        tampered["claims"]["acc"]["comparisons"][0][key] = value
        assert verify(tampered), key
    tampered = json.loads(json.dumps(data))
    tampered["claims"]["speed"]["comparisons"][0]["ratio_high"] *= 1.1
    assert any("ratio_high" in p for p in verify(tampered))
    tampered = json.loads(json.dumps(data))
    tampered["claims"]["acc"]["comparisons"][1]["p_family"] = tampered["claims"]["acc"]["comparisons"][1]["p"]
    assert any("Holm family" in p for p in verify(tampered))
    tampered = json.loads(json.dumps(data))  # a not-converged arm's row is outside the test: p = 1 in the family
    tampered["claims"]["acc"]["comparisons"][0]["not_converged"] = {"ms": [0, 1]}
    assert any("Holm family" in p for p in verify(tampered))


def test_the_published_claims_json_recomputes_when_there_is_one():
    data = json.loads(DOCS.read_text()) if DOCS.exists() else _summaries()
    assert verify(data) == [] and all(math.isfinite(r["p_family"]) for s in data["claims"].values()
                                      for r in s["comparisons"])


def test_the_verify_command_reports_and_exits_by_the_outcome(tmp_path, capsys, monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("reproduce", Path(__file__).resolve().parents[3] / "scripts" / "reproduce.py")
    reproduce = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "reproduce", reproduce)  # its dataclasses look their module up
    spec.loader.exec_module(reproduce)
    good = tmp_path / "claims.json"
    good.write_text(json.dumps(_summaries()))
    assert reproduce.main(["claims", "--verify", str(good)]) == 0
    assert "every statistic recomputes" in capsys.readouterr().out
    bad = _summaries()
    bad["claims"]["eq"]["comparisons"][0]["p"] = 0.9
    good.write_text(json.dumps(bad))
    assert reproduce.main(["claims", "--verify", str(good)]) == 1
    good.write_text("[1]")
    assert reproduce.main(["claims", "--verify", str(good)]) == 2
    assert "not a claims.json" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["values_a", "observed_b"])
def test_per_seed_values_are_in_every_row(key):
    assert all(key in r for s in _summaries()["claims"].values() for r in s["comparisons"])
