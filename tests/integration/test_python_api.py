"""dmlkit.fit from a user's script: own model and Dataset, SIGKILL and exact resume, PML objects, MLflow and W&B."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys

import pytest
import torch

import dmlkit

#: A user's whole training script (own nn.Module, own Dataset); KILL_AT=n kills it with SIGKILL at step n.
SCRIPT = '''
import os, signal, sys, torch
from torch import nn
from sklearn.datasets import load_digits
import dmlkit
from dmlkit.losses import ProxyAnchorLoss

class Digits(torch.utils.data.Dataset):  # any map-style Dataset of (image, label)
    def __init__(self, classes):
        d = load_digits(); keep = [i for i, t in enumerate(d.target) if t in classes]
        self.images, self.targets = torch.tensor(d.images[keep], dtype=torch.float32)[:, None] / 16, d.target[keep].tolist()
    def __len__(self): return len(self.targets)
    def __getitem__(self, i): return self.images[i], self.targets[i]

class Net(nn.Module):  # any module from images to embeddings
    def __init__(self):
        super().__init__(); self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    def forward(self, x): return nn.functional.normalize(self.body(x), dim=1)

class KillAt(dmlkit.Callback):  # SIGKILL mid-run, as a crash would
    def on_step_end(self, trainer, step, metrics):
        if step == int(os.environ.get("KILL_AT", -1)): os.kill(os.getpid(), signal.SIGKILL)

torch.manual_seed(0)
model, loss = Net(), ProxyAnchorLoss(num_classes=5, embedding_size=16)
result = dmlkit.fit(model, loss, Digits(range(5)), val_data=Digits([5, 6]), test_data=Digits([7, 8, 9]), out=sys.argv[1],
                    callbacks=[KillAt()], train={"max_steps": 12, "eval_every": 4, "checkpoint_every": 3, "progress": False},
                    sampler={"batch_size": 32}, eval={"clustering": False})
print("map_at_r", result.test_metrics["map_at_r"], result.steps)
'''

#: What the script trains, for the tests that run in this process: ``Digits`` and ``Net``.
USER_CLASSES: dict = {}
exec(SCRIPT.split("torch.manual_seed")[0], USER_CLASSES)

SMALL = dict(train={"max_steps": 12, "eval_every": 4, "checkpoint_every": 100, "progress": False},
             sampler={"batch_size": 32}, eval={"clustering": False}, echo=lambda _: None)


def run_script(path, out, **env) -> subprocess.CompletedProcess:
    environment = dict(os.environ, OMP_NUM_THREADS="1", **env)
    return subprocess.run([sys.executable, str(path), str(out)], capture_output=True, text=True, timeout=300,
                          env=environment)


def test_a_user_script_killed_with_sigkill_resumes_to_the_same_weights(tmp_path):
    assert len(SCRIPT.strip().splitlines()) <= 30
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    whole = run_script(script, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    killed = run_script(script, tmp_path / "killed", KILL_AT="7")
    assert killed.returncode == -signal.SIGKILL
    assert torch.load(tmp_path / "killed" / "checkpoints" / "last.pt", weights_only=True)["step"] == 6
    assert not (tmp_path / "killed" / "metrics.json").exists()
    resumed = run_script(script, tmp_path / "killed")  # the same script again: it continues the checkpoint
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step 6" in resumed.stderr  # no logging configured: fit shows its key lines on stderr
    assert "resumed from step 6" in (tmp_path / "killed" / "train.log").read_text()
    final = [torch.load(tmp_path / run / "checkpoints" / "last.pt", weights_only=True) for run in ("whole", "killed")]
    assert final[0]["step"] == final[1]["step"] == 12
    for part in ("model", "objective"):
        for name, tensor in final[0][part].items():
            assert torch.equal(tensor, final[1][part][name]), (part, name)
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("whole", "killed")]
    for m in metrics:
        m.pop("train_seconds")
    assert metrics[0] == metrics[1] and 0 < metrics[0]["map_at_r"] <= 1
    assert (tmp_path / "killed" / "report.html").exists()


def test_pytorch_metric_learning_arcface_and_miner_objects_train(tmp_path):
    from pytorch_metric_learning.losses import ArcFaceLoss
    from pytorch_metric_learning.miners import MultiSimilarityMiner

    digits, net = USER_CLASSES["Digits"], USER_CLASSES["Net"]
    torch.manual_seed(0)
    loss = ArcFaceLoss(num_classes=5, embedding_size=16)
    before = loss.W.detach().clone()
    result = dmlkit.fit(net(), loss, digits(range(5)), val_data=digits([5, 6]), test_data=digits([7, 8, 9]),
                        miner=MultiSimilarityMiner(), out=tmp_path, report=False, **SMALL)
    assert result.steps == 12 and 0 < result.test_metrics["map_at_r"] <= 1
    assert not torch.equal(loss.W.detach(), before)  # ArcFace's class weights were optimised
    saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    groups = {g["name"]: g for g in saved["optimizer"]["param_groups"]}
    assert groups["loss"]["lr"] == pytest.approx(groups["head"]["lr"] * 100)  # the proxy learning rate
    assert torch.equal(saved["objective"]["loss.W"], loss.W.detach())
    config = (tmp_path / "config.yaml").read_text()
    assert "object:pytorch_metric_learning.losses.arcface_loss.ArcFaceLoss" in config
    assert "object:pytorch_metric_learning.miners.multi_similarity_miner.MultiSimilarityMiner" in config


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One training with ``train.loggers=[mlflow, wandb]`` (W&B offline: no network)."""
    out = tmp_path_factory.mktemp("tracked")
    digits, net = USER_CLASSES["Digits"], USER_CLASSES["Net"]
    from dmlkit.losses import ProxyAnchorLoss

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        torch.manual_seed(0)
        small = {**SMALL, "train": {**SMALL["train"], "loggers": ["mlflow", "wandb"]}}
        dmlkit.fit(net(), ProxyAnchorLoss(num_classes=5, embedding_size=16), digits(range(5)), val_data=digits([5, 6]),
                   test_data=digits([7, 8, 9]), out=out, **small)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return out, [(r["step"], r["map_at_r"]) for r in log if r.get("split") == "val"]


