"""A second device on a CPU-only machine: tensors tagged "away" must never meet "home" tensors.

On a GPU, a loss called with ``embeddings`` on ``cuda`` and labels straight from a DataLoader on the
CPU raises ``Expected all tensors to be on the same device`` unless it moves the labels first; so does
a loss that creates a tensor with ``torch.arange(n)`` (no ``device=``: the default device, the CPU)
and combines it with the embeddings. :class:`DeviceEmulator` makes both mistakes fail on the CPU.

Inside ``with DeviceEmulator() as emu:`` every torch call goes through a ``TorchFunctionMode`` that
gives each tensor a virtual device:

* **home** (the embeddings' device, think ``cuda``): every tensor not tagged away; ``x.device`` is
  ``torch.device("cpu")``, so the code under test runs its usual CPU path.
* **away** (think the CPU beside a GPU): tensors passed through :meth:`DeviceEmulator.away`, tensors
  made by a factory (``torch.arange``, ``zeros``, ``tensor``, ``rand*`` ...) without ``device=`` (the
  default device), by ``.cpu()``, or on :data:`AWAY` (``torch.device("cpu", 0)``, which torch
  allocates on the CPU but which compares unequal to ``torch.device("cpu")``); ``x.device`` of an
  away tensor is :data:`AWAY`, so ``torch.arange(n, device=labels.device)`` stays away and
  ``labels.to(embeddings.device)`` comes home.

An op's result is away when its tensor inputs are (0-dim tensors aside), home otherwise. An op raises
``RuntimeError: Expected all tensors to be on the same device`` when it mixes a home and an away
tensor of dim > 0, or an away tensor of dim > 0 with a home 0-dim one; as on CUDA, an away 0-dim
tensor may join home ones, and a home tensor may be indexed (``x[idx]``, ``x[idx] = v``) with away
indices. ``.numpy()`` of a home tensor raises as it does for a CUDA tensor. Moves copy, so a move
never re-tags the caller's tensor. Gradients: ``torch.autograd.grad`` / ``.backward()`` inside the
block run the backward pass with the emulator active, so custom ``autograd.Function`` backward code is
checked too.

A module built on the CPU beside a GPU holds its parameters and buffers on the CPU: :meth:`DeviceEmulator.park`
tags a module's own parameter and buffer objects away (in place, not copies), so a loss whose weights meet
home embeddings raises as ``mm`` does on CUDA. ``p.data = t`` gives ``p`` the tag of ``t`` (the same Parameter
object, moved, as ``module.to(device)`` and PML's ``cast_types`` do), and ``p.data`` has the tag of ``p``.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

#: The away device as the code under test sees it: allocates on the CPU, but != torch.device("cpu").
AWAY = torch.device("cpu", 0)
HOME = torch.device("cpu")

FACTORIES = {
    torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.eye, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.empty_strided,
    torch.scalar_tensor, torch.tril_indices, torch.triu_indices, torch.from_numpy, torch.as_tensor,
}
LIKE = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like,
        torch.randint_like}
NEW = {torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty, torch.Tensor.new_full,
       torch.Tensor.new_tensor}
#: Advanced indexing: CUDA accepts CPU index tensors here.
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
GRADIENTS = {torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward}
DEVICE_GETTER = torch.Tensor.device.__get__
DATA_SETTER = torch.Tensor.data.__set__
#: Questions about tensors that compute nothing on them (``module.to`` asks before it moves a parameter).
METADATA = {torch._has_compatible_shallow_copy_type}

MIXED = "Expected all tensors to be on the same device, but found at least two devices, home and away! ({})"


def _name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _is_away_device(device: Any) -> bool | None:
    """True for :data:`AWAY`, False for the home device, None for anything else (left to torch)."""
    if device is None:
        return None
    device = torch.device(device) if not isinstance(device, torch.device) else device
    if device == AWAY:
        return True
    return False if device.type == "cpu" else None


class DeviceEmulator(TorchFunctionMode):
    """Tag tensors home or away and refuse every op that mixes them (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._away = WeakTensorKeyDictionary()

    # -- the test's side -------------------------------------------------------------------
    def away(self, x: Any) -> Any:
        """A copy of ``x`` (a tensor, or tensors in a tuple / list / dict / dataclass-free tree) on the away device."""
        def move(t):
            if not isinstance(t, torch.Tensor):
                return t
            copy = t.detach().clone().requires_grad_(t.requires_grad) if t.is_leaf else t.clone()
            self._away[copy] = True
            return copy

        return tree_map(move, x)

    def park(self, module: torch.nn.Module) -> torch.nn.Module:
        """Tag ``module``'s parameters and buffers (the objects themselves, submodules' included) away: a module
        left on the CPU while the embeddings are on the GPU."""
        for t in itertools.chain(module.parameters(), module.buffers()):
            self._away[t] = True
        return module

    def is_away(self, x: torch.Tensor) -> bool:
        return x in self._away

    def away_state(self, module: torch.nn.Module) -> list[str]:
        """Names of ``module``'s parameters and buffers that are on the away device."""
        return [name for name, t in itertools.chain(module.named_parameters(), module.named_buffers())
                if t in self._away]

    # -- the mode ----------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == DEVICE_GETTER:
            return AWAY if args[0] in self._away else func(*args, **kwargs)
        if func in GRADIENTS:
            return self._gradients(func, args, kwargs)
        if func == DATA_SETTER:  # p.data = t: the same object takes t's place, and its device
            result = func(*args, **kwargs)
            self._retag(args[0], args[1] in self._away)
            return result
        if func in METADATA:
            return func(*args, **kwargs)
        if func is torch.Tensor.numpy and args[0] not in self._away:
            raise TypeError("can't convert cuda:0 device type tensor to numpy (emulated: a home tensor). "
                            "Use Tensor.cpu() to copy the tensor to host memory first.")
        away = self._placement(func, args, kwargs)
        result = func(*args, **kwargs)
        if away is not None:
            result = self._tag(result, away, args)
        return result

    def _placement(self, func, args, kwargs) -> bool | None:
        """Whether ``func``'s result lives away (True), home (False), or has no tensor (None); raise on a mix."""
        device = _is_away_device(kwargs.get("device"))
        if func in FACTORIES:
            if func is torch.as_tensor and isinstance(args[0], torch.Tensor) and device is None:
                return args[0] in self._away
            return True if device is None else device
        if func in LIKE or func in NEW:
            return (args[0] in self._away) if device is None else device
        if func in (torch.Tensor.to, torch.Tensor.type_as):
            return self._move_target(args, kwargs)
        if func is torch.Tensor.cpu:
            return True
        if func is torch.Tensor.cuda:
            return False
        if func is torch.Tensor.copy_:
            return args[0] in self._away
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if not tensors:
            return None
        if func in INDEXING:
            return self._indexing(func, args)
        return self._combine(func, tensors)

    def _move_target(self, args, kwargs) -> bool | None:
        self_away = args[0] in self._away
        for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
            if isinstance(a, torch.Tensor):
                return a in self._away
            if isinstance(a, (torch.device, str)):
                target = _is_away_device(a)
                return self_away if target is None else target
        return self_away

    def _indexing(self, func, args) -> bool:
        target = args[0]
        index = [t for t in tree_flatten(args[1])[0] if isinstance(t, torch.Tensor)]
        if target in self._away:
            if any(t not in self._away and t.dim() > 0 for t in index):
                raise RuntimeError(MIXED.format(f"{_name(func)}: an away tensor indexed with home indices"))
            return True
        if func is torch.Tensor.__setitem__ and len(args) > 2:
            value = args[2]
            if isinstance(value, torch.Tensor) and value in self._away and value.dim() > 0:
                raise RuntimeError(MIXED.format(f"{_name(func)}: away values written into a home tensor"))
        return False

    def _combine(self, func, tensors) -> bool:
        away = [t for t in tensors if t in self._away]
        home = [t for t in tensors if t not in self._away]
        away_big = [t for t in away if t.dim() > 0]
        home_big = [t for t in home if t.dim() > 0]
        if away_big and home:
            shapes = f"home {[tuple(t.shape) for t in home]}, away {[tuple(t.shape) for t in away]}"
            raise RuntimeError(MIXED.format(f"{_name(func)}: {shapes}"))
        if home_big or home:
            return False
        return True

    def _retag(self, t: torch.Tensor, away: bool) -> None:
        if away:
            self._away[t] = True
        elif t in self._away:
            del self._away[t]

    def _tag(self, result, away: bool, args) -> Any:
        inputs = {id(t) for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)}

        def tag(t):
            if not isinstance(t, torch.Tensor):
                return t
            if id(t) in inputs and (t in self._away) != away:
                t = t.clone()  # a move that torch answered with the same tensor: copy, keep the caller's tag
            self._retag(t, away)
            return t

        return tree_map(tag, result)

    def _gradients(self, func, args, kwargs):
        """Run the backward pass with this mode active (custom backward code is checked too)."""
        from torch.autograd.graph import _engine_run_backward

        if func is torch.autograd.grad:
            outputs, inputs = args[0], args[1]
            grad_outputs = kwargs.get("grad_outputs", args[2] if len(args) > 2 else None)
            accumulate, allow_unused = False, kwargs.get("allow_unused", False)
        else:
            outputs, inputs = args[0], kwargs.get("inputs")
            grad_outputs = kwargs.get("gradient", kwargs.get("grad_tensors", args[1] if len(args) > 1 else None))
            accumulate, allow_unused = True, True
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
        if grad_outputs is None:
            grad_outputs = tuple(torch.ones_like(o) for o in outputs)
        elif isinstance(grad_outputs, torch.Tensor):
            grad_outputs = (grad_outputs,)
        inputs = () if inputs is None else ((inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs))
        retain = bool(kwargs.get("retain_graph") or kwargs.get("create_graph"))
        with self:
            grads = _engine_run_backward(outputs, tuple(grad_outputs), retain, bool(kwargs.get("create_graph")),
                                         inputs, allow_unused, accumulate_grad=accumulate)
        return grads if func is torch.autograd.grad else None
