"""The machine's measurements: recorded in the order read, kept per machine and request, replayed exactly;
a busy machine (timings that disagree, a slower replay) keeps nothing."""

import json
from types import SimpleNamespace

import pytest

from dmlkit.exceptions import ConfigError
from dmlkit.recipe import measurements as m
from dmlkit.recipe.budget_planner import Speeds


def speeds_of(tape: m.Measurements, live: Speeds) -> Speeds:
    return tape.speeds("training speeds", live, step_seconds=lambda s: s.step_seconds,
                       encode=lambda s: [s.step_seconds, s.eval_seconds, s.test_seconds],
                       decode=lambda kept: Speeds(*kept))


@pytest.fixture
def idle(monkeypatch):
    monkeypatch.setattr(m, "load_problem", lambda: None)
    monkeypatch.setattr(m.timing.OtherWork, "cores", lambda self: None)  # the suite's other worker is not a load here


def test_spread_of_quartiles_and_small_samples():
    assert m.spread_of([1.0]) == 1.0
    assert m.spread_of([2.0, 1.0]) == 2.0
    assert m.spread_of([1.0, 1.0, 5.0]) == 1.0  # one cold pass of three
    assert m.spread_of([1.0, 2.0, 2.0]) == 2.0
    assert m.spread_of([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 9.0]) == 1.0  # one interruption is not a busy machine
    assert m.spread_of([1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]) == 2.0


def test_replay_returns_the_recorded_numbers_without_measuring(idle):
    first = m.Measurements()
    assert first.measure("cost", lambda: {"step": 0.25}) == {"step": 0.25}
    assert first.seconds("spent", 3.5) == 3.5
    assert speeds_of(first, Speeds(0.1, 2.0, 4.0)) == Speeds(0.1, 2.0, 4.0)
    assert first.seconds("spent", 9.0) == 9.0

    def must_not_run():
        raise AssertionError("a replay measured")

    again = m.Measurements(first.tape)
    assert again.measure("cost", must_not_run) == {"step": 0.25}
    assert again.seconds("spent", 100.0) == 3.5  # the kept reading, in order per name
    assert speeds_of(again, Speeds(0.11, 5.0, 5.0)) == Speeds(0.1, 2.0, 4.0)  # within SLOWER: the kept speeds
    assert again.seconds("spent", 100.0) == 9.0
    assert again.tape == first.tape and again.replaying and again.replayed == 4


def test_a_slower_replay_plans_from_its_own_speeds_and_keeps_nothing(tmp_path, idle):
    store = m.PlanStore(tmp_path)
    first = m.Measurements(store=store, machine={"cpu": "x"}, request={"seed": 0})
    speeds_of(first, Speeds(0.1))
    assert "kept in" in first.keep()
    kept = store.load({"cpu": "x"}, {"seed": 0})
    slow = m.Measurements(kept, source="kept", store=store, machine={"cpu": "x"}, request={"seed": 0})
    assert speeds_of(slow, Speeds(0.1 * m.SLOWER * 1.5)) == Speeds(0.1 * m.SLOWER * 1.5)
    assert not slow.replaying and "x the kept" in slow.notes[0]
    assert slow.keep().startswith("measurements: NOT kept")
    assert store.load({"cpu": "x"}, {"seed": 0}) == kept  # the idle machine's numbers stay


def test_plan_replay_does_not_check_speed():
    first = m.Measurements()
    speeds_of(first, Speeds(0.1))
    replay = m.Measurements(first.tape, check_speed=False)
    assert speeds_of(replay, Speeds(10.0)) == Speeds(0.1)


def test_timings_that_disagree_mark_the_machine_busy(tmp_path, idle):
    store = m.PlanStore(tmp_path)
    tape = m.Measurements(store=store, machine={"cpu": "x"}, request={"a": 1})
    tape.measure("cost", lambda: 1.0, timings=lambda _v: [[1.0, 3.0, 3.0]])
    assert tape.busy and "3.00x apart" in tape.busy[0]
    assert "NOT kept" in tape.keep()
    assert store.load({"cpu": "x"}, {"a": 1}) is None


def test_a_loaded_machine_is_said_busy(monkeypatch):
    monkeypatch.setattr(m, "load_problem", lambda: "load average 5.0 on 2 core(s)")
    tape = m.Measurements()
    tape.start()
    assert tape.busy == ["load average 5.0 on 2 core(s)"]


