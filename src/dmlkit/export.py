"""Export a run's embedding model as a standalone TorchScript or ONNX file.

The exported graph is the model of ``dmlkit.load(RUN_DIR)`` in eval mode. By default it takes
the same input as that model, ``[B, C, H, W]`` float32 images already preprocessed as the run's
data pipeline does it; with ``include_preprocessing=True`` the channel reorder, scaling and
mean/std normalisation of ``model.pretrained_cfg`` are part of the graph, so the input is raw
RGB (or grey) float32 images in ``[0, 1]`` at the size the run evaluated at (``RunEmbedder.input_size``;
resizing stays outside).
The batch axis is dynamic in both formats. Next to the file, ``<file>.json`` records the input
contract, the preprocessing config, the embedding size and the source run; the TorchScript file
also carries it inside (``torch.jit.load(path, _extra_files={"dmlkit.json": ""})``).

ONNX goes through PyTorch's current exporter (``torch.onnx.export(..., dynamo=True)``, opset
:data:`DYNAMO_OPSET`) when ``onnxscript`` is installed (the ``onnx`` extra); without it, or when that
exporter fails on a model, through the deprecated TorchScript-based one (opset :data:`ONNX_OPSET`),
with a warning that says why. The sidecar records which exporter wrote the file (``onnx_exporter``).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dmlkit import __version__
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.exceptions import DmlkitError, InvalidParameterError

FORMATS = ("torchscript", "onnx")
SUFFIXES = {"torchscript": ".pt", "onnx": ".onnx"}
#: Opset of the TorchScript-based exporter (the fallback).
ONNX_OPSET = 17
#: Opset of the dynamo exporter: the one its ONNX functions are written in, so no version conversion runs.
DYNAMO_OPSET = 18
INPUT_NAME = "images"
OUTPUT_NAME = "embeddings"


class ExportError(DmlkitError, RuntimeError):
    """The exported model could not be written or does not reproduce the original embeddings."""


class PreprocessAndEmbed(nn.Module):
    """Raw images ``[B, C, H, W]`` in ``[0, 1]`` -> the model's preprocessing -> embeddings ``[B, E]``.

    Same arithmetic as :func:`dmlkit.models.preprocessing.preprocess` without resizing: optional
    RGB->BGR flip, multiply by ``scale``, subtract ``mean`` and divide by ``std`` per channel.
    """

    def __init__(self, model: nn.Module, pretrained_cfg: dict[str, Any]):
        super().__init__()
        self.model = model
        self.flip_to_bgr = pretrained_cfg["color"] == "BGR"
        self.scale = float(pretrained_cfg["scale"])
        self.register_buffer("mean", torch.tensor(pretrained_cfg["mean"], dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(pretrained_cfg["std"], dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.flip(1) if self.flip_to_bgr else images
        return self.model((x * self.scale - self.mean) / self.std)


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_model` wrote and how closely the file reproduces the eager model."""

    path: Path
    metadata_path: Path
    format: str
    include_preprocessing: bool
    input_shape: tuple[int, ...]
    max_abs_difference: float | None
    #: which ONNX exporter wrote the file ("dynamo" or the fallback "torchscript"); None for TorchScript files
    onnx_exporter: str | None = None


def metadata_path_for(path: str | Path) -> Path:
    """The JSON sidecar of an exported file: ``model.onnx`` -> ``model.onnx.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def default_export_path(run_dir: str | Path, fmt: str) -> Path:
    """``RUN_DIR/export/embedder.pt`` (TorchScript) or ``RUN_DIR/export/embedder.onnx``."""
    return Path(run_dir) / "export" / f"embedder{SUFFIXES[fmt]}"


def probe_images(input_size: tuple[int, int, int], batch_size: int = 3, seed: int = 0) -> torch.Tensor:
    """A seeded batch ``[batch_size, C, H, W]`` of uniform values in ``[0, 1]`` (trace and check input)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((batch_size, *input_size), generator=generator, dtype=torch.float32)


