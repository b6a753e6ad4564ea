"""`dmlkit sweep`: Optuna trials scored on validation MAP@R, resumable from the SQLite study."""

import json
import shutil

import optuna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dmlkit.cli.main import main
from dmlkit.config import RunConfig, config_to_dict, load_config, parse_override
from dmlkit.exceptions import ConfigError
from dmlkit.sweep import best_trial_overrides, config_overrides, parse_param, run_sweep
from dmlkit.sweep.space import ParamSpec, render_value
from dmlkit.sweep.study import make_sampler, storage_url

BASE = [
    "protocol.val_fraction=0.2", "train.max_steps=2", "eval.clustering=false", "eval.save_embeddings=false",
    "train.num_threads=1", "data.name=digits",  # 8x8 digits: trials of seconds; the sweep's logic is the same
]
PARAMS = ["loss.args.margin=float:0.01:0.5:log", "optimizer.lr=float:1e-4:1e-2:log"]


def cli_args(out, trials: int) -> list[str]:
    args = ["sweep", "--out", str(out), "--trials", str(trials)]
    for text in BASE:
        args += ["--set", text]
    for text in PARAMS:
        args += ["--param", text]
    return args


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    lines = []
    result = run_sweep(load_config(overrides=BASE), [parse_param(p) for p in PARAMS], out, trials=3, echo=lines.append)
    assert result.trials_run == 3 and result.trials_done == 3
    assert sum(line.startswith("trial ") for line in lines) == 3
    return out


def read_summary(out) -> dict:
    return json.loads((out / "sweep.json").read_text())


