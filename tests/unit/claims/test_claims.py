"""The claims tests' pieces: seeded splits, the catalogue's consistency, thresholds and verdicts from records."""

import pytest
import torch
from scipy import stats

from dmlkit.claims import ARMS, CLAIMS, Claim, Comparison
from dmlkit.claims.analysis import claim_markdown, compare, run_value, summarise_claim, time_to_threshold
from dmlkit.claims.glyphs import GlyphPool, build_splits, split_characters
from dmlkit.claims.runner import Budget, grid_axes, point_tag, tune_arms


def _pool(alphabets=3, chars_per_alphabet=10, drawings=4) -> GlyphPool:
    chars, alphas = [], []
    for a in range(alphabets):
        for c in range(chars_per_alphabet):
            chars += [f"A{a}/c{c}"] * drawings
            alphas += [f"A{a}"] * drawings
    images = torch.randint(0, 255, (len(chars), 1, 28, 28), dtype=torch.uint8)
    return GlyphPool(images, tuple(chars), tuple(alphas))


def test_tuning_pool_is_never_a_seed_class_and_tuning_validates_on_it():
    from dmlkit.claims.glyphs import tuning_pool

    pool = _pool(alphabets=5, chars_per_alphabet=10)
    reserved = tuning_pool(pool)
    assert len(reserved) == 10 and {c.split("/")[0] for c in reserved} == {f"A{a}" for a in range(5)}
    for setting in ("characters", "alphabets", "alphabets-disjoint"):
        for seed in range(6):
            splits = build_splits(pool, setting, seed)
            assert not reserved & set(splits.test_classes)
            if setting == "characters":  # the alphabet settings label train and validation rows by alphabet
                assert not reserved & set(splits.train.class_names) and not reserved & set(splits.val.class_names)
            else:
                assert len(splits.train) + len(splits.val) + len(splits.test) == 4 * (50 - len(reserved))
        tune = build_splits(pool, setting, 0, tuning=True)
        assert set(tune.test_classes) == reserved
        assert build_splits(pool, setting, 5, tuning=True).test_classes == tune.test_classes  # one tuning for all seeds


def test_disjoint_alphabets_test_on_alphabets_never_trained():
    pool = _pool(alphabets=5, chars_per_alphabet=10)
    splits = build_splits(pool, "alphabets-disjoint", seed=2)
    test_alphabets = {c.split("/")[0] for c in splits.test_classes}
    assert len(test_alphabets) == 2 and not test_alphabets & set(splits.train.class_names)
    assert len(splits.train.class_names) == 3 and splits.val.class_names == splits.train.class_names


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
    assert len(names[2]) == 12 and splits.test.labels.max() == 11  # half of the 24 outside the tuning pool


def test_alphabets_setting_trains_on_alphabets_and_holds_out_characters_of_every_alphabet():
    pool = _pool()
    splits = build_splits(pool, "alphabets", seed=0)
    assert splits.train.class_names == ["A0", "A1", "A2"] and splits.val.class_names == ["A0", "A1", "A2"]
    assert len(splits.test.class_names) == 12  # half of each alphabet's 8 characters outside the tuning pool
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
            assert (claim.threshold is None) != (claim.threshold_fraction is None)
    assert set(papers) == {"Proxy-Anchor", "Proxy-NCA", "DRO", "EPS", "ASAP"} and min(papers.values()) >= 2
    photo_papers = {c.paper for c in CLAIMS.values() if ARMS[c.comparisons[0].a].setting.startswith("grocery")}
    assert photo_papers == set(papers)  # at least one photo claim of each paper
    for arm in ARMS.values():
        assert arm.tuned_with is None or ARMS[arm.tuned_with].setting == arm.setting


