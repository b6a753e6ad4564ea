"""Loading pretrained weights from local files, safely, with a report of what matched."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from dmlkit.exceptions import CheckpointError

WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "module")
#: The least share of a backbone's tensors pretrained weights must fill to count (a few may differ from the
#: file on purpose: a first convolution adapted to ``in_chans``, resized position embeddings; a file of
#: another architecture fills none). ``model.weights=PATH`` is the user's choice and is not held to it.
MIN_LOADED_FRACTION = 0.5
EMBEDDER_PREFIXES = ("trunk.", "pool.", "head.")


@dataclass
class WeightsReport:
    """What a weights file contributed to a module: loaded, missing and unexpected keys."""

    source: str
    target: str
    loaded_keys: list[str] = field(default_factory=list)
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every parameter and buffer of the target came from the file."""
        return not self.missing_keys

    def __str__(self) -> str:
        lines = [
            f"Loaded {len(self.loaded_keys)} tensors from {self.source} into {self.target}: "
            f"{len(self.missing_keys)} missing, {len(self.unexpected_keys)} unexpected."
        ]
        if self.missing_keys:
            lines.append("  missing (kept their initial values): " + _preview(self.missing_keys))
        if self.unexpected_keys:
            lines.append("  unexpected (ignored): " + _preview(self.unexpected_keys))
        return "\n".join(lines)


def _preview(keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a state_dict from ``path`` with ``torch.load(weights_only=True)`` on the CPU.

    Accepts a raw ``{name: tensor}`` dict or one wrapped as ``{"state_dict": ...}`` /
    ``{"model": ...}``; strips a DataParallel ``module.`` prefix. Raises
    :class:`CheckpointError` naming the file when it is missing or not a valid checkpoint.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"Weights file {path!r} is a folder, not a file; point model.weights at the "
                              "state_dict file (.pth / .pt) itself.")
    if not os.path.isfile(path):
        raise CheckpointError(f"Weights file {path!r} does not exist.")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as err:  # an untrusted file: whatever torch.load meets in it (pickle, zip, storage errors)
        reason = str(err)[:300] or type(err).__name__
        raise CheckpointError(
            f"Weights file {path!r} is not a valid PyTorch checkpoint readable with weights_only=True: {reason}"
        ) from err
    state = _unwrap(obj, path)
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def _unwrap(obj: Any, path: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping):
        for key in WRAPPER_KEYS:
            inner = obj.get(key)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                return {str(k): v for k, v in inner.items()}
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return {str(k): v for k, v in obj.items()}
    raise CheckpointError(
        f"Weights file {path!r} does not hold a state_dict: expected a mapping of names to tensors "
        f"(optionally under one of the keys {WRAPPER_KEYS}). Got {type(obj).__name__}"
        + (f" with keys {list(obj)[:8]}." if isinstance(obj, Mapping) else ".")
    )


def load_state_dict_with_report(
    module: nn.Module,
    state_dict: Mapping[str, torch.Tensor],
    *,
    source: str,
    strict: bool = False,
) -> WeightsReport:
    """Copy ``state_dict`` into ``module`` and report missing/unexpected keys.

    Shape mismatches and a file sharing no key with the module are always errors
    (:class:`CheckpointError`); with ``strict=True`` missing or unexpected keys are too.
    """
    target = type(module).__name__
    own = module.state_dict()
    matched = [k for k in state_dict if k in own]
    if state_dict and not matched:
        raise CheckpointError(
            f"None of the {len(state_dict)} tensors in {source} match {target}: the file has keys like "
            f"{_preview(list(state_dict), 4)} while the model has {_preview(list(own), 4)}."
        )
    mismatched = [
        f"{k}: file {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
        for k in matched
        if tuple(state_dict[k].shape) != tuple(own[k].shape)
    ]
    if mismatched:
        raise CheckpointError(f"Weights in {source} do not fit {target}; shape mismatches: " + "; ".join(mismatched))
    report = WeightsReport(
        source=source,
        target=target,
        loaded_keys=matched,
        missing_keys=[k for k in own if k not in state_dict],
        unexpected_keys=[k for k in state_dict if k not in own],
    )
    if strict and (report.missing_keys or report.unexpected_keys):
        raise CheckpointError(str(report))
    module.load_state_dict({k: state_dict[k] for k in matched}, strict=False)
    return report


def require_loaded(report: WeightsReport, what: str, note: str = "") -> WeightsReport:
    """``report`` when its file filled at least :data:`MIN_LOADED_FRACTION` of the target's tensors, else a
    :class:`CheckpointError` with the numbers (``what``: the weights' name; ``note``: what to do, appended)."""
    counted = [k for k in report.loaded_keys + report.missing_keys if not k.endswith("num_batches_tracked")]
    loaded = [k for k in report.loaded_keys if not k.endswith("num_batches_tracked")]
    if len(loaded) < MIN_LOADED_FRACTION * len(counted):
        raise CheckpointError(
            f"{what} in {report.source} filled {len(loaded)} of the {len(counted)} tensors of {report.target}, "
            f"fewer than the {MIN_LOADED_FRACTION:.0%} required: the file holds another model's weights, or a "
            f"part of these only (names like {_preview(report.unexpected_keys or report.loaded_keys, 3)}). {note}".rstrip())
    return report


def load_weights(module: nn.Module, path: str | os.PathLike, *, strict: bool = False) -> WeightsReport:
    """Load a local weights file into ``module`` (see :func:`read_state_dict`); returns the report."""
    return load_state_dict_with_report(module, read_state_dict(path), source=repr(os.fspath(path)), strict=strict)


def load_embedder_weights(embedder: nn.Module, path: str | os.PathLike, *, strict: bool = False) -> WeightsReport:
    """Load ``path`` into an Embedder: a full embedder state_dict, or trunk-only (backbone) weights.

    A file whose keys start with ``trunk.``/``head.`` is an embedder checkpoint; anything else is
    taken as backbone weights named as the architecture's original code names them (timm names
    for timm models, Caffe-style names for BN-Inception). Warns when keys are missing.
    """
    state = read_state_dict(path)
    source = repr(os.fspath(path))
    if any(k.startswith(EMBEDDER_PREFIXES) for k in state):
        target = embedder
    else:
        trunk = embedder.trunk
        target = trunk.weights_module() if hasattr(trunk, "weights_module") else trunk
    report = load_state_dict_with_report(target, state, source=source, strict=strict)
    if report.missing_keys:
        warnings.warn(str(report), UserWarning, stacklevel=3)
    return report
