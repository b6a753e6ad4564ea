"""Read a finished run directory (config, metrics, log, test embeddings, environment).

The files are those the training engine writes (:mod:`dmlkit.engine.run_layout`); a report needs
``config.yaml``, ``metrics.json`` and ``log.jsonl`` (:data:`REQUIRED_FILES`) and uses ``env.json``,
``manifest.json`` and ``embeddings/test.npz`` when they are there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dmlkit.core.json_files import parse_json, read_json
from dmlkit.engine.run_layout import CONFIG_FILE, ENV_FILE, LOG_FILE, MANIFEST_FILE, METRICS_FILE, TEST_EMBEDDINGS_FILE
from dmlkit.exceptions import DataError, RecordError

REQUIRED_FILES = (CONFIG_FILE, METRICS_FILE, LOG_FILE)


class MissingRunFileError(DataError, FileNotFoundError):
    """A file every run directory must contain is absent (also a ``FileNotFoundError``)."""


@dataclass
class TestEmbeddings:
    """Test-set embeddings saved by the engine; optional arrays are ``None`` when absent."""

    embeddings: np.ndarray  # [N, D] float
    labels: np.ndarray  # [N] int64
    proxies: np.ndarray | None = None  # [P, D]
    proxy_labels: np.ndarray | None = None  # [P]
    thumbnails: np.ndarray | None = None  # [N, H, W] or [N, H, W, 3] uint8
    paths: np.ndarray | None = None  # [N] str
    class_names: np.ndarray | None = None  # [C] str: the original name of label c

    def label_name(self, label: int) -> str:
        """``class_names[label]`` when saved (``digit 7``, ``Greek/character03``), else ``class <label>``."""
        if self.class_names is not None and 0 <= label < len(self.class_names):
            return str(self.class_names[label])
        return f"class {label}"


@dataclass
class RunData:
    """Everything a report shows about one run."""

    run_dir: Path
    config: dict[str, Any]
    metrics: dict[str, Any]
    records: list[dict[str, Any]]
    env: dict[str, Any] | None = None
    embeddings: TestEmbeddings | None = None
    problems: dict[str, str] = field(default_factory=dict)  # optional file -> why it was not used
    split_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # split -> (classes, images)

    @property
    def name(self) -> str:
        """Run name from the config, else the directory name."""
        name = self.config.get("name")
        return str(name) if name not in (None, "") else self.run_dir.name

    def records_of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        """Log records with ``kind`` (and every ``match`` field equal), in file order."""
        return [
            r
            for r in self.records
            if r.get("kind") == kind and all(r.get(k) == v for k, v in match.items())
        ]

    def metric_values(self) -> dict[str, float | int]:
        """Numeric entries of ``metrics.json`` (everything except strings such as ``selected_on``);
        counts stay ints (``num_queries_excluded``, ``best_step``), so tables print ``1343``, not ``1343.0000``."""
        return {k: (v if isinstance(v, int) else float(v)) for k, v in self.metrics.items() if _is_number(v)}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(run_dir: Path, relative: str) -> Path:
    path = run_dir / relative
    if not path.is_file():
        raise MissingRunFileError(
            f"Run directory {str(run_dir)!r} has no {relative!r} (expected {str(path)!r})."
        )
    return path


def read_config(path: Path) -> dict[str, Any]:
    """Parse ``config.yaml``; it must be a YAML mapping."""
    import yaml

    from dmlkit.config.loading import decode_config_text, parse_yaml
    from dmlkit.exceptions import ConfigError

    try:  # as configs are read: no aliases, UTF-8 or UTF-16 with a byte-order mark
        config = parse_yaml(decode_config_text(path.read_bytes(), repr(str(path))))
    except ConfigError as exc:
        raise DataError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise DataError(f"{str(path)!r} is not valid YAML: {exc}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise DataError(f"{str(path)!r} must hold a YAML mapping. Got {type(config).__name__}.")
    return config


def read_json_object(path: Path) -> dict[str, Any]:
    """Parse a JSON file whose top level must be an object."""
    try:  # the one reader of records: nesting depth and finite numbers checked
        return read_json(path)
    except RecordError as exc:
        raise DataError(str(exc)) from None


def read_log(path: Path) -> list[dict[str, Any]]:
    """Parse ``log.jsonl``: one JSON object per non-blank line.

    A truncated last line (the run was killed mid-write) is dropped; a bad line elsewhere is
    an error naming the line.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = parse_json(line, f"{str(path)!r} line {i + 1}")
        except RecordError as exc:
            if i == last:
                break
            raise DataError(str(exc)) from None
        if not isinstance(record, dict):
            raise DataError(f"{str(path)!r} line {i + 1} must be a JSON object. Got {type(record).__name__}.")
        records.append(record)
    return records