def test_every_arm_tunes_the_learning_rate_and_one_parameter_on_grids_of_equal_size():
    for arm in ARMS.values():
        if arm.tuned_with or arm.name.endswith("@paper"):
            assert not arm.tuned, arm.name
            continue
        assert len(arm.tuned) == 1 and all(len(v) == 3 for v in arm.tuned.values()), arm.name
        assert [len(v) for v in grid_axes(arm, (3e-4, 1e-3, 3e-3)).values()] == [3, 3]
    assert grid_axes(ARMS["proxy-nca"], (1e-3,), narrow=True) == {"lr": [1e-3], "softmax_scale": [8.0]}
    assert point_tag({"lr": 0.001, "softmax_scale": 8.0}) == "lr0.001-softmax_scale8"
    assert ARMS["proxy-nca@paper"].loss["args"]["softmax_scale"] == 1.0  # the paper's unscaled Proxy-NCA


def _fake_tuning(monkeypatch, score):
    """``tune_arms`` with every run replaced by a record scored by ``score(point)``; returns the points trained."""
    import dmlkit.claims.runner as runner

    trained = []

    def fake_train_all(jobs, workers, echo):
        out = []
        for name, _, point, *_ in jobs:
            trained.append((name, dict(point)))
            out.append({"point": dict(point), "tuning_score": score(point), "best_step": 25, "steps": 50,
                        "start": {"val": {"map_at_r": 0.1}}})
        return out

    monkeypatch.setattr(runner, "_train_all", fake_train_all)
    return trained


def test_tuning_runs_the_rate_then_the_parameter_five_runs_an_arm_when_the_best_is_interior(monkeypatch, tmp_path):
    trained = _fake_tuning(monkeypatch, lambda p: -abs(p["lr"] - 1e-3) - abs(p.get("softmax_scale", 8.0) - 8.0))
    tunings = tune_arms(["proxy-nca", "proxy-nca@paper"], Budget(), tmp_path, "unused", echo=lambda s: None)
    runs = [p for n, p in trained if n == "proxy-nca"]
    assert len(runs) == 5 and [p["softmax_scale"] for p in runs[:3]] == [8.0] * 3  # the rates at the middle value
    assert {p["lr"] for p in runs[3:]} == {1e-3} and {p["softmax_scale"] for p in runs[3:]} == {4.0, 16.0}
    assert tunings["proxy-nca"]["chosen"] == {"lr": 1e-3, "softmax_scale": 8.0} and tunings["proxy-nca"]["edges"] == {}
    assert len([n for n, _ in trained if n == "proxy-nca@paper"]) == 3  # the rate alone
    assert (tmp_path / "runs" / "proxy-nca" / "tuning.json").exists()


def test_a_choice_at_an_edge_extends_its_axis_before_the_next_stage(monkeypatch, tmp_path):
    # the score rises with the rate up to 9e-3 and with the scale without bound
    trained = _fake_tuning(monkeypatch, lambda p: -abs(p["lr"] - 9e-3) + p.get("softmax_scale", 8.0) / 1000)
    tunings = tune_arms(["proxy-nca"], Budget(), tmp_path, "unused", echo=lambda s: None)
    lrs = [p["lr"] for _, p in trained]
    assert lrs[:4] == [3e-4, 1e-3, 3e-3, pytest.approx(9e-3)]  # 3e-3 at the edge: 9e-3 added (then 2.7e-2)
    chosen = tunings["proxy-nca"]["chosen"]
    assert chosen["lr"] == pytest.approx(9e-3) and chosen["softmax_scale"] > 16.0  # the scale extended past 16
    assert tunings["proxy-nca"]["extensions"] <= 4 and len(trained) == 3 + 2 + tunings["proxy-nca"]["extensions"]


