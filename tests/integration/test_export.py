"""`dmlkit export`: TorchScript and ONNX files reproduce the run's embeddings on its test images."""

import importlib.util
import json

import numpy as np
import onnxruntime
import pytest
import torch

import dmlkit
from dmlkit.cli.main import main
from dmlkit.config import load_config
from dmlkit.engine.batches import fetch_batch
from dmlkit.engine.splits import build_splits
from dmlkit.engine.trained_model import load_run
from dmlkit.exceptions import ConfigError, InvalidParameterError
from dmlkit.export import ExportError, export_model, metadata_path_for
from dmlkit.recipe import Trainer

TOLERANCE = 1e-5
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("export") / "run"
    cfg = load_config(overrides=[
        "train.max_steps=3", "train.progress=false", "eval.clustering=false", "eval.save_embeddings=false",
        "train.num_threads=1",
    ])
    Trainer(cfg, run_dir, echo=lambda text: None).fit()
    return run_dir


@pytest.fixture(scope="module")
def test_images(tiny_run):
    """64 images of the run's test split: as the run's pipeline feeds them, and raw in [0, 1]."""
    cfg, model = load_run(tiny_run)
    test = build_splits(cfg, model).test
    rows = torch.linspace(0, len(test) - 1, 64).long()
    preprocessed, _ = fetch_batch(test, rows.tolist())
    return preprocessed, test.float_images(rows)


def onnx_embed(path, images: torch.Tensor) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    return out


def test_torchscript_matches_loaded_model_on_test_images(tiny_run, test_images, tmp_path):
    images, _ = test_images
    result = export_model(tiny_run, "torchscript", tmp_path / "embedder.pt")
    expected = dmlkit.load(tiny_run)(images).detach()
    extra = {"dmlkit.json": ""}
    scripted = torch.jit.load(str(result.path), _extra_files=extra)
    got = scripted(images).detach()
    assert got.shape == expected.shape == (64, 64)
    assert (got - expected).abs().max().item() <= TOLERANCE
    assert torch.allclose(got.norm(dim=1), torch.ones(64), atol=1e-5)  # L2-normalised like the original
    inside = json.loads(extra["dmlkit.json"])
    assert inside["input"]["shape"] == ["batch", 1, 28, 28] and inside["include_preprocessing"] is False
    sidecar = json.loads(metadata_path_for(result.path).read_text())
    assert sidecar["preprocessing"]["mean"] == pytest.approx([0.1307])
    assert 0 <= sidecar["check"]["max_abs_difference"] <= TOLERANCE


def test_onnx_matches_loaded_model_on_test_images(tiny_run, test_images, tmp_path):
    images, _ = test_images
    result = export_model(tiny_run, "onnx", tmp_path / "embedder.onnx")
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].name == "images" and session.get_inputs()[0].shape[0] == "batch"
    expected = dmlkit.load(tiny_run)(images).detach().numpy()
    for batch in (images, images[:5]):  # the batch axis is dynamic
        got = onnx_embed(result.path, batch)
        assert got.shape == (len(batch), 64)
        assert np.abs(got - expected[: len(batch)]).max() <= TOLERANCE
    assert result.max_abs_difference is not None and result.max_abs_difference <= TOLERANCE
    # the current exporter wherever onnxscript is installed (the `onnx` extra, so CI); else the fallback
    sidecar = json.loads(result.metadata_path.read_text())
    current = importlib.util.find_spec("onnxscript") is not None
    assert (sidecar["onnx_exporter"], sidecar["onnx_opset"]) == (("dynamo", 18) if current else ("torchscript", 17)), \
        sidecar.get("onnx_exporter_reason")


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_included_preprocessing_takes_raw_images(tiny_run, test_images, tmp_path, fmt):
    _, raw = test_images
    model = dmlkit.load(tiny_run)
    expected = model(model.preprocess(raw)).detach().numpy()
    result = export_model(tiny_run, fmt, tmp_path / f"raw.{fmt}", include_preprocessing=True)
    if fmt == "onnx":
        got = onnx_embed(result.path, raw)
    else:
        got = torch.jit.load(str(result.path))(raw).detach().numpy()
    assert np.abs(got - expected).max() <= TOLERANCE
    # the graph really normalises: feeding raw images to the plain model gives other embeddings
    assert np.abs(model(raw).detach().numpy() - expected).max() > 1e-3


def test_cli_writes_default_path_and_reports_check(tiny_run, capsys, monkeypatch):
    _onnxscript_installed(monkeypatch, False)  # the fallback: seconds, where the current exporter takes ten
    with pytest.warns(UserWarning, match="onnxscript is not installed"):
        assert main(["export", str(tiny_run), "--format", "onnx"]) == 0
    out = capsys.readouterr().out
    path = tiny_run / "export" / "embedder.onnx"
    assert path.is_file() and metadata_path_for(path).is_file()
    assert f"wrote onnx (the torchscript exporter): {path}" in out and "largest embedding difference" in out


def _onnxscript_installed(monkeypatch, installed: bool) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (find_spec("json") if installed else None) if name == "onnxscript" else find_spec(name, *a))


def test_without_onnxscript_the_fallback_exporter_says_why_and_is_recorded(tiny_run, test_images, tmp_path, monkeypatch):
    _onnxscript_installed(monkeypatch, False)
    with pytest.warns(UserWarning, match=r'TorchScript-based ONNX exporter, because onnxscript is not installed \(pip install "dmlkit\[onnx\]"\)'):
        result = export_model(tiny_run, "onnx", tmp_path / "legacy.onnx")
    sidecar = json.loads(result.metadata_path.read_text())
    assert (sidecar["onnx_exporter"], sidecar["onnx_opset"], result.onnx_exporter) == ("torchscript", 17, "torchscript")
    assert "onnxscript is not installed" in sidecar["onnx_exporter_reason"]
    assert result.max_abs_difference <= TOLERANCE


def test_a_failing_dynamo_export_falls_back_with_its_reason(tiny_run, tmp_path, monkeypatch):
    _onnxscript_installed(monkeypatch, True)

    def unsupported(*args):
        raise RuntimeError("torch.export cannot capture this graph\nmore detail")

    monkeypatch.setattr("dmlkit.export.write_onnx_dynamo", unsupported)
    with pytest.warns(UserWarning, match="because the dynamo exporter failed: RuntimeError: torch.export cannot capture this graph[.]"):
        result = export_model(tiny_run, "onnx", tmp_path / "fallback.onnx")
    assert json.loads(result.metadata_path.read_text())["onnx_exporter"] == "torchscript"
    assert result.max_abs_difference <= TOLERANCE


def test_bad_arguments_and_failed_check(tiny_run, tmp_path, monkeypatch, capsys):
    with pytest.raises(InvalidParameterError, match="'fmt' parameter of export_model must be one of"):
        export_model(tiny_run, "tflite", tmp_path / "m.tflite")
    with pytest.raises(ConfigError, match="not a dmlkit run directory"):
        export_model(tmp_path, "onnx", tmp_path / "m.onnx")
    assert main(["export", str(tmp_path / "missing"), "--format", "torchscript"]) == 2
    assert "not a dmlkit run directory" in capsys.readouterr().err
    # an exported file that does not reproduce the model is refused
    monkeypatch.setattr("dmlkit.export.run_exported", lambda path, fmt, images: torch.zeros(len(images), 64))
    with pytest.raises(ExportError, match="differs from the original"):
        export_model(tiny_run, "torchscript", tmp_path / "broken.pt")
