"""``kill -9`` at seeded random points of ``dmlkit train`` (one kill while last.pt is being written), then resume.

The resumed run must end with exactly the weights, metrics and log of an uninterrupted run, and
a checkpoint that was being written when the process died must never be loaded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from dmlkit.engine.checkpoint_files import load_checkpoint

TRAIN_ARGS = [
    "--quiet", "--no-report",
    "--set", "train.max_steps=60",
    "--set", "train.checkpoint_every=5",
    "--set", "train.eval_every=20",
    "--set", "train.log_every=5",
    "--set", "eval.clustering=false",
    "--set", "eval.save_embeddings=false",
    "--set", "protocol.val_fraction=0.2",
    "--set", "sampler.batch_size=16",
    "--set", "sampler.m=4",
    "--set", "model.embedding_size=16",
    "--set", "data.name=digits",  # 8x8 digits: a process starts, trains and evaluates in seconds
]

#: Loaded at interpreter start-up through PYTHONPATH: makes the fsync of a ``last.pt`` temp file
#: slow, so the test can kill the process while the checkpoint is being written.
SLOW_FSYNC = '''
import os, time
_fsync = os.fsync
def _slow_fsync(fd):
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        name = ""
    if "/.last.pt." in name and name.endswith(".tmp"):
        time.sleep(float(os.environ.get("DMLKIT_TEST_FSYNC_DELAY", "0")))
    return _fsync(fd)
os.fsync = _slow_fsync
'''

POLL = 0.02


def _env(hooks: Path | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if hooks is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(hooks), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["DMLKIT_TEST_FSYNC_DELAY"] = "0.6"
    return env


def _start(args: list[str], hooks: Path | None, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "dmlkit", *args], stdout=out, stderr=subprocess.STDOUT,
                                env=_env(hooks))


def _wait_until(proc: subprocess.Popen, condition, timeout: float = 600) -> bool:
    """Poll ``condition()`` until true (returns True) or the process exits (returns False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return condition()
        time.sleep(POLL)
    raise AssertionError("timed out waiting for the training process")


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _last_logged_step(run: Path) -> int:
    path = run / "log.jsonl"
    if not path.exists():
        return 0
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            pass
    return max(steps, default=0)


def _temp_checkpoints(run: Path) -> list[Path]:
    return sorted((run / "checkpoints").glob(".last.pt.*.tmp")) if (run / "checkpoints").exists() else []


def _checkpoint_step(run: Path) -> int:
    return int(load_checkpoint(run / "checkpoints" / "last.pt")["step"])


def _strip_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def _read_log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_kill_9_at_random_points_then_resume_matches_uninterrupted_run(tmp_path):
    rng = random.Random(20261122)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_FSYNC)
    ref_dir, run_dir, log = tmp_path / "reference", tmp_path / "killed", tmp_path / "output.log"

    reference = _start(["train", "--out", str(ref_dir), *TRAIN_ARGS], None, tmp_path / "reference.log")
    kills = []

    # 1. fresh run: kill at a random moment after the first checkpoint exists
    proc = _start(["train", "--out", str(run_dir), *TRAIN_ARGS], hooks, log)
    assert _wait_until(proc, lambda: (run_dir / "checkpoints" / "last.pt").exists())
    time.sleep(rng.uniform(0.0, 1.0))
    _kill(proc)
    kills.append(("random after first checkpoint", _checkpoint_step(run_dir)))

    # 2. resume, then kill while a new last.pt is being written (its temp file exists, not yet renamed)
    before = _checkpoint_step(run_dir)
    proc = _start(["train", "--resume", str(run_dir), *TRAIN_ARGS[:2]], hooks, log)
    assert _wait_until(proc, lambda: bool(_temp_checkpoints(run_dir))), "no checkpoint write was observed"
    _kill(proc)
    orphans = _temp_checkpoints(run_dir)
    assert orphans, "the kill was meant to land during the checkpoint write"
    assert _checkpoint_step(run_dir) == before, "the interrupted write must not replace last.pt"
    kills.append(("during checkpoint write", before))

    # 3-4. resume and kill after a seeded random number of further logged steps
    for _ in range(2):
        start = max(_checkpoint_step(run_dir), _last_logged_step(run_dir))  # the log may run ahead of last.pt
        target = start + rng.randint(3, 12)
        proc = _start(["train", "--resume", str(run_dir), *TRAIN_ARGS[:2]], hooks, log)
        finished_early = not _wait_until(proc, lambda: _last_logged_step(run_dir) >= target)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            _kill(proc)
        assert not finished_early, "the run finished before the planned kill"
        kills.append((f"after logged step {target}", _checkpoint_step(run_dir)))

    # final resume runs to the end
    final = subprocess.run([sys.executable, "-m", "dmlkit", "train", "--resume", str(run_dir), *TRAIN_ARGS[:2]],
                           capture_output=True, text=True, env=_env(None), timeout=900)
    assert final.returncode == 0, final.stdout + final.stderr
    assert reference.wait(timeout=900) == 0, (tmp_path / "reference.log").read_text()

    assert len(kills) == 4 and all(step < 60 for _, step in kills), kills
    assert not _temp_checkpoints(run_dir), "stale checkpoint temp files are removed on resume"
    last_a = load_checkpoint(ref_dir / "checkpoints" / "last.pt")
    last_b = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert last_a["step"] == last_b["step"] == 60
    for part in ("model", "objective"):
        assert last_a[part].keys() == last_b[part].keys()
        for key in last_a[part]:
            assert torch.equal(last_a[part][key], last_b[part][key]), (part, key)
    best_a = load_checkpoint(ref_dir / "checkpoints" / "best.pt")
    best_b = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert best_a["step"] == best_b["step"]
    for key in best_a["model"]:
        assert torch.equal(best_a["model"][key], best_b["model"][key]), key
    metrics_a = json.loads((ref_dir / "metrics.json").read_text())
    metrics_b = json.loads((run_dir / "metrics.json").read_text())
    metrics_a.pop("train_seconds"), metrics_b.pop("train_seconds")
    assert metrics_a == metrics_b
    assert _strip_time(_read_log(ref_dir)) == _strip_time(_read_log(run_dir))