def test_a_point_sets_its_parameter_in_the_loss_the_miner_and_nested_losses():
    from dmlkit.claims.catalogue import apply_point

    loss = apply_point(ARMS["triplet-semihard"].loss, {"lr": 1e-3, "margin": 0.4})
    assert loss["args"]["margin"] == 0.4 and loss["miner"]["args"]["margin"] == 0.4
    assert ARMS["triplet-semihard"].loss["args"]["margin"] == 0.2  # the catalogue is untouched
    loss = apply_point(ARMS["dro-topk-pn"].loss, {"lr": 1e-3, "k_pos+k_neg": 32})
    assert loss["args"]["k_pos"] == loss["args"]["k_neg"] == 32
    loss = apply_point(ARMS["c2-asap"].loss, {"lr": 1e-3, "pair_loss.neg_margin": 0.6})
    assert loss["args"]["pair_loss"]["args"]["neg_margin"] == 0.6


def test_a_grid_edge_extends_the_grid_until_interior_or_a_hard_limit():
    from dmlkit.claims.runner import _next_value

    assert _next_value([3e-4, 1e-3, 3e-3], 3e-3, (1e-5, 3e-2)) == pytest.approx(9e-3)
    assert _next_value([3e-4, 1e-3, 3e-3], 3e-4, (1e-5, 3e-2)) == pytest.approx(9e-5, rel=1e-5)
    assert _next_value([3e-4, 1e-3, 3e-3], 1e-3, (1e-5, 3e-2)) is None  # interior
    assert _next_value([0.1, 0.2, 0.4], 0.4, (0.0125, 0.5)) == 0.5  # 0.8 is past the hard limit: the limit itself
    assert _next_value([0.1, 0.2, 0.4, 0.5], 0.5, (0.0125, 0.5)) is None  # at the hard limit: nothing beyond
    # the photo rates: 3e-5 / 3.33 is below the 1e-5 limit, so the limit is tried (not "hard limit" at 3e-5)
    assert _next_value([3e-5, 1e-4, 3e-4], 3e-5, (1e-5, 3e-2)) == pytest.approx(1e-5)
    assert _next_value([1e-5, 3e-5, 1e-4, 3e-4], 1e-5, (1e-5, 3e-2)) is None
    assert _next_value([32, 64, 128], 32, (4, 4096)) == 16 and isinstance(_next_value([32, 64, 128], 32, (4, 4096)), int)


def test_an_edge_note_names_the_hard_limit_only_at_the_limit():
    from dmlkit.claims import ARMS
    from dmlkit.claims.runner import FULL, MAX_EXTENSIONS, _edge_notes

    arm = ARMS["grocery/lifted"]
    at_limit = _edge_notes(arm, {"lr": [1e-5, 3e-5, 1e-4]}, {"lr": 1e-5}, MAX_EXTENSIONS, FULL)
    assert at_limit == {"lr": "hard limit [1e-05, 0.03]"}  # the limit, even with every extension spent
    short = _edge_notes(arm, {"lr": [3e-5, 1e-4, 3e-4]}, {"lr": 3e-5}, MAX_EXTENSIONS, FULL)
    assert short == {"lr": f"grid edge after {MAX_EXTENSIONS} extensions"}
    assert _edge_notes(arm, {"lr": [3e-5, 1e-4, 3e-4]}, {"lr": 1e-4}, 0, FULL) == {}  # interior


def test_time_to_threshold_interpolates_from_step_zero_and_censors():
    curve = [{"step": 25, "time": 2.0, "map_at_r": 0.4}, {"step": 50, "time": 4.0, "map_at_r": 0.7}]
    assert time_to_threshold(curve, 0.2, 0.6, "step", 75) == (pytest.approx(25 + 0.2 / 0.3 * 25), True)
    assert time_to_threshold(curve, 0.2, 0.3, "step", 75) == (pytest.approx(12.5), True)
    assert time_to_threshold(curve, 0.2, 0.9, "step", 75) == (75, False)
    assert time_to_threshold(curve, 0.2, 0.6, "time", 4.0)[0] == pytest.approx(2 + 0.2 / 0.3 * 2)