def test_mlflow_run_holds_the_recipe_the_metrics_and_the_artifacts(tracked_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    out, val = tracked_run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())  # the file store in the run directory
    [run] = client.search_runs([client.get_experiment_by_name("dmlkit").experiment_id])
    params = run.data.params
    assert params["sampler.m"] == "16" and params["protocol.val_class_fraction"] == "0.0"  # filled by the recipe
    assert params["train.max_steps"] == "12" and params["loss.name"].endswith("ProxyAnchorLoss")
    history = client.get_metric_history(run.info.run_id, "val/map_at_r")
    assert [m.step for m in history] == [s for s, _ in val] == [4, 8, 12]  # one value per validation
    assert [m.value for m in history] == pytest.approx([v for _, v in val])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [10]  # train.log_every=10
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    artifacts |= {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert {"report.html", "metrics.json", "config.yaml", "checkpoints/best.pt"} <= artifacts
    assert run.info.status == "FINISHED"


def wandb_records(path) -> list:
    """The protobuf records of an offline ``run-*.wandb`` file (LevelDB-style log: 32 KiB blocks, 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last fragment of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_is_written_with_config_metrics_and_artifacts(tracked_run):
    out, val = tracked_run
    [path] = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    records = wandb_records(path)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["sampler.m"] == "16" and config["train.max_steps"] == "12"
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    logged = [(h["_step"], h["val/map_at_r"]) for h in history if "val/map_at_r" in h]
    assert [s for s, _ in logged] == [s for s, _ in val]
    assert [v for _, v in logged] == pytest.approx([v for _, v in val])
    [artifact] = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert {"report.html", "checkpoints/best.pt"} <= {entry.path for entry in artifact.manifest.contents}


def test_a_model_name_and_the_config_loss_with_a_user_dataset(tmp_path):
    digits = USER_CLASSES["Digits"]
    result = dmlkit.fit("small_cnn", None, digits(range(5)), test_data=digits([7, 8, 9]), out=tmp_path, report=False,
                        config={"model": {"args": {"width": 8}}, "loss": {"name": "multi_similarity"}},
                        train={"max_steps": 2, "progress": False}, sampler={"batch_size": 32},
                        eval={"clustering": False}, echo=lambda _: None)
    assert result.steps == 2 and 0 < result.test_metrics["map_at_r"] <= 1
    config = (tmp_path / "config.yaml").read_text()
    assert "name: small_cnn\n" in config and "name: multi_similarity\n" in config and "augment: none" in config


def test_fit_claims_its_folder_and_never_writes_over_a_users_files(tmp_path):
    """The object API: ``out`` holding the user's own files is refused, every file left as it was."""
    from dmlkit.exceptions import ConfigError

    digits = USER_CLASSES["Digits"]
    (tmp_path / "config.yaml").write_text("# my own config, comments and all\n")
    (tmp_path / "notes.txt").write_bytes(b"\x00keep me")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError, match="is not empty and is not a dmlkit train run"):
        dmlkit.fit("small_cnn", None, digits(range(5)), test_data=digits([7, 8, 9]), out=tmp_path, report=False,
                   train={"max_steps": 2, "progress": False}, echo=lambda _: None)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
