"""This machine's least costs, kept across runs: a plan reads each timed cost no higher than the least this machine
showed for the same work, so a run timed beside other work plans as an idle one did."""

import json

import pytest
import torch

from dmlkit.recipe import kept_costs as k
from dmlkit.recipe import measurements as m
from dmlkit.recipe.backbone_choice import BackboneCost
from dmlkit.recipe.glyph_plan import GlyphCosts
from dmlkit.recipe.learning_plan import StageCost, least_stage_costs


@pytest.fixture
def idle(monkeypatch):
    monkeypatch.setattr(m, "load_problem", lambda: None)
    monkeypatch.setattr(m.timing.OtherWork, "cores", lambda self: None)


def seconds(costs: k.KeptCosts, name: str, fresh: float) -> float:
    return costs.lower(name, fresh, k.smaller_seconds, encode=float, decode=float)


def test_the_least_timing_of_the_same_work_is_kept_and_read(tmp_path):
    path = tmp_path / "costs" / "machine.json"
    first = k.KeptCosts(path, {"cpu": "x"})
    assert seconds(first, "embed", 2.0) == 2.0 and first.lowered == [] and first.said() is None
    record = json.loads(path.read_text())
    assert record["format"] == k.COSTS_FORMAT and record["costs"] == {"embed": 2.0} and record["machine"] == {"cpu": "x"}
    loaded = k.KeptCosts(path, {"cpu": "x"})  # a later run beside other work times the same work slower
    assert seconds(loaded, "embed", 3.0) == 2.0 and loaded.lowered == ["embed"]
    assert "1 cost(s) read at this machine's least kept timing" in loaded.said()
    assert seconds(loaded, "step", 5.0) == 5.0  # other work: as timed
    faster = k.KeptCosts(path, {"cpu": "x"})
    assert seconds(faster, "embed", 1.5) == 1.5 and faster.lowered == []
    assert json.loads(path.read_text())["costs"] == {"embed": 1.5, "step": 5.0}


def test_a_kept_file_that_does_not_read_is_said_and_replaced(tmp_path, caplog):
    path = tmp_path / "machine.json"
    path.write_text("{not json")
    costs = k.KeptCosts(path, {"cpu": "x"})
    assert seconds(costs, "embed", 2.0) == 2.0
    assert "do not read" in caplog.text and str(path) in caplog.text
    assert json.loads(path.read_text())["costs"] == {"embed": 2.0}


def test_a_kept_value_of_other_work_is_replaced_by_the_fresh_one(tmp_path):
    path = tmp_path / "machine.json"
    costs = k.KeptCosts(path, {})
    fresh = BackboneCost(0.2, 0.1, 224, 288)
    costs.lower("backbone", BackboneCost(0.1, 0.05, 160, 288), BackboneCost.fastest, encode=lambda c: c.__dict__,
                decode=lambda v: BackboneCost(**v))
    again = k.KeptCosts(path, {})
    assert again.lower("backbone", fresh, BackboneCost.fastest, encode=lambda c: c.__dict__,
                       decode=lambda v: BackboneCost(**v)) == fresh  # kept at other sizes: not comparable
    assert again.lowered == []


def test_the_store_switch(monkeypatch, tmp_path):
    monkeypatch.setenv(k.COST_STORE_VARIABLE, "off")
    assert k.KeptCosts.default({}, "m") is None
    monkeypatch.setenv(k.COST_STORE_VARIABLE, str(tmp_path))
    assert k.KeptCosts.default({}, "m").path == tmp_path / "m.json"
    monkeypatch.delenv(k.COST_STORE_VARIABLE)
    monkeypatch.setenv("DMLKIT_CACHE", str(tmp_path / "cache"))
    assert k.KeptCosts.default({}, "m").path == tmp_path / "cache" / "costs" / "m.json"