def _record(arm, seed, test_map, learned=True, curve=None):
    return {"arm": arm, "seed": seed, "point": {"lr": 1e-3}, "steps": 50, "best_step": 50, "budget_steps": 75,
            "start": {"val": {"map_at_r": 0.2}, "test": {"map_at_r": 0.1}},
            "val_curve": curve or [{"step": 25, "time": 1.0, "map_at_r": 0.5}, {"step": 50, "time": 2.0, "map_at_r": 0.7}],
            "selected_val_map_at_r": 0.7 if learned else 0.1, "learned": learned, "test": {"map_at_r": test_map},
            "projections": [], "budget": {"patience": 1, "eval_every": 25}}


def _end_at_cap(record: dict, gain: float) -> None:
    """Let ``record`` select its last step, the cap (75), ``gain`` above its validation at step 50."""
    record["best_step"] = record["budget_steps"]
    record["selected_val_map_at_r"] = record["val_curve"][-1]["map_at_r"] + gain
    record["val_curve"] = [*record["val_curve"], {"step": 75, "time": 3.0, "map_at_r": record["selected_val_map_at_r"]}]


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
    # the comparison without a verdict stays in the family with p = 1: Holm still multiplies by 2
    assert rows[0]["p_family"] == 1.0 and rows[1]["p_holm"] == pytest.approx(min(1.0, 2 * rows[1]["p"]))


def test_an_arm_still_improving_at_the_cap_in_more_than_one_seed_gets_no_verdict_and_stays_in_the_family():
    gains = [0.03, 0.05, 0.04, 0.06, 0.05]
    records = {"proxy-anchor": [_record("proxy-anchor", s, 0.5 + g) for s, g in enumerate(gains)],
               "ms": [_record("ms", s, 0.5) for s in range(5)],
               "triplet-semihard": [_record("triplet-semihard", s, 0.5 + g + (-1) ** s * 0.01) for s, g in enumerate(gains)]}
    _end_at_cap(records["ms"][1], 0.02)  # one seed still improving at the cap: still a verdict
    assert compare(_claim(), records)[0]["verdict"] == "holds"
    _end_at_cap(records["ms"][3], 0.0005)  # at the cap, but its last window gained less than IMPROVING_GAIN: converged
    assert compare(_claim(), records)[0]["verdict"] == "holds"
    _end_at_cap(records["ms"][4], 0.001)
    rows = compare(_claim(), records)
    assert rows[0]["verdict"] == "no verdict: ms still improving at the cap (seeds [1, 4]): not converged"
    assert rows[0]["p_family"] == 1.0 and rows[1]["p_holm"] == pytest.approx(min(1.0, 2 * rows[1]["p"]))


def test_learned_means_a_validation_gain_of_the_stated_margin_after_step_zero():
    from dmlkit.claims.analysis import LEARN_MARGIN, learned

    base = _record("ms", 0, 0.5)
    assert learned({**base, "selected_val_map_at_r": 0.2 + LEARN_MARGIN})
    assert not learned({**base, "selected_val_map_at_r": 0.2 + LEARN_MARGIN / 2})  # beats step 0, but not by the margin
    assert not learned({**base, "best_step": 0})


def test_last_window_gain_reads_the_curve_before_the_last_patience_window():
    from dmlkit.claims.analysis import last_window_gain, still_improving

    record = _record("ms", 0, 0.5)
    record["budget"] = {"patience": 2, "eval_every": 25}  # window: steps 26-75; before it: step 25 (0.5)
    _end_at_cap(record, 0.0)
    assert last_window_gain(record) == pytest.approx(0.2) and still_improving(record)
    record["budget"] = {"patience": 1, "eval_every": 25}  # before the window: steps 25 and 50 (best 0.7)
    assert last_window_gain(record) == pytest.approx(0.0) and not still_improving(record)
    record["best_step"] = 50  # selected before the cap: converged whatever the gain
    assert not still_improving(record)


