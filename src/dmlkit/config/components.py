"""The ``args`` of a named component (``loss``, ``loss.miner``, ``model``): they travel with it and fit it.

Two rules, applied when a config is loaded:

* a layer (preset, YAML file, the ``--set`` overrides) that names another component at
  ``loss.name``, ``loss.miner.name`` or ``model.name`` drops the ``args`` the lower layers gave
  the previous one; the new component gets only the ``args`` that same layer gives it
  (:func:`drop_stale_args`);
* every key of ``*.args`` must be a constructor argument of the component it configures (its
  signature), and values with a declared constraint (``_parameter_constraints``) must satisfy it
  (:func:`args_problems`), with a did-you-mean. Models from timm take keyword arguments this
  cannot list; ``model.args`` of a timm name are checked when the model is built.
"""

from __future__ import annotations

import copy
import difflib
import inspect
from typing import Any, Callable

#: Config sections whose ``args`` belong to the component named by their ``name``, with the schema's default name.
COMPONENT_SECTIONS: dict[tuple[str, ...], Any] = {("model",): "small_cnn", ("loss",): "proxy_anchor",
                                                  ("loss", "miner"): None}

#: The model the recipe trains from scratch for glyphs and digits (``model.name=auto``; its ``model.args`` are checked
#: against it).
GLYPH_MODEL = "small_cnn"

#: ``*.args`` values that are specifications the engine turns into objects (a distance name, a nested loss).
RESOLVED_BY_ENGINE = frozenset({"distance", "pair_loss"})


def _section(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def drop_stale_args(merged: dict, lower: dict, layer: dict) -> dict:
    """``merged`` (``lower`` with ``layer`` applied) without the args of components ``layer`` replaced."""
    for path, default in COMPONENT_SECTIONS.items():
        section = _section(layer, path)
        if not isinstance(section, dict) or "name" not in section:
            continue
        before = _section(lower, path)
        old = before.get("name", default) if isinstance(before, dict) else default
        target = _section(merged, path)
        if section["name"] != old and isinstance(target, dict):
            target["args"] = copy.deepcopy(section.get("args") or {})  # only what this layer gives the new one
    return merged


def _parameters(factory: Callable) -> tuple[list[str], bool]:
    """Keyword parameters of ``factory`` and whether it also takes ``**kwargs``."""
    params = inspect.signature(factory).parameters.values()
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def _unknown_keys(where: str, what: str, args: dict, valid: list[str]) -> list[str]:
    problems = []
    for key in args:
        if key in valid:
            continue
        close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
        hint = f" Did you mean '{where}.{close[0]}'?" if close else ""
        problems.append(f"'{where}.{key}' is not an argument of {what}.{hint} Valid: {', '.join(valid) or '(none)'}.")
    return problems


def _value_problems(where: str, factory: Any, args: dict) -> list[str]:
    from dmlkit.core.validation import validate_params
    from dmlkit.exceptions import InvalidParameterError

    constraints = getattr(factory, "_parameter_constraints", None) or {}
    problems = []
    for key, value in args.items():
        if key in constraints and key not in RESOLVED_BY_ENGINE and not isinstance(value, (dict, list)):
            try:
                validate_params(getattr(factory, "__name__", where), {key: value}, {key: constraints[key]})
            except InvalidParameterError as err:
                problems.append(f"{where}.{key}: {err}")
    return problems


def _registry_problems(where: str, kind: str, registry, name: str, args: dict) -> list[str]:
    if not args or name not in registry:
        return []  # an unknown name is reported by the name's own check
    factory = registry.get(name)
    names, var_keyword = _parameters(factory)
    problems = [] if var_keyword else _unknown_keys(where, f"{kind} {name!r}", args, names)
    return problems + _value_problems(where, factory, {k: v for k, v in args.items() if k in names})


def args_problems(cfg, skip: tuple[str, ...] = ()) -> list[str]:
    """Every ``*.args`` key that the configured loss, miner or dmlkit model does not take, and bad values.

    Sections in ``skip`` (``"loss"``, ``"loss.miner"``, ``"model"``: their name was already refused) are not checked.
    """
    problems = []
    if cfg.loss.args and "loss" not in skip:
        from dmlkit.losses import LOSSES

        problems += _registry_problems("loss.args", "loss", LOSSES, cfg.loss.name, cfg.loss.args)
    if cfg.loss.miner.args and "loss.miner" not in skip:
        from dmlkit.mining import MINERS

        if cfg.loss.miner.name is None:
            problems.append("loss.miner.args are given but loss.miner.name is not set: name the miner they are for.")
        else:
            problems += _registry_problems("loss.miner.args", "miner", MINERS, cfg.loss.miner.name, cfg.loss.miner.args)
    if cfg.model.args and "model" not in skip:
        from dmlkit.models import MODELS

        # model.name=auto: args can only be for the model the recipe trains from scratch (glyphs); the
        # recipe refuses them if it picks a pretrained backbone for photos
        name = GLYPH_MODEL if cfg.model.name == "auto" else cfg.model.name
        problems += _registry_problems("model.args", "model", MODELS, name, cfg.model.args)
    return problems
