"""PML's public base and wrapper classes, as thin dmlkit equivalents.

A PML user subclasses these or tests ``isinstance`` against them:

* :class:`BaseMetricLossFunction` — PML's protocol: ``compute_loss(embeddings, labels,
  indices_tuple, ref_emb, ref_labels)`` returns a loss dict ``{name: {"losses", "indices",
  "reduction_type"}}``; the call reduces each sub-loss with ``self.reducer`` (dmlkit's
  ``reducer(terms)``, or a PML reducer object called PML's way) and adds the regularizers.
  Every dmlkit loss (:class:`~dmlkit.losses.base.MetricLoss`) counts as one.
* :class:`GenericPairLoss` — ``_compute_loss(mat, pos_mask, neg_mask)`` (``mat_based_loss=True``)
  or ``_compute_loss(pos_pairs, neg_pairs, indices_tuple)``; dmlkit's pair losses
  (:class:`~dmlkit.losses.pair.base.PairLoss`) count as one.
* :class:`EmbeddingRegularizerMixin` (every dmlkit loss takes ``embedding_regularizer=``) and
  :class:`WeightRegularizerMixin` (dmlkit's proxy losses take ``weight_regularizer=``).
* :class:`BaseLossWrapper` — ``supported_losses()`` / ``check_loss_support(name)``; dmlkit's
  ``CrossBatchMemory`` counts as one.

The ``isinstance`` rule lives in :class:`_Equivalent`: only the PML-named class itself accepts
dmlkit's classes of that role; a user's subclass is an ordinary class.
"""

from __future__ import annotations

import torch

from dmlkit.core.devices import to_device
from dmlkit.core.validation import check_embeddings_labels
from dmlkit.distances import BaseDistance, LpDistance, as_distance
from dmlkit.losses.base import MetricLoss, zero_loss
from dmlkit.losses.reducers import BaseReducer, MeanReducer
from dmlkit.mining.selection import label_masks


class _Equivalent(type):
    """``isinstance`` / ``issubclass`` against a PML name also accept dmlkit's classes of that role."""

    def _role(cls) -> tuple[type, ...]:
        role = cls.__dict__.get("_dmlkit_role")
        return role() if role is not None else ()

    def __instancecheck__(cls, obj: object) -> bool:
        return type.__instancecheck__(cls, obj) or any(isinstance(obj, r) for r in cls._role())

    def __subclasscheck__(cls, sub: type) -> bool:
        return type.__subclasscheck__(cls, sub) or any(issubclass(sub, r) for r in cls._role())


def _loss_dict_item(losses: object) -> dict:
    return {"losses": losses, "indices": None, "reduction_type": "already_reduced"}


class EmbeddingRegularizerMixin(metaclass=_Equivalent):
    """PML's mixin: ``embedding_regularizer=`` / ``embedding_reg_weight=`` and the ``embedding_reg_loss`` entry."""

    _dmlkit_role = staticmethod(lambda: (MetricLoss,))

    def __init__(self, embedding_regularizer=None, embedding_reg_weight=1, **kwargs):
        super().__init__(**kwargs)
        self.embedding_regularizer = embedding_regularizer
        self.embedding_reg_weight = embedding_reg_weight

    def embedding_regularization_loss(self, embeddings: torch.Tensor) -> dict:
        """``{"losses": w * R(embeddings)}`` (0 without a regularizer), already reduced."""
        reg = self.embedding_regularizer
        return _loss_dict_item(0 if reg is None else reg(embeddings) * self.embedding_reg_weight)

    def add_embedding_regularization_to_loss_dict(self, loss_dict: dict, embeddings: torch.Tensor) -> None:
        if self.embedding_regularizer is not None:
            loss_dict["embedding_reg_loss"] = self.embedding_regularization_loss(embeddings)

    def regularization_loss_names(self) -> list[str]:
        return ["embedding_reg_loss"]


def _proxy_loss() -> tuple[type, ...]:
    from dmlkit.losses.proxy._base import ProxyLoss

    return (ProxyLoss,)


class WeightRegularizerMixin(metaclass=_Equivalent):
    """PML's mixin: ``weight_regularizer=`` / ``weight_reg_weight=`` / ``weight_init_func=``; the ``weight_reg_loss`` entry."""

    _dmlkit_role = staticmethod(_proxy_loss)

    def __init__(self, weight_regularizer=None, weight_reg_weight=1, weight_init_func=None, **kwargs):
        super().__init__(**kwargs)
        self.weight_regularizer = weight_regularizer
        self.weight_reg_weight = weight_reg_weight
        self.weight_init_func = torch.nn.init.normal_ if weight_init_func is None else weight_init_func

    def weight_regularization_loss(self, weights: torch.Tensor) -> dict:
        """``{"losses": w * R(weights)}`` (0 without a regularizer), already reduced."""
        reg = self.weight_regularizer
        return _loss_dict_item(0 if reg is None else reg(weights) * self.weight_reg_weight)

    def add_weight_regularization_to_loss_dict(self, loss_dict: dict, weights: torch.Tensor) -> None:
        if self.weight_regularizer is not None:
            loss_dict["weight_reg_loss"] = self.weight_regularization_loss(weights)

    def regularization_loss_names(self) -> list[str]:
        return ["weight_reg_loss"]


