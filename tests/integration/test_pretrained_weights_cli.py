"""``model.pretrained=true`` for a timm backbone through the real CLI: offline without weights, then from a filled cache."""

import hashlib
import json


def test_resnet50_pretrained_offline_without_a_cache_is_one_message_and_exit_2(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    proc = cli("train", "--out", str(out), "--quiet", "--set", "model.name=resnet50", "--set", "model.pretrained=true",
               check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("dmlkit train: error: No pretrained weights for model 'resnet50' here")
    assert str(tmp_path / "hf" / "hub") in proc.stderr and "model.weights=PATH" in proc.stderr
    assert not out.exists()


def test_a_cached_timm_backbone_trains_and_the_run_records_its_hash(tmp_path, hf_cache, cli, quick_args):
    _, path = hf_cache("test_resnet", "test_resnet.r160_in1k")
    listing = cli("train", "--list-backbones").stdout
    assert any(line.split()[:2] == ["test_resnet.r160_in1k", "yes"] for line in listing.splitlines()), listing
    assert any(line.split()[:2] == ["resnet50", "no"] for line in listing.splitlines()), listing
    out = tmp_path / "run"
    cli("train", "--out", str(out), *quick_args, "--set", "train.max_steps=3", "--no-report",
               "--set", "model.name=test_resnet", "--set", "model.pretrained=true", "--set", "model.shift_average=0",
               "--set", "protocol.val_class_fraction=0")  # no validation: only the 3 steps and the test split
    assert "pretrained weights: test_resnet.r160_in1k from Hugging Face timm/test_resnet.r160_in1k" in (out / "train.log").read_text()
    recorded = json.loads((out / "manifest.json").read_text())["pretrained_weights"]
    assert recorded["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert recorded["tag"] == "test_resnet.r160_in1k" and recorded["path"] == str(path)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 3 and 0.0 <= metrics["map_at_r"] <= 1.0
