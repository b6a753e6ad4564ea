"""Hostile and unlucky records: kept plans, ``--plan`` runs, run logs, CSV data, ``fit`` configs, paths and numbers.

Each case ends in one dmlkit error naming the file or value at fault and what was expected (exit code 2 through
the CLI, no traceback), and nothing is written through a link the run did not create. No case trains.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from pathlib import Path

import pytest

import dmlkit
from dmlkit.cli.main import main
from dmlkit.data.folder import read_csv_manifest, read_csv_rows
from dmlkit.engine import plan_records
from dmlkit.engine.run_dir import RunDirectory, claim_directory
from dmlkit.engine.run_log import run_log
from dmlkit.exceptions import ConfigError, DataError, RecordError
from dmlkit.recipe import measurements as m

MACHINE, REQUEST = {"cpu": "test"}, {"seed": 0}
GOOD_TAPE = [{"name": "glyph costs", "value": {"step": 0.02, "embed": 0.001}}, {"name": "seconds spent", "value": 1.5}]


def cli(capsys, *args: str) -> tuple[int, str]:
    """``dmlkit ARGS`` in this process: its exit code and stderr."""
    code = main(list(args))
    return code, capsys.readouterr().err


# ----------------------------------------------------------------------------- run files are never written through links


@pytest.fixture
def users_file(tmp_path) -> Path:
    path = tmp_path / "users-notes.txt"
    path.write_text("the user's own words\n")
    return path


def test_train_log_that_is_a_link_to_a_users_file_is_refused_and_the_file_untouched(tmp_path, users_file):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.log").symlink_to(users_file)
    with run_log() as log:
        logging.getLogger("dmlkit").warning("a message of the run")
        with pytest.raises(RecordError, match=r"train\.log' is a symbolic link; dmlkit writes this file itself"):
            log.open(run / "train.log")
    assert users_file.read_text() == "the user's own words\n"


def test_resume_with_train_log_linked_to_a_users_file_leaves_it_untouched(run_copy, users_file, capsys):
    (run_copy / "train.log").unlink(missing_ok=True)  # the fixture trained without the CLI
    (run_copy / "train.log").symlink_to(users_file)
    code, err = cli(capsys, "train", "--resume", str(run_copy), "--no-report")
    assert code == 2 and "train.log' is a symbolic link" in err and "Traceback" not in err, err
    assert users_file.read_text() == "the user's own words\n"


def test_train_log_that_is_a_folder_is_said(tmp_path):
    (tmp_path / "train.log").mkdir()
    with run_log() as log, pytest.raises(RecordError, match=r"train\.log' is a folder where dmlkit writes a file"):
        log.open(tmp_path / "train.log")


def test_metrics_log_that_is_a_link_or_a_hard_link_is_refused(tmp_path, users_file):
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    run.log_path.symlink_to(users_file)
    with pytest.raises(RecordError, match="symbolic link"):
        run.log({"kind": "train", "step": 1})
    run.log_path.unlink()
    os.link(users_file, run.log_path)
    with pytest.raises(RecordError, match="other hard links"):
        run.log({"kind": "train", "step": 1})
    assert users_file.read_text() == "the user's own words\n"


def test_train_log_that_is_a_fifo_never_blocks_the_run(tmp_path):
    os.mkfifo(tmp_path / "train.log")
    with run_log() as log, pytest.raises(RecordError, match=r"train\.log' is not a plain file"):
        log.open(tmp_path / "train.log")


def test_a_plain_train_log_is_still_appended(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("earlier session\n")
    with run_log() as log:
        log.open(path)
        logging.getLogger("dmlkit").warning("resumed")
    assert path.read_text().startswith("earlier session\n") and "resumed" in path.read_text()


def test_out_on_a_read_only_mount_is_said(tmp_path, monkeypatch):
    from dmlkit.engine import run_dir

    def read_only(path, obj):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(run_dir, "atomic_write_json", read_only)  # the machine cannot mount one for the test
    with pytest.raises(ConfigError, match=r"--out '.*ro': cannot write there \(Read-only file system\)"):
        claim_directory(tmp_path / "ro", "train")


# ----------------------------------------------------------------------------- kept plans: ignored whole, said


def _kept_file(store: m.PlanStore, content) -> Path:
    path = store.keep(MACHINE, REQUEST, GOOD_TAPE)
    record = json.loads(path.read_text())
    if callable(content):
        content(record)
        path.write_text(json.dumps(record))
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _measurements(value):
    return lambda record: record.update(measurements=value)


KEPT_CASES = {
    "tape of strings": (_measurements(["a", "b"]), r"tape entry 0 is 'a' \(str\); an object"),
    "tape of ints": (_measurements([1, 2]), r"tape entry 0 is 1 \(int\); an object"),
    "entry without value": (_measurements([{"name": "x"}]), r"tape entry 0 has no 'value'"),
    "entry with unknown key": (_measurements([{"name": "x", "value": 1, "bogus": 2}]), r"unknown 'bogus'"),
    "value a string": (_measurements([{"name": "x", "value": "1e308"}]), r"\(str\); a measurement holds numbers"),
    "huge value": (_measurements([{"name": "x", "value": 1e308}]), r"value is 1e\+308; a measurement's numbers are finite"),
    "negative cost": (_measurements([{"name": "x", "value": {"step": -0.5}}]), r"value\.step is -0\.5"),
    "tape missing": (lambda record: record.pop("measurements"), r"the tape is None \(NoneType\)"),
    "tape an int": (_measurements(7), r"the tape is 7 \(int\)"),
    "unknown top-level key": (lambda record: record.update(extra=1), r"keys 'extra', which dmlkit does not write"),
    "NaN": ('{"format": "%s", "machine": {"cpu": "test"}, "measurements": [{"name": "x", "value": NaN}]}'
            % m.TAPE_FORMAT, r"NaN is not a number a record may hold"),
    "deep nesting": ('{"a": ' * 100_000 + "1" + "}" * 100_000, r"nests lists or objects deeper than 32 levels"),
    "not UTF-8": (b"\xff\xfe{", r"is not UTF-8 text"),
}


@pytest.mark.parametrize("case", list(KEPT_CASES))
def test_a_kept_plan_that_fails_its_schema_is_ignored_with_a_warning(case, tmp_path, caplog):
    content, said = KEPT_CASES[case]
    store = m.PlanStore(tmp_path)
    path = _kept_file(store, content)
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        assert store.load(MACHINE, REQUEST) is None  # measured again: nothing of it replayed
    assert f"kept plan {path} does not read and is ignored" in caplog.text
    assert re.search(said, caplog.text), caplog.text


COST_CASES = {
    "not JSON": ("{costs", r"do not read"),
    "another format": (json.dumps({"format": "other", "costs": {}}), r"not a dmlkit-kept-costs-1 file"),
    "a negative cost": (json.dumps({"format": "dmlkit-kept-costs-1", "costs": {"embed": -1.0}}),
                        r"'embed': value is -1\.0; a measurement's numbers are finite"),
    "a string": (json.dumps({"format": "dmlkit-kept-costs-1", "costs": {"embed": "fast"}}), r"\(str\)"),
    "NaN": ('{"format": "dmlkit-kept-costs-1", "costs": {"embed": NaN}}', r"NaN is not a number"),
}


@pytest.mark.parametrize("case", list(COST_CASES))
def test_kept_costs_that_fail_their_schema_are_said_and_replaced_by_the_fresh_timing(case, tmp_path, caplog):
    from dmlkit.recipe.kept_costs import KeptCosts, smaller_seconds

    content, said = COST_CASES[case]
    path = tmp_path / "machine.json"
    path.write_text(content)
    costs = KeptCosts(path, MACHINE)
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        assert costs.lower("embed", 0.02, smaller_seconds, encode=float, decode=float) == 0.02  # never -1 or NaN
    assert f"kept costs {path} do not read" in caplog.text and re.search(said, caplog.text), caplog.text
    assert json.loads(path.read_text())["costs"] == {"embed": 0.02}


def test_a_kept_plan_replays_silently_and_an_edited_one_with_a_notice(tmp_path, caplog):
    store = m.PlanStore(tmp_path)
    path = store.keep(MACHINE, REQUEST, GOOD_TAPE)
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        assert store.load(MACHINE, REQUEST) == GOOD_TAPE
    assert not caplog.text
    record = json.loads(path.read_text())
    record["measurements"][1]["value"] = 0.5  # edited by hand: still a valid number
    path.write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        assert store.load(MACHINE, REQUEST)[1]["value"] == 0.5
    assert "was changed after dmlkit kept it" in caplog.text


def test_a_value_that_does_not_decode_stops_the_replay_with_the_measurement_named():
    from dmlkit.recipe.glyph_plan import GlyphCosts

    for value, said in (([0.1, 0.2], "argument after \\*\\* must be a mapping"),
                        ({"step": 0.1, "embed": 0.1, "bogus": 1}, "unexpected keyword argument 'bogus'")):
        replay = m.Measurements([{"name": "glyph costs", "value": value}], source="kept on this machine (F)")
        with pytest.raises(RecordError, match=r"the plan kept on this machine \(F\) cannot be replayed: its 'glyph "
                                              r"costs' holds .*--replan") as info:
            replay.measure("glyph costs", lambda: GlyphCosts(0.1, 0.1), decode=lambda kept: GlyphCosts(**kept))
        assert re.search(said, str(info.value))


# ----------------------------------------------------------------------------- --plan RUN: refused whole, said


def _resolved(tmp_path: Path, tape=None, request=None, text: str | None = None, seal: bool = True) -> Path:
    run = tmp_path / "earlier"
    run.mkdir(exist_ok=True)
    tape = GOOD_TAPE if tape is None else tape
    request = {"seed": 0, "train": {"max_steps": 2}} if request is None else request
    record = {"request": request, "measurements": {"format": m.TAPE_FORMAT, "tape": tape}}
    if seal:
        record[plan_records.SEAL_KEY] = plan_records.seal(request, tape)
    (run / "resolved.json").write_text(text if text is not None else json.dumps(record))
    return run


PLAN_CASES = {
    "tape of strings": (dict(tape=["x"]), r"tape entry 0 is 'x' \(str\)"),
    "tape of ints": (dict(tape=[3]), r"tape entry 0 is 3 \(int\)"),
    "entry without value": (dict(tape=[{"name": "x"}]), r"tape entry 0 has no 'value'"),
    "huge value": (dict(tape=[{"name": "x", "value": 1e308}]), r"1e\+308; a measurement's numbers are finite"),
    "negative cost": (dict(tape=[{"name": "x", "value": [0.1, -2]}]), r"value\[1\] is -2"),
    "tape missing": (dict(text=json.dumps({"request": {}, "measurements": {"format": m.TAPE_FORMAT}})),
                     r"the tape is None"),
    "tape an int": (dict(tape=5), r"the tape is 5 \(int\)"),
    "NaN": (dict(text='{"request": {}, "measurements": {"format": "%s", "tape": [{"name": "x", "value": NaN}]}}'
                 % m.TAPE_FORMAT), r"NaN is not a number a record may hold"),
    "lr Infinity in the request": (dict(text='{"request": {"optimizer": {"lr": Infinity}}, "measurements": {}}'),
                                   r"Infinity is not a number a record may hold"),
    "200k-deep resolved.json": (dict(text="[" * 200_000 + "]" * 200_000), r"deeper than 32 levels"),
    "a list": (dict(text="[]"), r"must hold a JSON object\. Got list"),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_a_plan_that_fails_its_schema_is_refused_through_the_cli(case, tmp_path, capsys):
    kwargs, said = PLAN_CASES[case]
    run = _resolved(tmp_path, **kwargs)
    code, err = cli(capsys, "train", "--plan", str(run), "--out", str(tmp_path / "new"))
    assert code == 2, err
    assert "resolved.json" in err and re.search(said, err), err
    assert "Traceback" not in err and not (tmp_path / "new").exists()


def test_plan_with_a_device_key_and_no_value_says_how_to_write_it(tmp_path, capsys):
    code, err = cli(capsys, "train", "--plan", str(_resolved(tmp_path)), "--set", "train.device")
    assert code == 2 and "Override 'train.device' must look like key.path=value" in err, err


def test_an_edited_plan_replays_only_with_a_notice(tmp_path, caplog):
    run = _resolved(tmp_path)
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        m.Measurements.from_run(run)
    assert not caplog.text
    data = json.loads((run / "resolved.json").read_text())
    data["request"]["loss"] = {"name": "contrastive"}  # another loss, written in by hand
    (run / "resolved.json").write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="dmlkit"):
        request, _ = m.Measurements.from_run(run)
    assert request["loss"] == {"name": "contrastive"}
    assert "its request or measurements were edited after the run wrote them" in caplog.text


# ----------------------------------------------------------------------------- numbers and paths refused at parse time


@pytest.mark.parametrize("override, said", [
    ("optimizer.lr=.inf", r"optimizer\.lr must be a finite number\. Got inf"),
    ("optimizer.lr=.nan", r"optimizer\.lr must be a finite number\. Got nan"),
    ("train.max_steps=1000000000000000000000000000000", r"train\.max_steps must be None or an int >= 1, at most 1000000000"),
    ("train.time_budget=1e30", r"train\.time_budget must be None or a float >= 1, at most 31622400"),
    ("model.frozen_stages=100000000000000000000000", r"model\.frozen_stages must be an int of at most 9223372036854775807"),
    ("eval.ks=[1,100000000000000000000000]", r"eval\.ks must be a non-empty list of ints >= 1, at most 16777216"),
    ("name=" + "n" * 300, r"name must be None or a text of at most 200 characters"),
    ("data.root=" + "r" * 5000, r"data\.root must be None or a path under 4096 bytes whose every name has at most 255"),
    ("data.root=" + "/".join(["d" * 300, "x"]), r"data\.root must be None or a path under 4096 bytes"),
])
def test_absurd_numbers_and_names_are_refused_before_anything_runs(override, said, capsys):
    code, err = cli(capsys, "validate", "--set", override)
    assert code == 2 and re.search(said, err), err
    assert "Traceback" not in err


def test_a_run_folder_that_cannot_be_made_is_said(tmp_path, monkeypatch):
    from dmlkit.cli.common import new_output_dir

    def too_long(self, *args, **kwargs):
        raise OSError(errno.ENAMETOOLONG, "File name too long", str(self))

    monkeypatch.setattr(Path, "mkdir", too_long)
    with pytest.raises(ConfigError, match=r"cannot create the folder .* \(File name too long\); choose the folder "
                                          r"with --out DIR"):
        new_output_dir(tmp_path / "runs", "name")


def test_a_path_too_long_for_the_file_system_is_said_through_the_cli(capsys):
    code, err = cli(capsys, "train", "--resume", "r" * 300)
    assert code == 2 and re.search(r"'r{40}\.\.\.r{8}/config\.yaml': a name too long \(at most 255 bytes a name", err), err
    assert "Traceback" not in err


@pytest.mark.parametrize("variable", ["DMLKIT_PLAN_STORE", "DMLKIT_CACHE"])
def test_a_home_of_an_unknown_user_is_said(variable, monkeypatch):
    monkeypatch.delenv(m.STORE_VARIABLE, raising=False)
    monkeypatch.setenv(variable, "~nosuchuser-of-dmlkit/plans")
    with pytest.raises(ConfigError, match=rf"{variable}='~nosuchuser-of-dmlkit/plans': the home folder of "
                                          r"'nosuchuser-of-dmlkit' is not known on this machine"):
        m.PlanStore.default()


def test_a_cost_store_under_an_unknown_home_is_said(monkeypatch):
    from dmlkit.recipe.kept_costs import COST_STORE_VARIABLE, KeptCosts

    monkeypatch.setenv(COST_STORE_VARIABLE, "~nosuchuser-of-dmlkit/costs")
    with pytest.raises(ConfigError, match=rf"{COST_STORE_VARIABLE}='~nosuchuser-of-dmlkit/costs': the home folder"):
        KeptCosts.default(MACHINE, "m")


# ----------------------------------------------------------------------------- CSV data


def test_csv_in_latin_1_is_refused_with_the_encoding_said(tmp_path):
    path = tmp_path / "manifest.csv"
    path.write_bytes("path,label\nimg/caf\u00e9.png,caf\u00e9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"is not UTF-8 text: it is another encoding \(byte 0xe9 on line 2; Latin-1"):
        read_csv_rows(path)
    path.write_bytes("path,label\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"it is UTF-16"):
        read_csv_rows(path)


def test_csv_field_over_the_limit_is_said_with_its_line(tmp_path):
    path = tmp_path / "manifest.csv"
    path.write_text("path,label\na.png,x\n" + "b" * 200_000 + ",y\n")
    with pytest.raises(DataError, match=r"csv: line 3 of .* cannot be read: field larger than field limit"):
        read_csv_rows(path)


def test_csv_with_a_byte_order_mark_is_read(tmp_path):
    from PIL import Image

    rows = ["path,label,split"]
    for split, classes in (("train", "ab"), ("test", "cd")):
        for cls in classes:
            for k in range(2):
                Image.new("RGB", (8, 8), (k * 40, 0, 0)).save(tmp_path / f"{cls}{k}.png")
                rows.append(f"{cls}{k}.png,{cls},{split}")
    (tmp_path / "manifest.csv").write_text("\n".join(rows) + "\n", encoding="utf-8-sig")  # as spreadsheets save it
    sources = read_csv_manifest(tmp_path)
    assert len(sources["train"].paths) == 4 and len(sources["test"].paths) == 4


# ----------------------------------------------------------------------------- dmlkit.fit's config sections


@pytest.mark.parametrize("kwargs, said", [
    (dict(config={"model": "small"}), r"the config section 'model' must be a dict of its settings .* Got 'small' \(str\)"),
    (dict(data=[1, 2]), r"the config section 'data' must be a dict of its settings .* Got \[1, 2\] \(list\)"),
    (dict(config=["train"]), r"config must be a dict of config sections .* Got \['train'\] \(list\)"),
    (dict(config={"model": None, "optimizer": None}, optimizer={"lr": float("inf")}),  # None sections: defaults
     r"optimizer\.lr must be a finite number\. Got inf"),
])
def test_fit_sections_that_are_not_mappings_are_said(kwargs, said, tmp_path):
    with pytest.raises(ConfigError, match=said):
        dmlkit.fit("small_cnn", None, [], out=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()

