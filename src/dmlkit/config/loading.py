"""Loading configs: packaged presets, YAML files (safe tags, no aliases) and ``key=value`` overrides."""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from dmlkit.config.components import drop_stale_args
from dmlkit.config.schema import EXPONENT_FLOAT, DataConfig, RunConfig, config_from_dict, config_to_dict
from dmlkit.exceptions import ConfigError

PRESET_PACKAGE = "dmlkit.config.presets"


@dataclass(frozen=True)
class PresetInfo:
    """A packaged preset: its name, one-line summary, source and the command that runs it."""

    name: str
    summary: str
    source: str
    command: str
    text: str


def _preset_files() -> dict[str, Any]:
    root = resources.files(PRESET_PACKAGE)
    return {p.name[:-5]: p for p in root.iterdir() if p.name.endswith(".yaml")}


def list_presets() -> list[PresetInfo]:
    """Every packaged preset, sorted by name."""
    return [preset_info(n) for n in sorted(_preset_files())]


def preset_info(name: str) -> PresetInfo:
    """Header comments of a preset: first line summary, ``# Source:`` and ``# Command:`` lines."""
    files = _preset_files()
    if name not in files:
        close = difflib.get_close_matches(name, list(files), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(f"Unknown preset {name!r}.{hint} See `dmlkit presets` for the list.")
    text = files[name].read_text()
    summary = source = command = ""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("#").strip()
        if body.lower().startswith("source:"):
            source = body.split(":", 1)[1].strip()
        elif body.lower().startswith("command:"):
            command = body.split(":", 1)[1].strip()
        elif not summary and body:
            summary = body
    return PresetInfo(name, summary, source, command, text)


#: A config is a few kilobytes; a larger file is refused before it is parsed.
MAX_CONFIG_BYTES = 1 << 20


class _PlainYamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without aliases: ``*name`` could expand a few hundred bytes into gigabytes
    (a "billion laughs"), and a config never needs one. Floats are read as YAML 1.2 writes them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor[:40]}; aliases are not allowed in a dmlkit config "
                "(write the value out)", event.start_mark)
        return super().compose_node(parent, index)


# PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent (`lr: 1e-3` stays a string); this
# adds YAML 1.2's exponent forms (3e-4, 1E-3, 1e3) on this loader only (PyYAML copies the table per class)
_PlainYamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """``text`` parsed as plain YAML: safe tags only (``!!python/...`` refused) and no aliases.

    Raises ``yaml.YAMLError`` (the callers name the file or option it came from)."""
    loader = _PlainYamlLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def decode_config_text(data: bytes, source: str) -> str:
    """The text of a config file: UTF-8 (with or without a byte-order mark) or UTF-16 with its byte-order
    mark; anything else (Latin-1, UTF-16 without a mark, binary) is a ConfigError naming ``source``."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{source} is not {encoding.replace('-sig', '')} text (byte {err.start} is "
                          f"{data[err.start:err.start + 1]!r}); save it as UTF-8.") from None


def read_yaml(path: str | Path) -> dict:
    """Read a YAML mapping safely (no aliases, UTF-8 or UTF-16 with a byte-order mark); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {str(path)!r} does not exist.")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"Config file {str(path)!r} has {size} bytes, more than a config may have "
                          f"({MAX_CONFIG_BYTES}); is it the right file?")
    try:
        text = decode_config_text(path.read_bytes(), f"Config file {str(path)!r}")
        data = parse_yaml(text)
    except OSError as exc:
        raise ConfigError(f"Config file {str(path)!r} cannot be read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {str(path)!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"Config file {str(path)!r} must hold a mapping at the top level. Got {type(data).__name__}.")
    return data


def deep_merge(base: dict, update: dict) -> dict:
    """Recursive merge: mappings merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML (``0.1``, ``true``, ``[1, 2]``, ``null``)."""
    if "=" not in text:
        raise ConfigError(f"Override {text!r} must look like key.path=value (e.g. optimizer.lr=0.001).")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"Override {text!r} has an empty key segment.")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """Apply ``key.path=value`` overrides to a raw config mapping (validated later)."""
    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    return out


def load_config(
    *, preset: str | None = None, path: str | Path | None = None, overrides: Iterable[str] = ()
) -> RunConfig:
    """Defaults, then the preset, then a YAML file, then overrides; validated all at once.

    With no preset this is the schema's bare defaults; ``dmlkit train`` with no ``--preset``/``--config``
    runs ``load_config(preset="mnist-proxy-anchor", overrides=...)`` (:data:`dmlkit.cli.train.DEFAULT_PRESET`).

    Each of the three is a layer: a layer that names another loss, miner or model drops the ``args``
    the layers below gave the previous one (:func:`dmlkit.config.components.drop_stale_args`).
    """
    data: dict = {}
    user_layers = []  # what the user wrote, above the preset: a data.root there without data.name is their folder
    if preset is not None:
        info = preset_info(preset)
        data = merge_layer(data, parse_yaml(info.text) or {})
    if path is not None:
        user_layers.append(read_yaml(path))
        data = merge_layer(data, user_layers[-1])
    overrides = list(overrides)
    user_layers.append(apply_overrides({}, overrides))
    data = drop_stale_args(apply_overrides(data, overrides), data, user_layers[-1])
    return config_from_dict(own_data_for_root(data, user_layers))


def own_data_for_root(data: dict, user_layers: list[dict]) -> dict:
    """``data`` with ``data.name=folder`` when the user gave a ``data.root`` but no ``data.name`` and the name
    below (a preset's, the default ``mnist``) is a built-in data set that reads no files: training MNIST while
    the user pointed at their images would be a silent substitution. Both named is a ConfigError."""
    section = data.get("data")
    if not isinstance(section, dict) or not section.get("root") or not isinstance(section.get("root"), str):
        return data
    from dmlkit.data import DATASETS  # deferred: the config loads without the data package

    name = section.get("name", DataConfig.name)
    if name not in DATASETS or DATASETS.get(name).reads_files:
        return data  # a benchmark reads its files from root; an unknown name is reported by the schema
    if any(isinstance(layer.get("data"), dict) and "name" in layer["data"] for layer in user_layers):
        raise ConfigError(f"data.name={name} is built into dmlkit and reads no files, so data.root={section['root']!r} "
                          "would be ignored: set data.name=folder (a folder of class sub-folders) or data.name=csv "
                          "for your own images, or drop data.root.")
    return {**data, "data": {**section, "name": "folder"}}


def merge_layer(base: dict, layer: dict) -> dict:
    """``layer`` merged onto ``base``; a component ``layer`` renames loses the ``args`` ``base`` gave it."""
    return drop_stale_args(deep_merge(base, layer), base, layer)


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML text."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


__all__ = [
    "PresetInfo",
    "RunConfig",
    "apply_overrides",
    "deep_merge",
    "dump_config",
    "list_presets",
    "load_config",
    "merge_layer",
    "parse_override",
    "parse_yaml",
    "preset_info",
    "read_yaml",
]
