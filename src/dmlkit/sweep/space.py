"""The search space of a sweep: ``--param PATH=TYPE:LOW:HIGH[:log]`` or ``PATH=choice:a,b,c``.

Paths are dotted config paths (``loss.args.margin``, ``asap.proximal_lambda``). They are checked
against the schema before any trial runs: an unknown path is an error with a did-you-mean; keys
under the free-form mappings (``loss.args``, ``model.args``, ``loss.miner.args``) are accepted.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import yaml

from dmlkit.config import RunConfig, config_from_dict, config_to_dict, field_paths
from dmlkit.config.loading import apply_overrides
from dmlkit.exceptions import ConfigError

KINDS = ("float", "int", "choice")
#: Sections a sweep may not search: the protocol defines the objective itself.
FORBIDDEN_PREFIXES = ("protocol.",)
SYNTAX = "PATH=float:LOW:HIGH[:log], PATH=int:LOW:HIGH[:log] or PATH=choice:a,b,c"


@dataclass(frozen=True)
class ParamSpec:
    """One searched config field: its dotted path and its range or choices."""

    path: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def text(self) -> str:
        """The ``--param`` text this spec was parsed from (canonical form)."""
        if self.kind == "choice":
            return f"{self.path}=choice:{','.join(render_value(c) for c in self.choices)}"
        suffix = ":log" if self.log else ""
        return f"{self.path}={self.kind}:{render_value(self.low)}:{render_value(self.high)}{suffix}"

    def extremes(self) -> list[Any]:
        """Values that bound the space (both ends of a range, every choice)."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def suggest(self, trial) -> Any:
        """Draw this parameter's value for an Optuna ``trial``."""
        if self.kind == "float":
            return trial.suggest_float(self.path, self.low, self.high, log=self.log)
        if self.kind == "int":
            return trial.suggest_int(self.path, self.low, self.high, log=self.log)
        return trial.suggest_categorical(self.path, list(self.choices))


def render_value(value: Any) -> str:
    """``value`` as YAML text that :func:`dmlkit.config.parse_override` reads back unchanged."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    return text


def _number(text: str, kind: str, spec_text: str) -> float | int:
    """Read a range end with Python's number syntax (``1e-4`` is a float, unlike in YAML 1.1)."""
    try:
        value = float(text)
        if kind == "int":
            value = int(text) if not value.is_integer() or text.lstrip("+-").isdigit() else int(value)
    except ValueError:
        raise ConfigError(
            f"--param {spec_text!r}: {text!r} is not {'an int' if kind == 'int' else 'a finite float'}."
        ) from None
    if not math.isfinite(value):
        raise ConfigError(f"--param {spec_text!r}: {text!r} is not a finite number.")
    return value


def _scalar(text: str) -> Any:
    """A choice value read as YAML, except that ``1e-4`` is the float 0.0001 (YAML 1.1 reads it as text)."""
    from dmlkit.config.loading import parse_yaml

    value = parse_yaml(text)
    if isinstance(value, str):
        try:
            number = float(text)
        except ValueError:
            return value
        return number if math.isfinite(number) else value
    return value


def parse_param(text: str) -> ParamSpec:
    """Parse one ``--param`` text into a :class:`ParamSpec` (syntax only; paths are checked later)."""
    if "=" not in text:
        raise ConfigError(f"--param {text!r} must look like {SYNTAX}.")
    path, body = (s.strip() for s in text.split("=", 1))
    if not path or not all(path.split(".")):
        raise ConfigError(f"--param {text!r} has an empty path segment.")
    kind, _, rest = body.partition(":")
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"--param {text!r}: unknown type {kind!r}.{hint} Use one of {', '.join(KINDS)} ({SYNTAX}).")
    if kind == "choice":
        items = [s.strip() for s in rest.split(",")] if rest.strip() else []
        if len(items) < 1 or not all(items):
            raise ConfigError(f"--param {text!r}: choice needs a comma-separated list of values, e.g. {path}=choice:a,b,c.")
        choices = tuple(_scalar(s) for s in items)
        if len(set(map(render_value, choices))) != len(choices):
            raise ConfigError(f"--param {text!r}: the choices repeat a value.")
        bad = [c for c in choices if not isinstance(c, (str, int, float, bool)) and c is not None]
        if bad:
            raise ConfigError(f"--param {text!r}: choices must be scalars (str, int, float, bool, null). Got {bad[0]!r}.")
        return ParamSpec(path, "choice", choices=choices)
    fields = rest.split(":")
    log = False
    if len(fields) == 3 and fields[2] == "log":
        log, fields = True, fields[:2]
    if len(fields) != 2:
        raise ConfigError(f"--param {text!r} must look like {SYNTAX}.")
    low, high = (_number(f.strip(), kind, text) for f in fields)
    if not low < high:
        raise ConfigError(f"--param {text!r}: LOW ({low}) must be smaller than HIGH ({high}).")
    if log and low <= 0:
        raise ConfigError(f"--param {text!r}: a log range needs LOW > 0. Got {low}.")
    return ParamSpec(path, kind, low=low, high=high, log=log)


