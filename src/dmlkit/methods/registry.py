"""The registry of training methods that extend the engine through hooks (:mod:`dmlkit.methods.hooks`).

A method registers a :class:`~dmlkit.methods.hooks.MethodHooks` subclass with two class methods:
``enabled(cfg) -> bool`` (does the config ask for it) and ``loss_arguments(cfg, factory, args)``
(arguments it adds to the loss, e.g. ASAP's ``proxies_per_class``). The engine asks this module,
never a method by name.
"""

from __future__ import annotations

import inspect

from dmlkit.core.registry import Registry
from dmlkit.methods.hooks import MethodHooks

METHODS: Registry[type] = Registry("method")


def enabled_methods(cfg) -> list[type]:
    """The registered methods ``cfg`` turns on (at most one may be on)."""
    on = [METHODS.get(name) for name in METHODS.names() if METHODS.get(name).enabled(cfg)]
    if len(on) > 1:
        from dmlkit.exceptions import ConfigError

        raise ConfigError(f"Only one training method may be enabled at a time; got {[m.__name__ for m in on]}.")
    return on


def build_method_hooks(cfg, trainer) -> MethodHooks:
    """The hooks of the method ``cfg`` enables, or the do-nothing hooks of plain training."""
    on = enabled_methods(cfg)
    return on[0](trainer) if on else MethodHooks()


def loss_arguments(cfg, factory, args: dict) -> dict:
    """``args`` for the loss ``factory`` with what the enabled method adds (only where the loss takes it)."""
    params = inspect.signature(factory).parameters
    for method in enabled_methods(cfg):
        for key, value in method.loss_arguments(cfg).items():
            if key in params:
                args.setdefault(key, value)
    return args


__all__ = ["METHODS", "MethodHooks", "build_method_hooks", "enabled_methods", "loss_arguments"]
