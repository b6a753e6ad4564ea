"""scripts/gpu_check.sh and its Python half: a failing stage is a row of the summary, never the end of the run."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_helper():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage_files(work: Path, stages: str, results: dict, logs: dict) -> None:
    (work / "results").mkdir(parents=True)
    (work / "logs").mkdir()
    (work / "stages.tsv").write_text(stages)
    for name, data in results.items():
        (work / "results" / f"{name}.json").write_text(json.dumps(data))
    for name, text in logs.items():
        (work / "logs" / f"{name}.log").write_text(text)


def test_summary_judges_each_stage_against_its_target(tmp_path, capsys):
    gpu_check = load_helper()
    bench = {"device": "NVIDIA H200", "rows": [], "summary": {
        "median_ratio": 2.4, "slower_than_pml": ["ArcFaceLoss (B=256) 0.91x"], "errors": [], "evaluation_ratio": 25.0,
        "rows": 43}}
    stage_files(
        tmp_path / "work",
        "env\t0\t3.2\ndevice-tests\t0\t20.5\npml-suite\t0\t100.0\nbench\t0\t61.0\nmnist\t124\t60.0\nphoto-rates\t0\t30.0\n",
        {"env": {"result": "NVIDIA H200; torch 2.11.0", "met": True}, "bench": bench,
         "photo-rates": {"result": "step 2,900 img/s, embed 9,100 img/s", "met": True}},
        {"device-tests": "....\n26 passed in 9.1s\n",
         "pml-suite": "PML suite with dmlkit swapped in: 30/32 test files pass; 15 PML ...\n"
                      "PML suite with dmlkit swapped in: 31/32 test files pass; 15 PML ...\n"},
    )
    assert gpu_check.main(["summary", str(tmp_path / "work"), str(tmp_path / "out")]) == 0
    table = (tmp_path / "out" / "summary.md").read_text()
    assert table == capsys.readouterr().out.rstrip("\n") + "\n"
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "NVIDIA H200; torch 2.11.0" in table.splitlines()[0]
    assert rows["device-tests"].endswith("| yes |") and "26 passed" in rows["device-tests"]
    assert "61/64 test files pass with dmlkit swapped in (2 shards)" in rows["pml-suite"]
    assert rows["pml-suite"].endswith("| yes |")  # 3 files short: the documented allowance
    assert "median 2.40x over 43 rows" in rows["bench"] and "AccuracyCalculator 25.0x PML" in rows["bench"]
    assert rows["bench"].endswith("| NO |")  # one loss slower than PML
    assert rows["mnist"].startswith("| mnist | FAILED (timed out)") and rows["mnist"].endswith("| NO |")
    assert "| 60.0 |" in rows["mnist"] and "MNIST default <= 10 s wall" in rows["mnist"]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["mnist"]["exit"] == 124 and saved["pml-suite"]["passed"] == 61
    assert "total wall: 275 s over 6 stages" in table


def test_a_stage_that_fails_is_recorded_and_the_script_still_summarises(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--quick", "--only", "pml-suite,env",
         "--pml-suite", str(tmp_path / "nowhere"), "--out", str(out)],
        env={"PATH": "/usr/bin:/bin", "PY": sys.executable, "GPU_CHECK_WORK": str(tmp_path / "work"),
             "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    table = (out / "summary.md").read_text()
    assert "| pml-suite | FAILED (exit 2) no summary line (see logs.txt) |" in table
    assert f"no PML suite at {tmp_path / 'nowhere'}" in (out / "logs.txt").read_text()
    assert table.index("| env |") < table.index("| pml-suite |")  # every chosen stage ran, in order
    assert "| env | cpu; torch" in table


def test_a_runs_training_rate_is_read_from_its_log_leaving_the_first_step_out(tmp_path):
    gpu_check = load_helper()
    (tmp_path / "config.yaml").write_text("sampler:\n  batch_size: 60\n")
    records = [{"kind": "plan", "step": 0, "time": 0.5}, {"kind": "train", "step": 1, "time": 3.0},
               {"kind": "eval", "split": "val", "step": 5, "time": 3.5}, {"kind": "train", "step": 11, "time": 3.4}]
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    rate, batch = gpu_check.run_step_rate(tmp_path)
    assert batch == 60 and abs(rate - 1500.0) < 1e-6
    (tmp_path / "log.jsonl").write_text(json.dumps(records[1]) + "\n")
    assert gpu_check.run_step_rate(tmp_path) == (None, 60)  # one record: no interval to time


def test_the_default_stages_fit_eight_minutes_and_each_has_a_target():
    import re

    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    full = re.search(r"else\n  declare -A LIMIT=\((.*)\)\nfi", script).group(1)
    limits = {name: int(seconds) for name, seconds in re.findall(r"\[([a-z-]+)\]=([0-9]+)", full)}
    stages = re.search(r"^STAGES=\((.*)\)$", script, re.M).group(1).split()
    opt_in = re.search(r"^OPT_IN=\((.*)\)$", script, re.M).group(1).split()
    default = [s for s in stages if s not in opt_in]
    assert {"step-capture", "ddp", "mnist", "bench", "pml-suite"} <= set(default)
    assert sum(limits[s] for s in default) <= 480  # the setup's few seconds on top: within 8 minutes
    assert set(stages) <= set(load_helper().TARGETS)


def test_run_result_reports_the_first_import_apart_and_a_finished_run(tmp_path):
    gpu_check = load_helper()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("sampler:\n  batch_size: 64\n")
    (run / "metrics.json").write_text(json.dumps({"test": {"map_at_r": 0.6}}))
    out = tmp_path / "ddp.json"
    assert gpu_check.main(["run-result", "--run", str(run), "--wall", "8.5", "--first-import", "2.25", "--finished",
                           "--label", "2 ranks on cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["result"] == "2 ranks on cpu, wall 8.5 s, first import 2.2 s apart, MAP@R 0.600"
    assert result["met"] is True and result["first_import_s"] == 2.25
    (run / "metrics.json").unlink()
    gpu_check.main(["run-result", "--run", str(run), "--wall", "8.5", "--finished", "--json", str(out)])
    assert json.loads(out.read_text())["met"] is False  # no test metrics: the run did not finish