def free_form_prefixes(cfg: RunConfig | None = None) -> list[str]:
    """Config fields holding free-form mappings (``loss.args``, ...), whose keys any path may name."""
    data = config_to_dict(cfg or RunConfig())
    out = []
    for path in field_paths():
        node: Any = data
        for part in path.split("."):
            node = node[part]
        if isinstance(node, dict):
            out.append(path)
    return out


def check_param_paths(specs: Sequence[ParamSpec]) -> None:
    """Raise ConfigError listing every unknown, repeated or forbidden path (with did-you-mean)."""
    known = field_paths()
    free = free_form_prefixes()
    problems = []
    seen: set[str] = set()
    for spec in specs:
        path = spec.path
        if path in seen:
            problems.append(f"--param {path!r} is given twice.")
        seen.add(path)
        if any(path.startswith(p) for p in FORBIDDEN_PREFIXES):
            problems.append(
                f"--param {path!r}: the protocol defines the objective (validation MAP@R) and cannot be searched; "
                "set it with --set instead."
            )
            continue
        if path in free:
            problems.append(f"--param {path!r} is a mapping; search one of its keys, e.g. {path}.margin.")
            continue
        if path in known or any(path.startswith(p + ".") and len(path) > len(p) + 1 for p in free):
            continue
        close = difflib.get_close_matches(path, known + [f + ".<key>" for f in free], n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        problems.append(f"--param {path!r} is not a config field.{hint} Free-form keys are allowed under {', '.join(free)}.")
    if problems:
        raise ConfigError(problems)


def check_loss_arguments(specs: Sequence[ParamSpec], loss_name: str | None = None) -> None:
    """``loss.args.KEY`` must be a constructor argument of the configured loss (unless loss.name is searched)."""
    import inspect

    from dmlkit.losses import LOSSES

    if loss_name is None or any(s.path == "loss.name" for s in specs):
        return
    factory = LOSSES.get(loss_name)
    params = inspect.signature(factory).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    problems = []
    for spec in specs:
        if spec.path.startswith("loss.args.") and spec.path.count(".") == 2:
            key = spec.path.split(".")[2]
            if key not in params:
                close = difflib.get_close_matches(key, list(params), n=1, cutoff=0.6)
                hint = f" Did you mean 'loss.args.{close[0]}'?" if close else ""
                problems.append(
                    f"--param {spec.path!r}: loss {loss_name!r} has no argument {key!r}.{hint} "
                    f"Its arguments: {', '.join(params)}."
                )
    if problems:
        raise ConfigError(problems)


def apply_params(base: dict, params: dict[str, Any]) -> dict:
    """The raw config mapping ``base`` with each ``{path: value}`` set (validated by the caller)."""
    return apply_overrides(copy.deepcopy(base), [f"{path}={render_value(value)}" for path, value in params.items()])


def check_space(base: dict, specs: Sequence[ParamSpec]) -> None:
    """Check paths and loss arguments, then that every range end and every choice gives a valid config."""
    check_param_paths(specs)
    check_loss_arguments(specs, config_from_dict(base).loss.name)
    problems = []
    for spec in specs:
        for value in spec.extremes():
            try:
                config_from_dict(apply_params(base, {spec.path: value}))
            except ConfigError as exc:
                problems.extend(f"--param {spec.text()!r} at {render_value(value)}: {p}" for p in exc.problems)
    if problems:
        raise ConfigError(problems)


def has_validation_split(cfg: RunConfig) -> bool:
    """True when the protocol holds out validation data (``protocol.fold`` or ``protocol.val_fraction``)."""
    return cfg.protocol.fold is not None or cfg.protocol.val_fraction > 0


def check_validation_split(cfg: RunConfig) -> None:
    """A sweep scores validation MAP@R, never test metrics: refuse a config without a validation split."""
    if not has_validation_split(cfg):
        raise ConfigError(
            "A sweep needs a validation split (its objective is validation MAP@R; test metrics are never used): "
            "set protocol.fold=0 (class-disjoint folds) or protocol.val_fraction=0.2 (held-out images per class)."
        )


__all__ = [
    "ParamSpec",
    "apply_params",
    "check_loss_arguments",
    "check_param_paths",
    "check_space",
    "check_validation_split",
    "free_form_prefixes",
    "has_validation_split",
    "parse_param",
    "render_value",
]