class BaseMetricLossFunction(MetricLoss, metaclass=_Equivalent):
    """PML's loss protocol on dmlkit's base: subclasses write ``compute_loss(...) -> loss dict``.

    Defaults as PML's: ``LpDistance(normalize_embeddings=True)`` and the mean reducer.
    """

    _dmlkit_role = staticmethod(lambda: (MetricLoss,))
    requires_labels = False

    def __init__(self, distance=None, reducer=None, embedding_regularizer=None, embedding_reg_weight=1,
                 collect_stats=False, **kwargs):
        super().__init__()
        name = type(self).__name__
        self.distance = self.get_default_distance() if distance is None else as_distance(distance, name)
        self.reducer = self.get_default_reducer() if reducer is None else reducer
        self.collect_stats = collect_stats
        self.set_regularizers(embedding_regularizer, embedding_reg_weight)

    def get_default_distance(self) -> BaseDistance:
        return LpDistance(normalize_embeddings=True)

    def get_default_reducer(self):
        return MeanReducer()

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> dict:  # pragma: no cover
        raise NotImplementedError

    def forward(self, embeddings, labels=None, indices_tuple=None, ref_emb=None, ref_labels=None) -> torch.Tensor:
        check_embeddings_labels(embeddings, labels)
        labels, indices_tuple, ref_emb, ref_labels = to_device((labels, indices_tuple, ref_emb, ref_labels),
                                                               embeddings.device)
        self.follow_embeddings_(embeddings)
        if ref_emb is None:
            ref_emb, ref_labels = embeddings, labels
        else:
            check_embeddings_labels(ref_emb, ref_labels, name="ref_emb", labels_name="ref_labels")
        loss_dict = self.compute_loss(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        return self.add_regularization(self.reduce(loss_dict, embeddings, labels), embeddings)

    def reduce(self, loss_dict: dict, embeddings: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor:
        """The sum over sub-losses of each one reduced: as given when ``already_reduced``, else by ``self.reducer``."""
        total = zero_loss(embeddings)
        for name, item in loss_dict.items():
            losses = item["losses"]
            if not isinstance(losses, torch.Tensor):
                total = total + float(losses)
            elif item.get("reduction_type") == "already_reduced" or losses.dim() == 0:
                total = total + losses.sum()
            elif isinstance(self.reducer, BaseReducer):
                total = total + self.reducer(losses)
            else:  # a PML reducer object: PML's own call
                total = total + self.reducer({name: item}, embeddings, labels)
        return total

    def zero_loss(self) -> dict:
        return _loss_dict_item(0)

    def zero_losses(self) -> dict:
        return {name: self.zero_loss() for name in self.sub_loss_names()}

    def _sub_loss_names(self) -> list[str]:
        return ["loss"]

    def sub_loss_names(self) -> list[str]:
        return self._sub_loss_names() + (["embedding_reg_loss"] if self.embedding_regularizer is not None else [])


def _pair_loss() -> tuple[type, ...]:
    from dmlkit.losses.pair.base import PairLoss

    return (PairLoss,)


class GenericPairLoss(BaseMetricLossFunction):
    """PML's pair-loss protocol: the pairs of ``indices_tuple`` (or all labelled pairs) handed to ``_compute_loss``."""

    _dmlkit_role = staticmethod(_pair_loss)

    def __init__(self, mat_based_loss: bool, **kwargs):
        super().__init__(**kwargs)
        self.mat_based_loss = mat_based_loss

    def compute_loss(self, embeddings, labels, indices_tuple, ref_emb, ref_labels) -> dict:
        pairs = self.pair_indices(embeddings, labels, indices_tuple, ref_emb, ref_labels)
        if all(len(x) <= 1 for x in pairs):
            return self.zero_losses()
        mat = self.distance(embeddings, ref_emb)
        a1, p, a2, n = pairs
        if self.mat_based_loss:
            pos_mask, neg_mask = torch.zeros_like(mat), torch.zeros_like(mat)
            pos_mask[a1, p] = 1
            neg_mask[a2, n] = 1
            return self._compute_loss(mat, pos_mask, neg_mask)
        return self._compute_loss(mat[a1, p], mat[a2, n], pairs)

    @staticmethod
    def pair_indices(embeddings, labels, indices_tuple, ref_emb, ref_labels) -> tuple[torch.Tensor, ...]:
        """PML's ``(a1, p, a2, n)``: the given pairs, triplets as their two pairs, or every labelled pair."""
        if indices_tuple is not None:
            if len(indices_tuple) == 3:
                a, p, n = indices_tuple
                return a, p, a, n
            return tuple(indices_tuple)
        same_set = ref_emb is embeddings
        pos, neg = label_masks(labels, None if same_set else ref_labels, same_set=same_set)
        return (*pos.nonzero(as_tuple=True), *neg.nonzero(as_tuple=True))

    def _compute_loss(self, *args) -> dict:  # pragma: no cover - interface
        raise NotImplementedError


#: dmlkit's loss wrappers, which ``isinstance(x, BaseLossWrapper)`` also accepts. A wrapper registers itself
#: (:func:`register_loss_wrapper`), so this module never imports the packages that wrap losses (no cycle).
LOSS_WRAPPERS: list[type] = []


def register_loss_wrapper(cls: type) -> type:
    """Class decorator: ``cls`` (e.g. ``CrossBatchMemory``) counts as a PML ``BaseLossWrapper``."""
    LOSS_WRAPPERS.append(cls)
    return cls


class BaseLossWrapper(torch.nn.Module, metaclass=_Equivalent):
    """PML's base of loss wrappers: checks at construction that the wrapped loss is supported."""

    _dmlkit_role = staticmethod(lambda: tuple(LOSS_WRAPPERS))

    def __init__(self, loss, **kwargs):
        super().__init__(**kwargs)
        self.check_loss_support(type(loss).__name__)

    @staticmethod
    def supported_losses() -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def check_loss_support(cls, loss_name: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


__all__ = [
    "BaseLossWrapper", "BaseMetricLossFunction", "EmbeddingRegularizerMixin", "GenericPairLoss", "WeightRegularizerMixin",
]
