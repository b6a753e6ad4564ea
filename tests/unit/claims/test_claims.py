"""The claims tests' pieces: seeded splits, the catalogue's consistency, thresholds and verdicts from records."""

import pytest
import torch

from dmlkit.claims import ARMS, CLAIMS, Claim, Comparison
from dmlkit.claims.analysis import claim_markdown, compare, run_value, summarise_claim, time_to_threshold
from dmlkit.claims.glyphs import GlyphPool, build_splits, split_characters
from dmlkit.claims.runner import grid_points, point_tag


def _pool(alphabets=3, chars_per_alphabet=10, drawings=4) -> GlyphPool:
    chars, alphas = [], []
    for a in range(alphabets):
        for c in range(chars_per_alphabet):
            chars += [f"A{a}/c{c}"] * drawings
            alphas += [f"A{a}"] * drawings
    images = torch.randint(0, 255, (len(chars), 1, 28, 28), dtype=torch.uint8)
    return GlyphPool(images, tuple(chars), tuple(alphas))


def test_character_split_is_disjoint_seeded_and_redrawn_per_seed():
    chars = [f"c{i}" for i in range(136)]
    train, val, test = split_characters(chars, seed=0)
    assert not (train & val or train & test or val & test) and len(train | val | test) == 136
    assert (len(test), len(val), len(train)) == (68, 14, 54)
    assert split_characters(chars, seed=0) == (train, val, test)
    assert split_characters(chars, seed=1)[2] != test


def test_characters_setting_labels_characters_in_disjoint_splits():
    splits = build_splits(_pool(), "characters", seed=3)
    names = [set(s.class_names) for s in (splits.train, splits.val, splits.test)]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    assert len(names[2]) == 15 and splits.test.labels.max() == 14


def test_alphabets_setting_trains_on_alphabets_and_holds_out_characters_of_every_alphabet():
    pool = _pool()
    splits = build_splits(pool, "alphabets", seed=0)
    assert splits.train.class_names == ["A0", "A1", "A2"] and splits.val.class_names == ["A0", "A1", "A2"]
    assert len(splits.test.class_names) == 15  # half of each alphabet's 10 characters
    assert {c.split("/")[0] for c in splits.test.class_names} == {"A0", "A1", "A2"}
    train_rows = {i for i, c in enumerate(pool.characters) if c in set(splits.test_classes)}
    assert len(train_rows) == len(splits.test)
    # the test rows' alphabet ids follow the characters' alphabets
    expected = torch.tensor([int(splits.test.class_names[int(y)][1]) for y in splits.test.labels])
    assert torch.equal(splits.test_alphabets, expected)


def test_catalogue_is_consistent():
    papers = {}
    for claim in CLAIMS.values():
        papers[claim.paper] = papers.get(claim.paper, 0) + 1
        for comp in claim.comparisons:
            assert comp.a in ARMS and comp.b in ARMS
            assert ARMS[comp.a].setting == ARMS[comp.b].setting, comp
            assert comp.kind in ("superior", "equivalent") and (comp.kind == "superior") == (comp.margin is None)
        if claim.metric.endswith("_to_threshold"):
            assert claim.threshold is not None
    assert set(papers) == {"Proxy-Anchor", "Proxy-NCA", "DRO", "EPS", "ASAP"} and min(papers.values()) >= 2
    for arm in ARMS.values():
        assert arm.tuned_with is None or ARMS[arm.tuned_with].setting == arm.setting


def test_grid_points_cross_the_learning_rates_with_tuned_arguments():
    points = grid_points(ARMS["proxy-nca"], (1e-3, 3e-3))
    assert len(points) == 6 and {"lr": 1e-3, "softmax_scale": 8.0} in points
    assert grid_points(ARMS["proxy-nca"], (1e-3,), narrow=True) == [{"lr": 1e-3, "softmax_scale": 8.0}]
    assert point_tag({"lr": 0.001, "softmax_scale": 8.0}) == "lr0.001-softmax_scale8"


def test_time_to_threshold_interpolates_from_step_zero_and_censors():
    curve = [{"step": 25, "time": 2.0, "map_at_r": 0.4}, {"step": 50, "time": 4.0, "map_at_r": 0.7}]
    assert time_to_threshold(curve, 0.2, 0.6, "step", 75) == (pytest.approx(25 + 0.2 / 0.3 * 25), True)
    assert time_to_threshold(curve, 0.2, 0.3, "step", 75) == (pytest.approx(12.5), True)
    assert time_to_threshold(curve, 0.2, 0.9, "step", 75) == (75, False)
    assert time_to_threshold(curve, 0.2, 0.6, "time", 4.0)[0] == pytest.approx(2 + 0.2 / 0.3 * 2)


