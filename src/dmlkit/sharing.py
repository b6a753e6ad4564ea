"""Share a trained run as a Hugging Face model repository and load it back (``dmlkit push``, ``dmlkit.load``).

A shared folder is what a model repository holds: the run's ``config.yaml`` (how to build the model),
``model.safetensors`` (the selected weights: tensors only, nothing to unpickle), ``preprocessing.json``
(the evaluation input the run embedded its test split with), ``metrics.json``, ``resolved.json`` and a
model card (``README.md``) written from them, and ``dmlkit.json`` (format, dmlkit version, the config's
fingerprint and the weights' digest, so a folder whose files do not belong together is refused).

``push_run(run_dir, repo_id)`` writes that folder and uploads it through ``huggingface_hub``;
``download("hf://user/repo")`` fetches a snapshot (the Hub's own cache) and ``load_shared(folder)`` builds the
model of a folder on disk; ``dmlkit.load`` and :class:`dmlkit.inference.RunEmbedder` do both. The Hub client is
passed in (``api=`` / ``snapshot=``), so tests run against a local directory and never touch the network.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from dmlkit.engine import run_layout as layout
from dmlkit.exceptions import CheckpointError, ConfigError, DmlkitError

#: Tag of the folder layout below; a folder with another tag is refused, not half-read.
SHARED_FORMAT = "dmlkit-shared-1"
WEIGHTS = "model.safetensors"
INFO = "dmlkit.json"
PREPROCESSING = "preprocessing.json"
#: Files copied from the run directory as they are (the first one is required).
CARRIED = (layout.CONFIG_FILE, layout.METRICS_FILE, layout.RESOLVED_FILE)
HF_PREFIX = "hf://"
#: The metrics the model card's table shows, in this order, when the run has them.
CARD_METRICS = ("precision_at_1", "recall_at_1", "recall_at_4", "r_precision", "map_at_r", "nmi")


class HubError(DmlkitError, RuntimeError):
    """Pushing to or pulling from the Hugging Face Hub failed (login, repository name, network)."""


def _hub():
    """The ``huggingface_hub`` module, or a message naming the extra that installs it."""
    from dmlkit.core.extras import require

    return require("huggingface_hub", "hub", "sharing on the Hugging Face Hub")


def is_shared_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by :func:`write_shared_folder` (or downloaded from a pushed repo)."""
    return (Path(path) / INFO).is_file()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_shared_folder(run_dir: str | Path, folder: str | Path, *, checkpoint: str = "best",
                        repo_id: str | None = None) -> Path:
    """Write ``folder`` (new or empty) with what a model repository of run ``run_dir`` holds; returns it."""
    from safetensors.torch import save_file

    from dmlkit import __version__
    from dmlkit.config.schema import config_to_dict
    from dmlkit.engine.checkpoint_files import atomic_write_json, atomic_write_text, config_fingerprint, load_checkpoint
    from dmlkit.engine.trained_model import load_run_config, read_eval_input

    if checkpoint not in ("best", "last"):
        raise ConfigError(f"checkpoint must be 'best' or 'last'. Got {checkpoint!r}.")
    run_dir, folder = Path(run_dir), Path(folder)
    cfg = load_run_config(run_dir)  # refuses a folder that is not a run directory, naming it
    checkpoint_path = run_dir / layout.checkpoint_file(checkpoint)
    state = load_checkpoint(checkpoint_path)
    fingerprint = config_fingerprint(config_to_dict(cfg))
    if state.get("fingerprint") != fingerprint:
        raise CheckpointError(
            f"{checkpoint_path} was written by a different configuration than {run_dir / layout.CONFIG_FILE}."
        )
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{str(folder)!r} is not empty: give a new folder for the shared files.")
    folder.mkdir(parents=True, exist_ok=True)
    # safetensors wants contiguous tensors that share no storage (tied weights are saved once per name)
    weights = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in state["model"].items()}
    partial = folder / (WEIGHTS + ".partial")
    save_file(weights, str(partial), metadata={"format": "pt", "dmlkit": SHARED_FORMAT})
    partial.replace(folder / WEIGHTS)
    for name in CARRIED:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, folder / name)
    # only the evaluation input: the manifest also lists every training file's path and label
    atomic_write_json(folder / PREPROCESSING, {"eval_input": read_eval_input(run_dir)})
    info = {"format": SHARED_FORMAT, "dmlkit_version": __version__, "checkpoint": checkpoint,
            "fingerprint": fingerprint, "weights_sha256": _digest(folder / WEIGHTS)}
    atomic_write_json(folder / INFO, info)
    atomic_write_text(folder / "README.md", model_card(run_dir, folder, repo_id=repo_id))
    return folder


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError:
        return {}