def test_store_is_per_machine_and_request_and_ignores_bad_files(tmp_path, caplog):
    store = m.PlanStore(tmp_path)
    path = store.keep({"cpu": "x"}, {"seed": 0}, [{"name": "a", "value": 1.0}])
    assert store.load({"cpu": "x"}, {"seed": 0}) == [{"name": "a", "value": 1.0}]
    assert store.load({"cpu": "y"}, {"seed": 0}) is None
    assert store.load({"cpu": "x"}, {"seed": 1}) is None
    path.write_text("{not json")
    assert store.load({"cpu": "x"}, {"seed": 0}) is None
    assert "does not read" in caplog.text


def test_running_out_of_kept_numbers_measures_the_rest(idle):
    tape = m.Measurements([{"name": "cost", "value": 2.0}])
    assert tape.measure("cost", lambda: 1.0) == 2.0
    assert tape.seconds("spent", 7.0) == 7.0  # a dry run kept no trainer numbers: measured now
    assert not tape.replaying and not tape.busy


def test_store_switch(monkeypatch, tmp_path):
    monkeypatch.setenv(m.STORE_VARIABLE, "off")
    assert m.PlanStore.default() is None
    monkeypatch.setenv(m.STORE_VARIABLE, str(tmp_path))
    assert m.PlanStore.default().root == tmp_path
    monkeypatch.delenv(m.STORE_VARIABLE)
    monkeypatch.setenv("DMLKIT_CACHE", str(tmp_path / "cache"))
    assert m.PlanStore.default().root == tmp_path / "cache" / "plans"


def test_from_run_reads_a_resolved_json_and_refuses_others(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError, match="no such file"):
        m.Measurements.from_run(tmp_path / "missing")
    (run / "resolved.json").write_text(json.dumps({"name": "old"}))
    with pytest.raises(ConfigError, match="no replayable plan"):
        m.Measurements.from_run(run)
    tape = [{"name": "spent", "value": 1.5}]
    (run / "resolved.json").write_text(json.dumps({"request": {"seed": 3}, "measurements": {
        "format": m.TAPE_FORMAT, "tape": tape}}))
    request, replay = m.Measurements.from_run(run)
    assert request == {"seed": 3}
    assert replay.seconds("spent", 99.0) == 1.5 and not replay.check_speed
    assert replay.keep().startswith("measurements: replayed (1 number(s) replayed from")


def test_a_faster_replay_plans_live_and_keeps_its_own_numbers(tmp_path, idle):
    """A tape measured under load replays slow steps: a run whose steps are SLOWER times faster plans live."""
    store = m.PlanStore(tmp_path)
    where = dict(store=store, machine={"cpu": "x"}, request={"seed": 0})
    first = m.Measurements(**where)
    speeds_of(first, Speeds(0.3))
    first.keep()
    fast = m.Measurements(store.load({"cpu": "x"}, {"seed": 0}), source="kept", **where)
    assert speeds_of(fast, Speeds(0.3 / m.SLOWER / 1.2)) == Speeds(0.3 / m.SLOWER / 1.2)
    assert not fast.replaying and "faster than the kept" in fast.notes[0]
    assert "kept in" in fast.keep()  # the faster machine's numbers replace the loaded one's
    assert store.load({"cpu": "x"}, {"seed": 0})[0]["value"] == [0.3 / m.SLOWER / 1.2, 0.0, 0.0]


def test_a_shared_machine_says_its_share_in_one_line_and_keeps_nothing(tmp_path, idle, monkeypatch):
    from dmlkit.engine import timing

    monkeypatch.setattr(timing, "LOAD", timing.LoadMeter())
    monkeypatch.setattr(timing, "threads_used", lambda: 2)
    store = m.PlanStore(tmp_path)
    tape = m.Measurements(store=store, machine={"cpu": "x"}, request={"seed": 0})
    said = []
    tape.progress = said.append
    # 1 s of wall time on 2 threads, of which the process got 0.9 s of CPU: the other work took the rest
    assert tape.measure("cost", lambda: timing.LOAD.add(0.9, 1.0, 2) or 0.25) == 0.25
    assert said == ["plan: measuring cost ..."]
    assert tape.load_share == pytest.approx(0.45)
    line = tape.shared()
    assert line.startswith("plan: machine is shared") and "CPU share 0.45 < 0.8" in line and "\n" not in line
    kept = tape.keep()
    assert kept.startswith("measurements: NOT kept") and "(CPU share while measuring: 0.45)" in kept
    assert store.load({"cpu": "x"}, {"seed": 0}) is None