def test_equivalence_rows_give_tost_with_its_90_percent_interval_and_rows_give_the_mdd():
    from dmlkit.report.stats import minimal_detectable_difference

    equal = {k: [_record(k, s, 0.5 + 0.004 * (s % 3)) for s in range(6)] for k in ("proxy-anchor", "ms", "triplet-semihard")}
    equal["ms"] = [_record("ms", s, 0.5 + 0.003 * (s % 2)) for s in range(6)]
    row = compare(_claim(kind="equivalent", margin=0.02), equal)[0]
    d = [a - b for a, b in zip(row["values_a"], row["values_b"])]
    half = stats.t.ppf(0.95, 5) * stats.tstd(d) / 6 ** 0.5
    assert row["test"] == "TOST" and row["confidence"] == 0.90
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((sum(d) / 6 - half, sum(d) / 6 + half))
    assert row["mdd"] == pytest.approx(minimal_detectable_difference(stats.tstd(d), 6))
    table = claim_markdown(summarise_claim(_claim(kind="equivalent", margin=0.02), equal))
    assert "| TOST | " in table and "[90%: " in table


def test_holm_p_is_printed_below_0001_never_as_zero_and_nmi_is_reported():
    gains = [0.10, 0.11, 0.12, 0.105, 0.115, 0.108]
    records = {"proxy-anchor": [_record("proxy-anchor", s, 0.5 + g) for s, g in enumerate(gains)],
               "ms": [_record("ms", s, 0.5) for s in range(6)],
               "triplet-semihard": [_record("triplet-semihard", s, 0.5) for s in range(6)]}
    for runs in records.values():
        for r in runs:
            r["test"]["nmi"] = 0.8
    summary = summarise_claim(_claim(), records)
    table = claim_markdown(summary)
    assert "<0.001" in table and "0.000 " not in table
    assert " nmi (%) |" in table and "| 80.0 |" in table
    assert "not converged, raise the cap" not in table  # best step 50 of a 75-step cap
    for r in records["ms"][:2]:
        _end_at_cap(r, 0.0)
    assert "not converged, raise the cap" not in claim_markdown(summarise_claim(_claim(), records))  # flat to the cap
    for r in records["ms"][2:4]:
        _end_at_cap(r, 0.01)
    table = claim_markdown(summarise_claim(_claim(), records))
    assert "still improving at the cap in 2 seeds: not converged, raise the cap" in table and "(4; 2)" in table


def test_global_holm_runs_over_every_claim_with_untestable_rows_at_one():
    from dmlkit.claims.analysis import add_global_holm

    gains = [0.03, 0.05, 0.04, 0.06, 0.05]
    records = {"proxy-anchor": [_record("proxy-anchor", s, 0.5 + g) for s, g in enumerate(gains)],
               "ms": [_record("ms", s, 0.5) for s in range(5)],
               "triplet-semihard": [_record("triplet-semihard", s, 0.5, learned=s != 1) for s in range(5)]}
    summaries = {"one": summarise_claim(_claim(), records), "two": summarise_claim(_claim(), records)}
    add_global_holm(summaries)
    rows = [r for s in summaries.values() for r in s["comparisons"]]
    ps = [r["p_family"] for r in rows]
    assert ps[1] == ps[3] == 1.0
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    running, expected = 0.0, [0.0] * m
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        expected[i] = running
    assert [r["p_holm_global"] for r in rows] == pytest.approx(expected)
    assert rows[0]["p_holm_global"] >= rows[0]["p_holm"]