def _record(arm, seed, test_map, learned=True, curve=None):
    return {"arm": arm, "seed": seed, "point": {"lr": 1e-3}, "steps": 50, "best_step": 50,
            "start": {"val": {"map_at_r": 0.2}, "test": {"map_at_r": 0.1}},
            "val_curve": curve or [{"step": 25, "time": 1.0, "map_at_r": 0.5}, {"step": 50, "time": 2.0, "map_at_r": 0.7}],
            "selected_val_map_at_r": 0.7 if learned else 0.1, "learned": learned, "test": {"map_at_r": test_map},
            "projections": []}


def _claim(metric="map_at_r", kind="superior", margin=None, threshold=None):
    comparisons = (Comparison("proxy-anchor", "ms", kind, margin), Comparison("proxy-anchor", "triplet-semihard", kind, margin))
    return Claim("x", "Proxy-Anchor", "Table 2", "s", "n", metric, comparisons, threshold)


def test_verdicts_from_seed_paired_records():
    gains = [0.03, 0.05, 0.04, 0.06, 0.05]
    records = {"proxy-anchor": [_record("proxy-anchor", s, 0.5 + g) for s, g in enumerate(gains)],
               "ms": [_record("ms", s, 0.5) for s in range(5)],
               "triplet-semihard": [_record("triplet-semihard", s, 0.5 + g + (-1) ** s * 0.01) for s, g in enumerate(gains)]}
    rows = compare(_claim(), records)
    assert rows[0]["verdict"] == "holds" and rows[0]["p_holm"] == pytest.approx(2 * rows[0]["p"])
    assert rows[1]["verdict"] == "not separable"
    records["ms"][2] = _record("ms", 2, 0.5, learned=False)
    rows = compare(_claim(), records)
    assert rows[0]["verdict"] == "no verdict: ms did not learn (seeds [2])"
    assert rows[1]["p_holm"] == pytest.approx(rows[1]["p"])  # one comparison left in the family


def test_convergence_claims_count_fewer_steps_as_better_and_equivalence_uses_the_margin():
    fast = [{"step": 25, "time": 1.0, "map_at_r": 0.7}]
    slow = [{"step": 25, "time": 1.0, "map_at_r": 0.4}, {"step": 50, "time": 2.0, "map_at_r": 0.65}]
    records = {"proxy-anchor": [_record("proxy-anchor", s, 0.5, curve=fast) for s in range(5)],
               "ms": [_record("ms", s, 0.5, curve=slow) for s in range(5)],
               "triplet-semihard": [_record("triplet-semihard", s, 0.5, curve=slow) for s in range(5)]}
    claim = _claim("steps_to_threshold", threshold=0.6)
    assert run_value(records["proxy-anchor"][0], claim) == (pytest.approx(20.0), True)
    rows = compare(claim, records)
    assert rows[0]["verdict"] == "holds" and rows[0]["ratio"] > 1
    equal = {k: [_record(k, s, 0.5 + 0.001 * (s % 2)) for s in range(5)] for k in records}
    rows = compare(_claim(kind="equivalent", margin=0.02), equal)
    assert rows[0]["verdict"] == "equivalent within ±2 points"
    table = claim_markdown(summarise_claim(_claim(kind="equivalent", margin=0.02), equal))
    assert "equivalence, margin ±2.0" in table and "| proxy-anchor |" in table


def test_asap_selected_projection_and_the_claims_longer_budget():
    from dmlkit.claims.analysis import selected_projection

    record = {"best_step": 700, "projections": [{"projection": 0, "step": 450}, {"projection": 1, "step": 700},
                                                {"projection": 2, "step": 1200}]}
    assert selected_projection(record) == 1
    assert selected_projection({**record, "best_step": 701}) == 2
    # every arm of a claim trains the same steps: ASAP's claims scale all their arms alike
    for name in ("asap-vs-pairs", "asap-vs-one-problem"):
        assert {ARMS[a].steps_scale for a in CLAIMS[name].arms} == {4}


def test_a_recorded_run_of_another_budget_is_refused(tmp_path):
    import json

    from dmlkit.claims.runner import Budget, train_run
    from dmlkit.exceptions import ConfigError

    path = tmp_path / "runs" / "proxy-anchor" / "seed0" / "lr0.001.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"budget_steps": 300}))
    with pytest.raises(ConfigError, match="trained for 300 steps, this call plans 40"):
        train_run(ARMS["proxy-anchor"], 0, {"lr": 1e-3}, Budget(steps=40), tmp_path, "unused", None, print)
    assert train_run(ARMS["proxy-anchor"], 0, {"lr": 1e-3}, Budget(steps=300), tmp_path, "unused", None, print) == {
        "budget_steps": 300}