def export_model(
    run_dir: str | Path,
    fmt: str = "torchscript",
    out_path: str | Path | None = None,
    *,
    checkpoint: str = "best",
    include_preprocessing: bool = False,
    atol: float = 1e-4,
) -> ExportResult:
    """Write the run's embedding model as TorchScript (``torch.jit.trace``) or ONNX, then check it.

    The check embeds a seeded probe batch (3 images, a batch size other than the one traced, so the
    dynamic batch axis is exercised) with the file and with the eager model; a largest absolute
    difference above ``atol`` raises :class:`ExportError`. ONNX files are checked with
    onnxruntime when it is installed (``max_abs_difference`` is None otherwise).
    """
    from dmlkit.inference import RunEmbedder

    if fmt not in FORMATS:
        raise InvalidParameterError(f"The 'fmt' parameter of export_model must be one of {FORMATS}. Got {fmt!r} instead.")
    if not isinstance(include_preprocessing, bool):
        raise InvalidParameterError(
            f"The 'include_preprocessing' parameter of export_model must be a bool. Got {include_preprocessing!r} instead."
        )
    if not (isinstance(atol, (int, float)) and atol > 0):
        raise InvalidParameterError(f"The 'atol' parameter of export_model must be a float > 0. Got {atol!r} instead.")
    run_dir = Path(run_dir)
    out_path = Path(out_path) if out_path is not None else default_export_path(run_dir, fmt)
    if out_path.is_dir():
        raise InvalidParameterError(f"The 'out_path' parameter of export_model names a folder ({str(out_path)!r}); "
                                    "give the file to write.")
    embedder = RunEmbedder.from_run(run_dir, checkpoint, device="cpu")
    cfg, model = embedder.cfg, embedder.model
    input_size = embedder.input_size  # the size the run evaluated at, not the model's nominal one
    pretrained_cfg = dict(model.pretrained_cfg, input_size=input_size)
    graph = PreprocessAndEmbed(model, pretrained_cfg) if include_preprocessing else model
    graph.eval()
    example = probe_images(input_size, batch_size=2, seed=1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    metadata = export_metadata(run_dir, cfg, checkpoint, fmt, include_preprocessing, pretrained_cfg, model)
    if fmt == "torchscript":
        with _quiet_torch_deprecations():
            write_torchscript(graph, example, out_path, metadata)
    else:
        metadata.update(write_onnx(graph, example, out_path))
    probe = probe_images(input_size, batch_size=3, seed=2)
    with _quiet_torch_deprecations():
        difference = max_difference(graph, probe, out_path, fmt)
    if difference is not None and not difference <= atol:
        raise ExportError(
            f"The exported {fmt} model differs from the original by {difference:.3g} (> atol={atol:g}) on a probe batch; "
            f"{out_path} is not trustworthy."
        )
    metadata["check"] = {"max_abs_difference": difference, "atol": atol, "probe_batch_size": 3}
    metadata_path = metadata_path_for(out_path)
    atomic_write_json(metadata_path, metadata)
    return ExportResult(out_path, metadata_path, fmt, include_preprocessing, (-1, *input_size), difference,
                        metadata.get("onnx_exporter"))


@contextlib.contextmanager
def _quiet_torch_deprecations():
    """Silence torch's notices that TorchScript is deprecated, around the TorchScript format's own calls only.

    ``--format torchscript`` asks for a TorchScript file, which ``torch.jit.trace`` / ``save`` / ``load``
    still write and read in this torch; the notices would only repeat on every export. The ONNX fallback
    is not silenced: its deprecation is the user's to see.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=FutureWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def export_metadata(run_dir, cfg, checkpoint, fmt, include_preprocessing, pretrained_cfg, model) -> dict[str, Any]:
    """The sidecar record: input contract, preprocessing, output, source run."""
    channels, height, width = (int(v) for v in pretrained_cfg["input_size"])
    if include_preprocessing:
        expects = "raw images, channels in RGB order (or one grey channel), float32 in [0, 1], already resized"
    else:
        expects = "images preprocessed as in the run's data pipeline (see 'preprocessing'), float32"
    return {
        "format": fmt,
        "dmlkit_version": __version__,
        "torch_version": torch.__version__,
        "source_run": str(run_dir.resolve()),
        "checkpoint": checkpoint,
        "model_name": cfg.model.name,
        "input": {"name": INPUT_NAME, "shape": ["batch", channels, height, width], "dtype": "float32", "expects": expects},
        "output": {"name": OUTPUT_NAME, "shape": ["batch", int(getattr(model, "embedding_size", -1))],
                   "dtype": "float32", "normalization": getattr(model, "normalization", None)},
        "include_preprocessing": include_preprocessing,
        "preprocessing": {k: list(v) if isinstance(v, tuple) else v for k, v in pretrained_cfg.items()},
        "onnx_opset": None,  # set with "onnx_exporter" by write_onnx
    }


@contextlib.contextmanager
def _temporary_beside(out_path: Path):
    """A temporary name beside ``out_path``, renamed over it when the block succeeds and deleted when it fails."""
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    try:
        yield tmp
        tmp.replace(out_path)
    finally:
        tmp.unlink(missing_ok=True)


def write_torchscript(graph: nn.Module, example: torch.Tensor, out_path: Path, metadata: dict) -> None:
    """Trace ``graph`` on ``example`` and save it with the metadata as an extra file."""
    with torch.no_grad():
        traced = torch.jit.trace(graph, (example,), check_trace=False)
    extra = {"dmlkit.json": json.dumps(metadata, sort_keys=True)}
    with _temporary_beside(out_path) as tmp:
        torch.jit.save(traced, str(tmp), _extra_files=extra)


def write_onnx(graph: nn.Module, example: torch.Tensor, out_path: Path) -> dict[str, Any]:
    """Export ``graph`` to ONNX with a dynamic batch axis; returns what the sidecar records of the exporter.

    The dynamo exporter when ``onnxscript`` is installed; else, or when it fails on this model, the
    TorchScript-based one, with a warning naming the reason.
    """
    import importlib.util

    if importlib.util.find_spec("onnxscript") is None:
        reason = 'onnxscript is not installed (pip install "dmlkit[onnx]")'
    else:
        try:
            write_onnx_dynamo(graph, example, out_path)
            return {"onnx_exporter": "dynamo", "onnx_opset": DYNAMO_OPSET}
        except Exception as exc:  # an operator or control flow torch.export cannot capture
            reason = f"the dynamo exporter failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    warnings.warn(f"{out_path.name}: exported with the deprecated TorchScript-based ONNX exporter, because {reason}.",
                  UserWarning, stacklevel=3)
    with warnings.catch_warnings():
        # shapes traced as constants: the probe check at another batch size is what tells (export_model)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        write_onnx_torchscript(graph, example, out_path)
    return {"onnx_exporter": "torchscript", "onnx_opset": ONNX_OPSET, "onnx_exporter_reason": reason}


def write_onnx_dynamo(graph: nn.Module, example: torch.Tensor, out_path: Path) -> None:
    """``torch.onnx.export(..., dynamo=True)``: the graph captured by ``torch.export``, batch axis symbolic."""
    batch = torch.export.Dim("batch")
    with torch.no_grad(), _temporary_beside(out_path) as tmp:
        program = torch.onnx.export(
            graph, (example,), dynamo=True, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: batch},), opset_version=DYNAMO_OPSET, verbose=False,
        )
        program.save(str(tmp))


def write_onnx_torchscript(graph: nn.Module, example: torch.Tensor, out_path: Path) -> None:
    """Export ``graph`` to ONNX (opset 17, dynamic batch axis) with the TorchScript-based exporter."""
    with torch.no_grad(), _temporary_beside(out_path) as tmp:
        torch.onnx.export(
            graph,
            (example,),
            str(tmp),
            dynamo=False,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            opset_version=ONNX_OPSET,
            do_constant_folding=True,
        )


def run_exported(path: str | Path, fmt: str, images: torch.Tensor) -> torch.Tensor | None:
    """Embeddings ``[B, E]`` of ``images`` from an exported file (None: ONNX without onnxruntime)."""
    if fmt == "torchscript":
        module = torch.jit.load(str(path), map_location="cpu")
        with torch.no_grad():
            return module(images).float()
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run([OUTPUT_NAME], {INPUT_NAME: images.numpy()})
    return torch.from_numpy(output)


def max_difference(graph: nn.Module, images: torch.Tensor, path: Path, fmt: str) -> float | None:
    """Largest absolute difference between the eager ``graph`` and the exported file on ``images``."""
    with torch.no_grad():
        expected = graph(images).float()
    got = run_exported(path, fmt, images)
    if got is None:
        return None
    if got.shape != expected.shape:
        raise ExportError(f"The exported {fmt} model returns shape {tuple(got.shape)} but the original {tuple(expected.shape)}.")
    return float((got - expected).abs().max())


__all__ = [
    "ExportError",
    "ExportResult",
    "FORMATS",
    "PreprocessAndEmbed",
    "default_export_path",
    "export_model",
    "metadata_path_for",
    "run_exported",
]