def test_convergence_claims_count_fewer_steps_as_better_and_equivalence_uses_the_margin():
    fast = [{"step": 25, "time": 1.0, "map_at_r": 0.7}]
    slow = [{"step": 25, "time": 1.0, "map_at_r": 0.4}, {"step": 50, "time": 2.0, "map_at_r": 0.65}]
    records = {"proxy-anchor": [_record("proxy-anchor", s, 0.5, curve=fast) for s in range(5)],
               "ms": [_record("ms", s, 0.5, curve=slow) for s in range(5)],
               "triplet-semihard": [_record("triplet-semihard", s, 0.5, curve=slow) for s in range(5)]}
    claim = _claim("steps_to_threshold", threshold=0.6)
    assert run_value(records["proxy-anchor"][0], claim) == (pytest.approx(20.0), True)
    rows = compare(claim, records)
    assert rows[0]["test"] == "signed-rank" and rows[0]["ratio"] > 1 and rows[0]["ratio_low"] <= rows[0]["ratio"]
    # every difference has one sign but all are equal: the exact two-sided signed-rank p of 5 seeds is 2/32
    assert rows[0]["p"] == pytest.approx(2 / 32) and rows[0]["verdict"] == "not separable"
    # a seed that never reaches the threshold is the worst rank, and its time enters the ratio as the cap
    never = [{"step": 25, "time": 1.0, "map_at_r": 0.3}, {"step": 50, "time": 2.0, "map_at_r": 0.4}]
    records["ms"][0] = _record("ms", 0, 0.5, curve=never)
    row = compare(claim, records)[0]
    assert row["observed_b"][0] is False and row["values_b"][0] == 75 and row["censored"]
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
    budget = Budget(steps=300)
    record = {**_record("proxy-anchor", 0, 0.5), "budget": budget.plan(ARMS["proxy-anchor"], "result"),
              "wall_seconds": 1.0}
    path.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="'steps': 300.*this call plans .*'steps': 40"):
        train_run(ARMS["proxy-anchor"], 0, {"lr": 1e-3}, Budget(steps=40), tmp_path, "unused", None, print)
    assert train_run(ARMS["proxy-anchor"], 0, {"lr": 1e-3}, budget, tmp_path, "unused", None, print) == record


@pytest.mark.parametrize("content, expected", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list; expected a JSON object"),
    ("steps", "is not valid JSON"),
    ("STEPS_STRING", "'steps' must be an integer; got str"),
    ("FOLDER", "is a folder; expected a JSON file"),
    ("[" * 100_000, "nested too deeply"),
])
def test_a_broken_record_is_refused_naming_the_file_and_what_was_expected(tmp_path, content, expected):
    import json

    from dmlkit.claims.runner import Budget, train_run
    from dmlkit.exceptions import DataError

    path = tmp_path / "runs" / "proxy-anchor" / "seed0" / "lr0.001.json"
    path.parent.mkdir(parents=True)
    if content == "FOLDER":
        path.mkdir()
    elif content == "STEPS_STRING":
        path.write_text(json.dumps({**_record("proxy-anchor", 0, 0.5), "steps": "40", "wall_seconds": 1.0}))
    else:
        path.write_text(content)
    with pytest.raises(DataError, match=expected) as info:
        train_run(ARMS["proxy-anchor"], 0, {"lr": 1e-3}, Budget(steps=40), tmp_path, "unused", None, print)
    assert str(path) in str(info.value)


