"""Training methods that extend the engine through hooks (:mod:`dmlkit.methods.hooks`), by registry.

The registry and the engine's questions to it live in :mod:`dmlkit.methods.registry`; every
built-in method module is imported here, so it is registered whenever ``dmlkit.methods`` is.
"""

from dmlkit.methods import asap  # noqa: F401  (registers "asap")
from dmlkit.methods.registry import METHODS, MethodHooks, build_method_hooks, enabled_methods, loss_arguments

__all__ = ["METHODS", "MethodHooks", "build_method_hooks", "enabled_methods", "loss_arguments"]
