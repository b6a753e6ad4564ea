"""PyTorch's optimisers without importing ``torch._dynamo``, in a process that compiles nothing.

``torch.optim`` imports ``torch._dynamo`` (and with it sympy, inductor's rules and FSDP's modules: 1-1.5 s of
start-up) although an eager run never uses it: ``Optimizer.add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` are wrapped by ``torch._disable_dynamo``, which imports it at their first call to make the
function invisible to a compiler, and every ``step()`` of Adam, AdamW, SGD and RMSprop goes through
``_use_grad_for_differentiable``, which imports it to insert a graph break for ``torch.compile``. Both only
matter while something is being compiled, which needs ``torch._dynamo`` imported first.

:func:`defer_dynamo_import` makes those paths plain calls while ``torch._dynamo`` is not imported: the four
methods get the "disabled" version their wrapper caches (the function itself), and the four optimisers' ``step``
sets the grad mode as PyTorch's wrapper does without the graph breaks; once ``torch._dynamo`` is loaded their
``step`` is PyTorch's own again. :func:`restore` puts everything back; dmlkit calls it before it compiles
(``train.compile``, ``train.step_capture``). ``dmlkit train`` applies it when the run asks for no compilation.
Where PyTorch's optimiser module is not built as expected (another version), nothing is changed.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

import torch

#: The wrapped methods of ``torch.optim.Optimizer`` whose first call imports ``torch._dynamo``.
DISABLED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")

_steps: dict[type, tuple[Callable, Callable]] = {}  # optimiser class -> (its original ``step``, the deferring one)
_disabled: list[Callable] = []  # functions given their plain self as the cached "disabled" version


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def _grad_mode_step(use_grad: Callable, raw: Callable) -> Callable:
    """``raw`` under the optimiser's grad mode (as ``_use_grad_for_differentiable``), without its graph breaks."""

    def step(self, *args, **kwargs):
        if dynamo_loaded():  # something may compile now: PyTorch's own wrapper
            return use_grad(self, *args, **kwargs)
        before = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return raw(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(before)

    return functools.update_wrapper(step, raw)


def defer_dynamo_import(classes: tuple[type, ...] | None = None) -> bool:
    """Keep ``torch._dynamo`` unimported by the optimisers (module docstring); True when anything was deferred."""
    if dynamo_loaded():
        return False
    optim = torch.optim
    for name in DISABLED_METHODS:
        fn = getattr(optim.Optimizer.__dict__.get(name), "__wrapped__", None)
        if fn is not None and "__dynamo_disable" not in fn.__dict__:
            fn.__dynamo_disable = fn  # what the wrapper calls: nothing compiles without torch._dynamo loaded
            _disabled.append(fn)
    hook = getattr(optim.Optimizer, "profile_hook_step", None)
    for cls in classes or (optim.Adam, optim.AdamW, optim.SGD, optim.RMSprop):
        original = cls.__dict__.get("step")
        if original is None or cls in _steps:
            continue
        hooked = getattr(original, "hooked", False)
        use_grad = original.__wrapped__ if hooked else original
        raw = getattr(use_grad, "__wrapped__", None)
        if raw is None or getattr(use_grad, "__code__", None) is None or use_grad.__code__.co_name != "_use_grad":
            continue  # not PyTorch's layout as known here: leave it
        step = _grad_mode_step(use_grad, raw)
        _steps[cls] = (original, step)
        if hooked and hook is not None:
            step = hook(step)
            step.hooked = True
        cls.step = step  # a subclass without its own step (AdamW of Adam) inherits it
    return bool(_disabled or _steps)


def _subclasses(cls: type) -> list[type]:
    return [cls] + [sub for direct in cls.__subclasses__() for sub in _subclasses(direct)]


def restore() -> None:
    """Undo :func:`defer_dynamo_import` (before compiling anything)."""
    hook = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    while _disabled:
        del _disabled.pop().__dynamo_disable
    originals = {id(ours): original for original, ours in _steps.values()}
    # the patched classes and their subclasses that hooked an inherited deferring step (an AdamW built meanwhile)
    for cls in _subclasses(torch.optim.Optimizer):
        step = cls.__dict__.get("step")
        hooked = getattr(step, "hooked", False)
        original = originals.get(id(step.__wrapped__ if hooked else step))
        if original is None:
            continue
        if hooked and not getattr(original, "hooked", False) and hook is not None:  # keep the profiler hooks
            original = hook(original)
            original.hooked = True
        cls.step = original
    _steps.clear()


__all__ = ["defer_dynamo_import", "dynamo_loaded", "restore"]