def model_card(run_dir: str | Path, folder: str | Path, *, repo_id: str | None = None) -> str:
    """The repository's README.md: what the model was trained on, how, what it scored, how to load it."""
    from dmlkit.engine.trained_model import load_run_config

    run_dir, folder = Path(run_dir), Path(folder)
    cfg = load_run_config(run_dir)
    metrics = _read_json(run_dir / layout.METRICS_FILE)
    resolved = _read_json(run_dir / layout.RESOLVED_FILE)
    command = _read_json(run_dir / layout.ENV_FILE).get("command") or []
    eval_input = _read_json(folder / PREPROCESSING).get("eval_input") or {}
    name = repo_id or cfg.name
    data = resolved.get("parts", {}).get("data") or cfg.data.name
    loss_args = ", ".join(f"{k}={v}" for k, v in sorted((cfg.loss.args or {}).items()))
    size = eval_input.get("size") or eval_input.get("input_size")
    lines = [
        "---",
        "library_name: dmlkit",
        "pipeline_tag: image-feature-extraction",
        "tags:", "- dmlkit", "- metric-learning", "- image-retrieval",
        "---", "",
        f"# {name}", "",
        f"An image embedding model trained with [dmlkit](https://pypi.org/project/dmlkit/) (`{cfg.name}`): "
        f"`{cfg.model.name}` giving {cfg.model.embedding_size}-D embeddings"
        f"{' (L2-normalised)' if cfg.model.normalization == 'l2' else ''}, so that images of one class lie close.",
        "",
        "## Training", "",
        f"- data: {data} (data set `{cfg.data.name}`, labels `{cfg.data.label}`; the test classes are not trained on)",
        f"- loss: `{cfg.loss.name}`" + (f" ({loss_args})" if loss_args else ""),
        f"- optimiser: `{cfg.optimizer.name}`, lr {cfg.optimizer.lr}; steps: {metrics.get('steps', 'n/a')}, "
        f"seed {cfg.seed}; weights: `{_read_json(folder / INFO).get('checkpoint', 'best')}` checkpoint "
        f"(selected on {metrics.get('selected_on', 'n/a')})",
    ]
    if command:
        # the first element is the interpreter's script path, which says nothing about the run
        lines.append(f"- command: `dmlkit {' '.join(str(a) for a in command[1:])}`")
    lines += [
        "", "## Preprocessing", "",
        f"Images are read as `{eval_input.get('mode', 'RGB')}` and resized to {size} "
        f"(`{eval_input.get('resize', 'n/a')}`), as the run embedded its test split; `dmlkit.load` and "
        "`RunEmbedder` apply it (`preprocessing.json`).",
        "", "## Test metrics", "",
    ]
    rows = [(key, metrics[key]) for key in CARD_METRICS if isinstance(metrics.get(key), (int, float))]
    if rows:
        lines += ["| metric | value |", "| --- | --- |", *(f"| {key} | {value:.4f} |" for key, value in rows)]
    else:
        lines.append("The run recorded no test metrics.")
    lines += [
        "", "## Use", "",
        "```python", "import dmlkit", "",
        f'model = dmlkit.load("{HF_PREFIX}{name}")   # pip install "dmlkit[hub]"',
        "embeddings = model(images)   # images preprocessed as above, [B, C, H, W]",
        "```", "",
    ]
    return "\n".join(lines)


def _hub_call(what: str, repo_id: str, call: Callable[[], Any]) -> Any:
    """Run a Hub call; its errors become one :class:`HubError` naming the repository and what to check."""
    try:
        return call()
    except DmlkitError:
        raise
    except Exception as exc:  # HfHubHTTPError, RepositoryNotFoundError, OSError of the network, ...
        raise HubError(
            f"{what} {repo_id!r} failed: {type(exc).__name__}: {exc}. Check the repository name (user/name), "
            "that you are logged in (`hf auth login` or HF_TOKEN) with write access, and the network."
        ) from None