def test_three_trials_score_validation_map_at_r_only(sweep_dir):
    summary = read_summary(sweep_dir)
    trials = summary["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2] and all(t["state"] == "COMPLETE" for t in trials)
    assert (sweep_dir / "study.db").is_file() and (sweep_dir / "base_config.yaml").is_file()
    for t in trials:
        run = sweep_dir / t["run_dir"]
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        val = [r["map_at_r"] for r in log if r["kind"] == "eval" and r["split"] == "val"]
        assert val and t["value"] == pytest.approx(max(val))  # the objective is the best validation MAP@R
        assert not any(r.get("split") == "test" for r in log) and not (run / "metrics.json").exists()
        assert (run / "checkpoints" / "best.pt").is_file()
        assert 0.01 <= t["params"]["loss.args.margin"] <= 0.5 and 1e-4 <= t["params"]["optimizer.lr"] <= 1e-2
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["loss"]["args"]["margin"] == t["params"]["loss.args.margin"]
        assert cfg["optimizer"]["lr"] == t["params"]["optimizer.lr"]
    best = max(trials, key=lambda t: t["value"])
    assert summary["best"]["number"] == best["number"] and summary["best"]["value"] == best["value"]
    assert len({t["params"]["optimizer.lr"] for t in trials}) == 3


def test_report_plots_each_parameter_and_ranks_trials(sweep_dir, capsys):
    from dmlkit.sweep import write_sweep_report

    html = write_sweep_report(sweep_dir).read_text()
    assert html.count('src="data:image/png;base64,') == 4  # history, one per parameter, the pair
    assert "loss.args.margin" in html and "optimizer.lr" in html and "Best trials" in html
    best = read_summary(sweep_dir)["best"]
    assert f"{best['value']:.4f}" in html


def test_rerun_resumes_and_runs_only_missing_trials(sweep_dir, capsys):
    before = read_summary(sweep_dir)["trials"]
    assert main(cli_args(sweep_dir, 4)) == 0
    shown = capsys.readouterr()  # the sweep's progress is logged (stderr); its result printed (stdout)
    assert "3 trial(s) done, running 1 more" in shown.err and "report:" in shown.out
    after = read_summary(sweep_dir)["trials"]
    assert [t["number"] for t in after] == [0, 1, 2, 3]
    assert [t["value"] for t in after[:3]] == [t["value"] for t in before]
    assert main(cli_args(sweep_dir, 4)) == 0  # already complete: nothing runs
    assert "4 trial(s) done, running 0 more" in capsys.readouterr().err
    assert len(read_summary(sweep_dir)["trials"]) == 4


def test_interrupted_trial_is_continued_from_its_checkpoint(sweep_dir, capsys):
    summary = read_summary(sweep_dir)
    done = summary["trials_done"]
    source = summary["trials"][0]
    # a process that died mid-trial leaves a RUNNING trial and a partial run directory behind
    study = optuna.load_study(study_name="dmlkit-sweep", storage=storage_url(sweep_dir))
    specs = [parse_param(p) for p in PARAMS]
    study.enqueue_trial(source["params"])
    dead = study.ask()
    for spec in specs:
        spec.suggest(dead)  # takes the queued values: the dead trial trained the source's config
    shutil.copytree(sweep_dir / source["run_dir"], sweep_dir / "trials" / str(dead.number))
    assert main(cli_args(sweep_dir, done + 1)) == 0
    out = capsys.readouterr().err  # the sweep's progress: logged
    assert f"trial {dead.number} was interrupted" in out and f"continuing interrupted trial {dead.number}" in out
    trials = {t["number"]: t for t in read_summary(sweep_dir)["trials"]}
    assert trials[dead.number]["state"] == "FAIL" and trials[dead.number]["interrupted"]
    (rerun,) = [t for t in trials.values() if t["resumed_from"] == dead.number]
    assert rerun["state"] == "COMPLETE" and rerun["params"] == trials[dead.number]["params"]
    # the copied run had finished its 2 steps: continuing it restores the source's best score exactly
    assert rerun["params"] == source["params"] and rerun["value"] == source["value"]
    assert not (sweep_dir / "trials" / str(dead.number)).exists()  # moved into the rerun's directory
    assert read_summary(sweep_dir)["trials_done"] == done + 1


def test_best_trial_overrides_round_trip(sweep_dir):
    overrides = best_trial_overrides(sweep_dir)
    assert "protocol.val_fraction=0.2" in overrides
    rebuilt = config_to_dict(load_config(overrides=overrides))
    best = read_summary(sweep_dir)["best"]
    saved = yaml.safe_load((sweep_dir / best["run_dir"] / "config.yaml").read_text())
    for cfg in (rebuilt, saved):
        cfg.pop("name")
        cfg["train"].pop("progress")
    from dmlkit.recipe.rules import RECIPE_FIELDS

    for path in RECIPE_FIELDS:  # left to the recipe: resolved from the same data when the rerun starts
        section, key = path.split(".")
        assert rebuilt[section][key] in (None, "auto", {}, saved[section][key])  # {}: model.args the recipe fills
        rebuilt[section][key] = saved[section][key]
    assert rebuilt == saved
    assert rebuilt["loss"]["args"]["margin"] == best["params"]["loss.args.margin"]
    assert config_overrides(RunConfig()) == []


def test_sweep_without_validation_split_is_refused(tmp_path, capsys):
    out = tmp_path / "s"
    args = ["sweep", "--out", str(out), "--param", PARAMS[0], "--trials", "1"]
    assert main(args) == 2
    assert "needs a validation split" in capsys.readouterr().err
    assert not out.exists()  # refused before any trial or database


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("loss.args.margin", "must look like PATH=float:LOW:HIGH"),
        ("loss.args.margin=flaot:0.1:0.5", "unknown type 'flaot'. Did you mean 'float'?"),
        ("loss.args.margin=float:0.5:0.1", "LOW (0.5) must be smaller than HIGH (0.1)"),
        ("loss.args.margin=float:0:0.5:log", "a log range needs LOW > 0"),
        ("asap.proxies_per_class=int:1:x", "'x' is not an int"),
        ("loss.name=choice:", "choice needs a comma-separated list"),
    ],
)
def test_bad_param_syntax(spec, message):
    with pytest.raises(ConfigError) as info:
        parse_param(spec)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("optimizer.lrr=float:1e-4:1e-2", "'optimizer.lrr' is not a config field. Did you mean 'optimizer.lr'"),
        ("loss.args.margn=float:0.1:0.5", "has no argument 'margn'. Did you mean 'loss.args.margin'?"),
        ("protocol.fold=int:0:3", "the protocol defines the objective"),
        ("loss.args=float:0.1:0.5", "is a mapping; search one of its keys"),
        ("optimizer.lr=float:-1:0.1", "optimizer.lr must be None or a float > 0. Got -1.0"),
        ("asap.proxies_per_class=float:1:4", "asap.proxies_per_class must be int"),
    ],
)
def test_bad_param_paths_and_ranges_fail_before_training(tmp_path, spec, message):
    out = tmp_path / "s"
    with pytest.raises(ConfigError) as info:
        run_sweep(load_config(overrides=BASE), [parse_param(spec)], out, trials=1)
    assert message in str(info.value)
    assert not out.exists()


