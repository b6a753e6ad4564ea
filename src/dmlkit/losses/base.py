"""The base class every dmlkit loss derives from.

``loss(embeddings, labels, **kwargs)`` validates its inputs, moves labels and every tensor argument
to the embeddings' device, and the loss's own parameters and buffers with them (PML's contract:
:meth:`MetricLoss.follow_embeddings_`), turns off autocast and upcasts half-precision inputs so
the loss is accumulated in fp32, then hands over to ``compute_loss``; the loss comes back in the
embeddings' dtype (float16 in, float16 out, as PML and PyTorch's losses). A batch with nothing to
learn from returns :func:`zero_loss`, which stays connected to the autograd graph.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn

from dmlkit.core.devices import as_input_dtype, autocast_off, follow_device_, to_device
from dmlkit.core.registry import Registry
from dmlkit.core.validation import check_embeddings_labels, validate_params
from dmlkit.exceptions import InvalidParameterError
from dmlkit.losses.regularizers import check_reg_weight, check_regularizer

LOSSES: Registry[nn.Module] = Registry("loss")


def zero_loss(*tensors: torch.Tensor) -> torch.Tensor:
    """A scalar 0 that depends on ``tensors`` so ``backward()`` works and yields zero gradients."""
    total = None
    for t in tensors:
        if t is not None and t.requires_grad:
            term = (t * 0).sum()
            total = term if total is None else total + term
    if total is None:
        ref = tensors[0]
        return torch.zeros((), dtype=torch.float32 if not ref.is_floating_point() else ref.dtype, device=ref.device)
    return total


def as_fp32(x: torch.Tensor) -> torch.Tensor:
    """Upcast fp16/bf16 to fp32; leave fp32/fp64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class MetricLoss(nn.Module):
    """Base of every loss: ``forward(embeddings [B, D], labels [B], **kwargs) -> scalar``.

    Each loss declares ``_parameter_constraints`` (scikit-learn style: parameter name -> list of
    :mod:`dmlkit.core.validation` constraints, merged along the class hierarchy); the constructor's
    arguments are checked against them here, once, before the loss's own ``__init__`` runs, with
    one message template (``The 'margin' parameter of ProxyAnchorLoss must be a float > 0. Got -1
    instead.``).
    """

    _parameter_constraints: dict = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = _validating_init(cls.__init__)

    @classmethod
    def parameter_constraints(cls) -> dict:
        """``_parameter_constraints`` of this class and its bases (the subclass wins on a shared name)."""
        merged: dict = {}
        for klass in reversed(cls.__mro__):
            merged.update(klass.__dict__.get("_parameter_constraints", {}))
        return merged

    #: False for losses that accept ``labels=None`` with an explicit ``pos_mask``.
    requires_labels: bool = True

    def __init__(self) -> None:
        super().__init__()
        # Regularizers (see dmlkit.losses.regularizers); None costs nothing.
        self.embedding_regularizer: object | None = None
        self.weight_regularizer: object | None = None
        self.embedding_reg_weight = 1.0
        self.weight_reg_weight = 1.0

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor | None = None,
        indices_tuple: tuple | None = None,
        **kwargs,
    ) -> torch.Tensor:
        if indices_tuple is not None:
            # A ValueError as in PML, and a TypeError as before (InvalidParameterError is both).
            raise InvalidParameterError(
                f"{type(self).__name__} takes no indices_tuple: it compares the batch with its proxies, "
                "not mined pairs or triplets."
            )
        check_embeddings_labels(embeddings, labels)
        if labels is None and self.requires_labels and kwargs.get("pos_mask") is None:
            raise ValueError(f"{type(self).__name__} needs labels (or an explicit pos_mask).")
        labels, kwargs = to_device((labels, kwargs), embeddings.device)
        self.follow_embeddings_(embeddings)
        with autocast_off(embeddings.device.type):
            loss = self.compute_loss(as_fp32(embeddings), labels, **kwargs)
        return self.add_regularization(loss, embeddings)

    def own_state(self) -> torch.Tensor | None:
        """One of the loss's own parameters or buffers (proxies, ``beta``), on the device where all of them
        are; None for a loss that keeps no tensors between calls."""
        return None

    def follow_embeddings_(self, embeddings: torch.Tensor) -> None:
        """PML's ``cast_types``, device part: the loss's parameters and buffers move to ``embeddings``' device
        (the same Parameter objects; :func:`dmlkit.core.devices.follow_device_`). Every ``forward`` calls it
        after moving its inputs; losses whose weights also take the embeddings' dtype extend it."""
        probe = self.own_state()
        if probe is not None:
            follow_device_(self, embeddings.device, probe)

    def set_regularizers(
        self,
        embedding_regularizer: object | None = None,
        embedding_reg_weight: float = 1.0,
        weight_regularizer: object | None = None,
        weight_reg_weight: float = 1.0,
    ) -> None:
        """Validate and store PML-style regularizers (``R(x) -> scalar``) and their weights."""
        owner = type(self).__name__
        check_regularizer(embedding_regularizer, "embedding_regularizer", owner)
        check_regularizer(weight_regularizer, "weight_regularizer", owner)
        self.embedding_reg_weight = check_reg_weight(embedding_reg_weight, "embedding_reg_weight", owner)
        self.weight_reg_weight = check_reg_weight(weight_reg_weight, "weight_reg_weight", owner)
        self.embedding_regularizer = embedding_regularizer
        self.weight_regularizer = weight_regularizer

    def regularized_weights(self) -> torch.Tensor:
        """The weights a ``weight_regularizer`` sees (the proxies ``[num_proxies, D]`` of proxy losses)."""
        raise TypeError(f"{type(self).__name__} has no weights to regularize; weight_regularizer needs a proxy loss.")

    def add_regularization(self, loss: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """``loss + w_e * R_e(embeddings) + w_w * R_w(weights)`` for the regularizers that are set, in the
        embeddings' dtype (every ``forward`` ends here: a float32 accumulation of float16 inputs is cast back)."""
        if self.embedding_regularizer is not None:
            loss = loss + self.embedding_reg_weight * self.embedding_regularizer(embeddings).to(loss.dtype)
        if self.weight_regularizer is not None:
            loss = loss + self.weight_reg_weight * self.weight_regularizer(self.regularized_weights()).to(loss.dtype)
        return as_input_dtype(loss, embeddings)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor | None, **kwargs) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def extra_repr(self) -> str:
        keys = getattr(self, "_repr_keys", ())
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in keys)


def _validating_init(init):
    """Wrap a loss's ``__init__`` so its arguments meet the class's constraints before it runs (outermost call only)."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        if self.__dict__.get("_checking_parameters"):
            return init(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return init(self, *args, **kwargs)  # let Python report the wrong call as usual
        bound.apply_defaults()
        constraints = type(self).parameter_constraints()
        params = {k: v for k, v in bound.arguments.items() if k in constraints}
        validate_params(type(self).__name__, params, {k: constraints[k] for k in params})
        object.__setattr__(self, "_checking_parameters", True)
        try:
            init(self, *args, **kwargs)
        finally:
            self.__dict__.pop("_checking_parameters", None)

    return wrapper