def test_busy_cpu_seconds_reads_the_machine_s_busy_ticks_without_niced_work(tmp_path, monkeypatch):
    from dmlkit.engine import timing

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 50 30 1000 5 2 3 10 0 0\ncpu0 50 25 15 500 2 1 1 5 0 0\n")
    hz = __import__("os").sysconf("SC_CLK_TCK")
    monkeypatch.setattr(timing, "_niced", lambda: False)
    assert timing.busy_cpu_seconds(str(stat)) == pytest.approx((100 + 30 + 2 + 3 + 10) / hz)  # nice (50) yields
    monkeypatch.setattr(timing, "_niced", lambda: True)  # a niced run's own seconds are in the nice column
    assert timing.busy_cpu_seconds(str(stat)) == pytest.approx((100 + 50 + 30 + 2 + 3 + 10) / hz)
    stat.write_text("intr 1 2 3\n")
    assert timing.busy_cpu_seconds(str(stat)) is None
    assert timing.busy_cpu_seconds(str(tmp_path / "missing")) is None


def test_other_work_is_the_machine_s_busy_time_less_this_process_s(monkeypatch):
    from dmlkit.engine import timing

    clock = {"busy": 10.0, "own": 1.0, "wall": 100.0}
    monkeypatch.setattr(timing, "busy_cpu_seconds", lambda: clock["busy"])
    monkeypatch.setattr(timing, "time", SimpleNamespace(process_time=lambda: clock["own"],
                                                       perf_counter=lambda: clock["wall"]))
    others = timing.OtherWork().start()
    clock.update(busy=10.0 + 3.0, own=1.0 + 1.0, wall=100.0 + 2.0)  # 3 busy seconds in 2 s, 1 of them this process's
    assert others.cores() == pytest.approx(1.0)
    clock.update(wall=100.5)
    assert others.cores() is None  # under a second: too short to say
    assert timing.OtherWork().cores() is None  # never started


def test_a_competitor_beside_one_thread_probes_is_seen_by_the_machine_s_busy_time(tmp_path, idle, monkeypatch):
    from dmlkit.engine import timing

    monkeypatch.setattr(timing, "LOAD", timing.LoadMeter())
    monkeypatch.setattr(m, "usable_cpus", lambda: 2)
    monkeypatch.setattr(timing.OtherWork, "cores", lambda self: 1.0)
    store = m.PlanStore(tmp_path)
    tape = m.Measurements(store=store, machine={"cpu": "x"}, request={"seed": 0})
    tape.start()
    assert tape.measure("cost", lambda: timing.LOAD.add(1.0, 1.0, 1) or 0.25) == 0.25  # the probe got its core
    line = tape.shared()
    assert line.startswith("plan: machine is shared") and "other processes held 1.0 of the 2 core(s)" in line
    assert "CPU share 1.00" in line and "\n" not in line
    kept = tape.keep()
    assert kept.startswith("measurements: NOT kept") and "other processes' cores: 1.0" in kept
    assert store.load({"cpu": "x"}, {"seed": 0}) is None
    quiet = m.Measurements(store=store, machine={"cpu": "x"}, request={"seed": 0})
    monkeypatch.setattr(timing.OtherWork, "cores", lambda self: 0.3)  # under 1 - SHARED_BELOW of 2 cores
    quiet.start()
    quiet.measure("cost", lambda: timing.LOAD.add(1.0, 1.0, 1) or 0.25)
    assert quiet.shared() is None and "kept in" in quiet.keep()


def test_an_idle_share_keeps_the_tape(tmp_path, idle, monkeypatch):
    from dmlkit.engine import timing

    monkeypatch.setattr(timing, "LOAD", timing.LoadMeter())
    tape = m.Measurements(store=m.PlanStore(tmp_path), machine={"cpu": "x"}, request={"seed": 0})
    tape.measure("cost", lambda: timing.LOAD.add(1.9, 1.0, 2) or 0.25)
    assert tape.shared() is None and "kept in" in tape.keep()


def test_a_measurement_kept_off_the_tape_counts_work_not_the_wall_time_other_processes_took(monkeypatch):
    """The view size's embeddings beside a competing process: 10 wall seconds of which 3 were this process's
    CPU time on 1 thread count 3 s of the allowance on the CPU (the idle machine's cost), 10 s on a card."""
    clocks = {"wall": 100.0, "cpu": 50.0}
    monkeypatch.setattr(m.time, "perf_counter", lambda: clocks["wall"])
    monkeypatch.setattr(m.time, "process_time", lambda: clocks["cpu"])
    monkeypatch.setattr(m.timing, "threads_used", lambda: 1)

    def embed() -> str:
        clocks["wall"] += 10.0
        clocks["cpu"] += 3.0
        return "224 px"

    tape = m.Measurements()
    assert tape.counted(embed, "cpu") == "224 px" and tape.measuring == pytest.approx(3.0)
    assert tape.tape == []  # kept elsewhere: nothing added to the tape
    assert tape.counted(embed, "cuda:0") == "224 px" and tape.measuring == pytest.approx(13.0)
