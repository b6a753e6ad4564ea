"""Run configuration: schema, presets, YAML loading and overrides."""

from dmlkit.config.loading import (
    PresetInfo,
    apply_overrides,
    dump_config,
    list_presets,
    load_config,
    parse_override,
    preset_info,
    read_yaml,
)
from dmlkit.config.schema import RunConfig, config_from_dict, config_to_dict, field_paths

__all__ = [
    "PresetInfo",
    "RunConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "dump_config",
    "field_paths",
    "list_presets",
    "load_config",
    "parse_override",
    "preset_info",
    "read_yaml",
]