def test_gp_sampler_searches_lambda_and_proxies_per_class():
    """The GP sampler on a synthetic lambda x K surface (ASAP Fig. 2 shape): draws stay in range."""
    specs = [parse_param("asap.proximal_lambda=float:1e-5:1e-1:log"), parse_param("asap.proxies_per_class=int:1:8")]
    study = optuna.create_study(direction="maximize", sampler=make_sampler("gp", seed=0, startup_trials=3))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(lambda t: -abs(specs[0].suggest(t) - 1e-3) - abs(specs[1].suggest(t) - 4), n_trials=6)
    for t in study.trials:
        assert 1e-5 <= t.params["asap.proximal_lambda"] <= 1e-1 and 1 <= t.params["asap.proxies_per_class"] <= 8
        assert isinstance(t.params["asap.proxies_per_class"], int)


floats = st.floats(min_value=1e-8, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(low=floats, span=floats, log=st.booleans())
def test_param_spec_text_round_trips(low, span, log):
    high = low + span
    if not low < high:
        return
    spec = ParamSpec("optimizer.lr", "float", low=low, high=high, log=log)
    assert parse_param(spec.text()) == spec


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(floats, st.integers(-10**6, 10**6), st.booleans(), st.none(),
                       st.text(alphabet="abcxyz_-", min_size=1, max_size=8),
                       st.dictionaries(st.sampled_from(["margin", "alpha"]), floats, max_size=2)))
def test_rendered_values_read_back_as_overrides(value):
    _, parsed = parse_override(f"loss.args.margin={render_value(value)}")
    assert parsed == value and type(parsed) is type(value)


def test_choice_values_are_typed():
    assert parse_param("optimizer.lr=choice:1e-4,0.001").choices == (1e-4, 0.001)
    assert parse_param("loss.name=choice:proxy_anchor,proxy_nca").choices == ("proxy_anchor", "proxy_nca")
    assert parse_param("asap.enabled=choice:true,false").choices == (True, False)


class FakeTrial:
    """Records reported values; asks to prune once a score falls below ``threshold``."""

    def __init__(self, threshold: float):
        self.threshold, self.reported = threshold, []

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return self.reported[-1][1] < self.threshold


class FakeTrainer:
    def __init__(self, step):
        self.step, self.should_stop = step, False


def test_trial_report_reports_every_validation_and_stops_pruned_trials():
    from dmlkit.engine.callbacks import Callback
    from dmlkit.sweep.study import TrialReport

    report = TrialReport(FakeTrial(threshold=0.3), prune=True)
    assert isinstance(report, Callback)  # the sweep's part is a callback of a plain Trainer
    first, second = FakeTrainer(10), FakeTrainer(20)
    report.on_evaluation_end(first, 10, {"map_at_r": 0.5})
    assert not first.should_stop and not report.pruned
    report.on_evaluation_end(second, 20, {"map_at_r": 0.2})
    assert second.should_stop and report.pruned
    assert report.trial.reported == [(10, 0.5), (20, 0.2)]
    watching = TrialReport(FakeTrial(threshold=0.3), prune=False)
    third = FakeTrainer(10)
    watching.on_evaluation_end(third, 10, {"map_at_r": 0.1})
    assert not third.should_stop and not watching.pruned


def test_a_trial_records_its_steps_and_selection(sweep_dir):
    trial = json.loads((sweep_dir / "trials" / "0" / "trial.json").read_text())
    assert trial["steps"] == trial["schedule"]["steps_taken"] == 2 and trial["selected_on"] == "val"
    assert trial["val_map_at_r"] == pytest.approx(read_summary(sweep_dir)["trials"][0]["value"])