def test_least_stage_costs_take_each_count_s_smaller_seconds_and_the_counts_left_out_now():
    kept = [StageCost(3, 0.010, 0.040, 100), StageCost(4, 0.012, 0.020, 50), StageCost(5, 0.013, 0.001, 20)]
    fresh = [StageCost(3, 0.015, 0.030, 100), StageCost(5, 0.011, 0.002, 20)]  # 4 frozen left out by the allowance
    assert least_stage_costs(fresh, kept) == [StageCost(3, 0.010, 0.030, 100), StageCost(4, 0.012, 0.020, 50),
                                              StageCost(5, 0.011, 0.001, 20)]
    with pytest.raises(ValueError, match="another view size"):
        least_stage_costs([StageCost(3, 0.01, 0.01, 99)], kept)


def test_glyph_costs_fastest_matches_the_work():
    fresh, kept = GlyphCosts(0.10, 0.002, 1, 0.01), GlyphCosts(0.08, 0.003, 1, 0.02)
    assert fresh.fastest(kept) == GlyphCosts(0.08, 0.002, 1, 0.01)
    with pytest.raises(ValueError):
        fresh.fastest(GlyphCosts(0.08, 0.003, 2, 0.01))
    with pytest.raises(ValueError):
        fresh.fastest(GlyphCosts(0.08, 0.003, 1, 0.0))


def test_a_run_timed_under_load_reads_the_idle_run_s_costs_and_says_so(tmp_path, idle):
    path = tmp_path / "machine.json"
    idle_run = m.Measurements(costs=k.KeptCosts(path, {"cpu": "x"}))
    assert idle_run.measure("step cost", lambda: 1.0, lower=k.smaller_seconds) == 1.0
    loaded = m.Measurements(costs=k.KeptCosts(path, {"cpu": "x"}))
    assert loaded.measure("step cost", lambda: 1.4, lower=k.smaller_seconds) == 1.0  # 40 % more CPU time beside work
    assert loaded.tape == [{"name": "step cost", "value": 1.0}]  # what the plan read: a replay reads the same
    assert "1 cost(s) read at this machine's least kept timing" in loaded.keep()
    assert loaded.measure("untrained score", lambda: 0.7) == 0.7  # not a cost: never lowered
    replay = m.Measurements(loaded.tape, costs=k.KeptCosts(tmp_path / "other.json", {}))
    assert replay.measure("step cost", lambda: 9.0, lower=k.smaller_seconds) == 1.0
    assert not (tmp_path / "other.json").exists()  # a replay times nothing


def test_requests_share_their_machine_s_costs_even_with_no_plan_store(tmp_path, monkeypatch, idle):
    monkeypatch.setenv(m.STORE_VARIABLE, "off")
    monkeypatch.setenv(k.COST_STORE_VARIABLE, str(tmp_path))
    first = m.Measurements.for_request({"seed": 0}, torch.device("cpu"))
    first.measure("step cost", lambda: 1.0, lower=k.smaller_seconds)
    other = m.Measurements.for_request({"seed": 1}, torch.device("cpu"))
    assert other.measure("step cost", lambda: 2.0, lower=k.smaller_seconds) == 1.0
    assert other.store is None and len(list(tmp_path.glob("*.json"))) == 1


def test_seconds_spent_before_a_plan_read_the_least_of_the_same_request(tmp_path, monkeypatch, idle):
    monkeypatch.setenv(m.STORE_VARIABLE, "off")
    monkeypatch.setenv(k.COST_STORE_VARIABLE, str(tmp_path))
    idle_run = m.Measurements.for_request({"seed": 0}, torch.device("cpu"))
    assert idle_run.spent("seconds spent before the learning plan", 60.0) == 60.0
    loaded = m.Measurements.for_request({"seed": 0}, torch.device("cpu"))
    assert loaded.spent("seconds spent before the learning plan", 75.0) == 60.0  # decoding took more CPU time
    assert loaded.tape == [{"name": "seconds spent before the learning plan", "value": 60.0}]  # --plan replays it
    other = m.Measurements.for_request({"seed": 1}, torch.device("cpu"))
    assert other.spent("seconds spent before the learning plan", 75.0) == 75.0  # another request: its own
    assert m.Measurements(loaded.tape).spent("seconds spent before the learning plan", 99.0) == 60.0
    assert m.Measurements().spent("seconds spent before the learning plan", 99.0) == 99.0  # nothing kept: as read