def read_embeddings(path: Path) -> TestEmbeddings:
    """Load ``embeddings/test.npz`` and check the arrays agree in shape."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"{str(path)!r} could not be read as .npz: {exc}") from exc
    for key in ("embeddings", "labels"):
        if key not in arrays:
            raise DataError(f"{str(path)!r} has no {key!r} array (found {sorted(arrays)}).")
    embeddings = np.asarray(arrays["embeddings"])
    labels = np.asarray(arrays["labels"])
    if embeddings.ndim != 2 or not np.issubdtype(embeddings.dtype, np.floating):
        raise DataError(
            f"embeddings in {str(path)!r} must be a float [N, D] array. "
            f"Got {embeddings.dtype} of shape {embeddings.shape}."
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"labels in {str(path)!r} must be an integer [N] array. Got {labels.dtype} of shape {labels.shape}."
        )
    if labels.shape[0] != embeddings.shape[0]:
        raise DataError(f"embeddings has {embeddings.shape[0]} rows but labels has {labels.shape[0]}.")
    result = TestEmbeddings(embeddings=embeddings, labels=labels.astype(np.int64))
    proxies = arrays.get("proxies")
    if proxies is not None:
        if proxies.ndim != 2 or proxies.shape[1] != embeddings.shape[1]:
            raise DataError(
                f"proxies has shape {proxies.shape} but embeddings has {embeddings.shape[1]} columns."
            )
        proxy_labels = arrays.get("proxy_labels")
        if proxy_labels is not None and proxy_labels.shape != (proxies.shape[0],):
            raise DataError(f"proxies has {proxies.shape[0]} rows but proxy_labels has shape {proxy_labels.shape}.")
        result.proxies = proxies
        result.proxy_labels = None if proxy_labels is None else proxy_labels.astype(np.int64)
    thumbnails = arrays.get("thumbnails")
    if thumbnails is not None:
        if thumbnails.shape[:1] != labels.shape or thumbnails.ndim not in (3, 4):
            raise DataError(
                f"thumbnails has shape {thumbnails.shape} but must be [N, H, W] or [N, H, W, 3] "
                f"with N = {labels.shape[0]} (the rows of labels)."
            )
        result.thumbnails = thumbnails
    paths = arrays.get("paths")
    if paths is not None:
        if paths.shape != labels.shape:
            raise DataError(f"paths has {paths.shape[0] if paths.ndim else 0} entries but labels has {labels.shape[0]}.")
        result.paths = paths.astype(str)
    class_names = arrays.get("class_names")
    if class_names is not None and class_names.ndim == 1 and len(class_names) > int(labels.max(initial=-1)):
        result.class_names = class_names.astype(str)
    return result


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; a missing required file raises :class:`MissingRunFileError`.

    Optional pieces (``env.json``, ``embeddings/test.npz``) that are missing are left ``None``;
    a malformed optional file is also left ``None`` and explained in ``RunData.problems``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MissingRunFileError(f"Run directory {str(run_dir)!r} does not exist.")
    paths = {name: _require(run_dir, name) for name in REQUIRED_FILES}
    run = RunData(
        run_dir=run_dir,
        config=read_config(paths[CONFIG_FILE]),
        metrics=read_json_object(paths[METRICS_FILE]),
        records=read_log(paths[LOG_FILE]),
    )
    run.env = _optional(run, ENV_FILE, read_json_object)
    run.split_sizes = _optional(run, MANIFEST_FILE, lambda path: split_sizes(read_json_object(path))) or {}
    run.embeddings = _optional(run, TEST_EMBEDDINGS_FILE, read_embeddings)
    return run


def _optional(run: RunData, name: str, read: Callable[[Path], Any]) -> Any:
    """``read(run_dir / name)``; None when the file is absent, or malformed (said in ``run.problems[name]``)."""
    path = run.run_dir / name
    if not path.is_file():
        return None
    try:
        return read(path)
    except DataError as exc:
        run.problems[name] = str(exc)
        return None


def split_sizes(manifest: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``split -> (classes, images)`` of the splits ``manifest.json`` records (train, val, test, ...)."""
    sizes = {}
    for split, entry in manifest.items():
        if isinstance(entry, dict) and _is_number(entry.get("classes")) and _is_number(entry.get("size")):
            sizes[split] = (int(entry["classes"]), int(entry["size"]))
    return sizes


def flatten_mapping(mapping: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings to dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``)."""
    if not isinstance(mapping, dict):
        return {prefix: mapping} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten_mapping(value, dotted))
        else:
            flat[dotted] = value
    return flat