def _check_repo_id(repo_id: str) -> str:
    repo_id = repo_id.removeprefix(HF_PREFIX)
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or any(c.isspace() for c in repo_id):
        raise ConfigError(f"REPO_ID must look like 'user/name' (a Hugging Face model repository). Got {repo_id!r}.")
    return repo_id


def push_run(run_dir: str | Path, repo_id: str, *, checkpoint: str = "best", private: bool = False,
             token: str | None = None, commit_message: str | None = None, api: Any = None) -> str:
    """Upload run ``run_dir`` as model repository ``repo_id`` (created when missing); returns its address.

    ``api`` is a ``huggingface_hub.HfApi`` (default: one with ``token``, else the saved login).
    """
    repo_id = _check_repo_id(repo_id)
    if api is None:
        api = _hub().HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="dmlkit-push-") as tmp:
        folder = write_shared_folder(run_dir, Path(tmp) / "repo", checkpoint=checkpoint, repo_id=repo_id)
        _hub_call("creating", repo_id, lambda: api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True))
        message = commit_message or f"dmlkit push {Path(run_dir).name} ({checkpoint} checkpoint)"
        _hub_call("uploading to", repo_id, lambda: api.upload_folder(
            folder_path=str(folder), repo_id=repo_id, repo_type="model", commit_message=message))
    return f"https://huggingface.co/{repo_id}"


def download(source: str, *, token: str | None = None, snapshot: Callable[..., str] | None = None) -> Path:
    """The local folder of ``hf://user/name[@revision]``: a snapshot in the Hub's cache."""
    repo_id, _, revision = source.removeprefix(HF_PREFIX).partition("@")
    repo_id = _check_repo_id(repo_id)
    if snapshot is None:
        snapshot = _hub().snapshot_download
    path = _hub_call("downloading", repo_id, lambda: snapshot(
        repo_id=repo_id, revision=revision or None, token=token, repo_type="model"))
    return Path(path)


def load_shared(folder: str | Path, overrides=()):
    """``(config, model)`` of a shared folder, the weights read with safetensors (no unpickling)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from dmlkit.config import load_config
    from dmlkit.config.schema import config_to_dict
    from dmlkit.engine.checkpoint_files import config_fingerprint
    from dmlkit.engine.model import build_model
    from dmlkit.models import has_offline_weights

    folder = Path(folder)
    info = _read_json(folder / INFO)
    if info.get("format") != SHARED_FORMAT:
        raise CheckpointError(f"{folder / INFO} is not a dmlkit shared model ({SHARED_FORMAT}); got {info.get('format')!r}.")
    if not (folder / layout.CONFIG_FILE).is_file() or not (folder / WEIGHTS).is_file():
        raise CheckpointError(f"{folder} lacks {layout.CONFIG_FILE} or {WEIGHTS}: push the run again (`dmlkit push`).")
    saved = load_config(path=folder / layout.CONFIG_FILE)
    if config_fingerprint(config_to_dict(saved)) != info.get("fingerprint"):
        raise CheckpointError(f"{folder / layout.CONFIG_FILE} is not the configuration the weights were trained with.")
    if _digest(folder / WEIGHTS) != info.get("weights_sha256"):
        raise CheckpointError(f"{folder / WEIGHTS} is not the file that was pushed (its SHA-256 differs): download it again.")
    try:
        weights = load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{folder / WEIGHTS} cannot be read: {exc}") from None
    # the weights file holds every weight: no download or cache is needed to rebuild the model
    pretrained = bool(saved.model.pretrained) and has_offline_weights(saved.model.name)
    saved = replace(saved, model=replace(saved.model, pretrained=pretrained, weights=None))
    model = build_model(saved)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise CheckpointError(f"{folder / WEIGHTS} does not fit the model in {layout.CONFIG_FILE}: {exc}") from None
    model.eval()
    cfg = load_config(path=folder / layout.CONFIG_FILE, overrides=overrides) if overrides else saved
    return cfg, model


def shared_identity(folder: str | Path) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """``(eval_input, fingerprint)`` of a shared folder, as :class:`dmlkit.inference.RunEmbedder` takes them."""
    folder = Path(folder)
    info = _read_json(folder / INFO)
    fingerprint = {"config": str(info.get("fingerprint")), "weights": str(info.get("weights_sha256", ""))[:16]}
    return _read_json(folder / PREPROCESSING).get("eval_input"), fingerprint