def test_photo_splits_keep_the_tuning_pool_apart_and_hold_out_validation_labels(tmp_path):
    from dmlkit.claims.photos import photo_splits, photo_tuning_pool, split_classes
    from dmlkit.engine.frozen_stage_store import StoredStages

    classes = [f"Kind{i % 4}-p{i}" for i in range(20)]
    pool = photo_tuning_pool(classes)
    assert len(pool) == 4 and photo_tuning_pool(list(reversed(classes))) == pool
    for seed in range(5):
        train, test = split_classes(classes, seed)
        assert not set(train) & set(test) and not pool & (set(train) | set(test)) and len(train) + len(test) == 16
        assert len(test) == round(16 * 0.4)
    assert split_classes(classes, 0)[1] != split_classes(classes, 1)[1]
    tune_train, tune_test = split_classes(classes, 3, tuning=True)
    assert set(tune_test) == pool and split_classes(classes, 0, tuning=True) == (tune_train, tune_test)
    (tmp_path / "grocery").mkdir()
    (tmp_path / "grocery" / "coarse_classes.csv").write_text(
        "class,coarse_class\n" + "".join(f"{c},{c.split('-')[0]}\n" for c in classes))
    names = [c for c in classes for _ in range(3)]  # 3 photos a product, 2 stored crops + the evaluation view
    stored = StoredStages(torch.arange(len(names) * 3 * 4, dtype=torch.float32).view(len(names), 3, 1, 1, 4),
                          [f"{n}/{i}.jpg" for i, n in enumerate(names)], names)
    train, test = split_classes(classes, 2)
    fine = photo_splits(stored, "grocery", 2, tmp_path)
    assert set(fine.train_classes) | set(fine.val_classes) == set(train) and fine.test_classes == test
    assert not set(fine.train_classes) & set(fine.val_classes) and len(fine.val_classes) == round(len(train) * 0.3)
    assert len(fine.train) == 2 * 3 * len(fine.train_classes) and len(fine.test) == 3 * len(test)
    assert set(fine.train.names) == set(fine.train_classes) and fine.test.class_names == test
    first = next(i for i, n in enumerate(names) if n in test)  # test items: evaluation views, in stored order
    assert torch.equal(fine.test.get_batch([0])[0][0], stored.storage[first, 2].permute(2, 0, 1))
    assert photo_splits(stored, "grocery", 3, tmp_path).val_classes != fine.val_classes or \
        photo_splits(stored, "grocery", 3, tmp_path).test_classes != fine.test_classes
    coarse = photo_splits(stored, "grocery-coarse", 2, tmp_path)  # coarse kinds train; products validate and test
    assert set(coarse.train.names) == {c.split("-")[0] for c in coarse.train_classes}
    assert coarse.val_classes == fine.val_classes and coarse.val.class_names == fine.val_classes  # held out as products
    assert not set(coarse.train_classes) & set(coarse.val_classes) and coarse.test.class_names == test
    for seed in range(4):  # disjoint kinds: no test product shares a kind with a training or validation product
        disjoint = photo_splits(stored, "grocery-coarse-disjoint", seed, tmp_path)
        kinds = {c.split("-")[0] for c in disjoint.test_classes}
        val_kinds = {c.split("-")[0] for c in disjoint.val_classes}
        assert kinds and not kinds & (set(disjoint.train.names) | val_kinds)
        assert val_kinds and not val_kinds & set(disjoint.train.names)  # validation holds kinds out whole, as the test
        assert disjoint.val.class_names == disjoint.val_classes  # and is scored by product, as the test
        assert not pool & set(disjoint.test_classes) and len(disjoint.test_classes) >= round(16 * 0.4)


def test_a_mid_curve_threshold_is_each_seeds_step_zero_plus_a_gain_fixed_by_the_tuning_runs():
    from dmlkit.claims.experiment import convergence_threshold

    claim = CLAIMS["proxy-nca-convergence"]
    tunings = {a: {"chosen": {"lr": 1e-3}, "grid": [{"point": {"lr": 1e-3}, "score": 0.3 + 0.1 * i, "start_val": 0.1}]}
               for i, a in enumerate(claim.arms)}
    gain = convergence_threshold(claim.name, tunings)
    assert gain == pytest.approx(0.5 * 0.2)  # half the smallest tuning gain (0.3 - 0.1)
    curve = [{"step": 5, "time": 1.0, "map_at_r": 0.3}, {"step": 10, "time": 2.0, "map_at_r": 0.5}]
    low, high = _record("proxy-nca", 0, 0.5, curve=curve), _record("proxy-nca", 1, 0.5, curve=curve)
    high["start"] = {"val": {"map_at_r": 0.35}, "test": {"map_at_r": 0.1}}
    assert run_value(low, claim, gain) == (pytest.approx(5 * (0.3 - 0.2) / (0.3 - 0.2)), True)  # level 0.3: step 5
    assert run_value(high, claim, gain) == (pytest.approx(5 + 5 * (0.45 - 0.3) / 0.2), True)  # level 0.45
