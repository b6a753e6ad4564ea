"""Base of the classification-style losses (ArcFace, CosFace, SphereFace, L-Softmax, ...): class
weights compared with embeddings, kept in the loss's :class:`~dmlkit.proxies.ProxyBank`.

PML's layout is kept for its users: ``loss.W`` is the bank's leaf parameter ``[embedding_size,
num_classes * K]`` (the bank's feature-major layout), and ``loss.proxies`` is its ``[C*K, D]``
class-major view. The call is PML's: ``loss(embeddings, labels, indices_tuple=None)`` where a
miner's output weights each sample by how often it occurs in it (PML's ``convert_to_weights``).
"""

from __future__ import annotations

import math

import torch

from dmlkit.core.validation import Interval
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy._margin_softmax import TargetMargin, chunked_margin_softmax, dense_margin_softmax
from dmlkit.losses.proxy._math import unit_rows, unit_vectors


def miner_weights(indices_tuple: object, labels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``[B]`` weight of each sample: its count in the mined indices over the largest count (PML's rule).

    ``indices_tuple``: PML's tuple of index tensors, or dmlkit's ``PairSelection`` /
    ``TripletSelection``; ``None`` or an empty selection gives ``None`` (every weight 1).
    """
    if indices_tuple is None:
        return None
    if hasattr(indices_tuple, "to_indices_tuple"):
        indices_tuple = indices_tuple.to_indices_tuple()
    if not isinstance(indices_tuple, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in indices_tuple):
        raise InvalidParameterError(
            f"indices_tuple must be a miner's output (a tuple of index tensors, a PairSelection or a "
            f"TripletSelection) or None. Got {type(indices_tuple).__name__} instead."
        )
    if all(t.numel() == 0 for t in indices_tuple):
        return None
    indices, counts = torch.unique(torch.cat([t.reshape(-1) for t in indices_tuple]).to(labels.device),
                                   return_counts=True)
    weights = torch.zeros(labels.shape[0], dtype=dtype, device=labels.device)
    weights[indices] = counts.to(dtype) / counts.max().to(dtype)
    return weights


class ClassificationLoss(ProxyLoss):
    """A softmax (or regression) over class weights ``W``; subclasses give :meth:`per_sample_loss`.

    ``reducer=`` / ``reduction=``: how the per-sample terms become the loss (PML's ``MeanReducer``
    by default; mean over non-zero, sum and threshold reducers work too).
    """

    supports_fractional = False
    proxy_layout = "feature_major"
    reductions = ("mean", "mean_nonzero", "sum", "threshold")

    def _init_weights(self, weight_init_func: object | None) -> None:
        """PML's ``weight_init_func(W)`` on the ``[D, C*K]`` weights, when given."""
        if weight_init_func is None:
            return
        if not callable(weight_init_func):
            raise InvalidParameterError(
                f"The 'weight_init_func' parameter of {type(self).__name__} must be a callable or None. "
                f"Got {weight_init_func!r} instead."
            )
        with torch.no_grad():
            weight_init_func(self.W)

    # ------------------------------------------------------------------ PML's W
    @property
    def W(self) -> torch.nn.Parameter:  # noqa: N802 - PML's name
        """The class weights as PML lays them out, ``[embedding_size, num_classes * K]``: the parameter itself."""
        return self.bank.weight

    def __setattr__(self, name: str, value: object) -> None:
        if name == "W" and "bank" in self.__dict__.get("_modules", {}):
            self.set_W(value)
        else:
            super().__setattr__(name, value)

    def set_W(self, value: object) -> None:  # noqa: N802 - PML's name
        """Make ``value [D, C*K]`` the weights (a Parameter is shared as in PML, a tensor is wrapped)."""
        expected = (self.embedding_size, self.bank.num_proxies)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != expected or not value.is_floating_point():
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise DataError(
                f"{type(self).__name__}.W must be a float tensor of shape {list(expected)} "
                f"(embedding_size x num_classes). Got {shape} instead."
            )
        self.bank.weight = value if isinstance(value, torch.nn.Parameter) else torch.nn.Parameter(value)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "W" in state_dict and prefix + "bank.weight" not in state_dict:  # a PML checkpoint: W only
            state_dict[prefix + "bank.weight"] = state_dict.pop(prefix + "W")
            for key, value in self.state_dict().items():  # what PML does not save keeps its current value
                state_dict.setdefault(prefix + key, value)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ PML's call
    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor | None = None,
        indices_tuple: object | None = None,
        ref_emb: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``embeddings [B, D]``, ``labels [B]``; ``indices_tuple`` (a miner's output) weights the samples."""
        if (ref_emb is not None and ref_emb is not embeddings) or (ref_labels is not None and ref_labels is not labels):
            raise InvalidParameterError(f"{type(self).__name__} takes no ref_emb / ref_labels: it compares the "
                                        "batch with its class weights.")
        if labels is None:
            raise InvalidParameterError(f"{type(self).__name__} needs labels (class ids in [0, num_classes)).")
        return super().forward(embeddings, labels, mined=indices_tuple)

    def compute_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, mined: object = None) -> torch.Tensor:
        self.bank.check_labels(labels)
        terms = self.per_sample_loss(embeddings, labels)
        weights = miner_weights(mined, labels, terms.dtype)
        if weights is not None:
            terms = terms * weights
        return self.reducer(terms, None)

    def per_sample_loss(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def weights_as(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``proxies [C*K, D]`` in the embeddings' dtype (differentiable cast)."""
        return self.proxies.to(torch.promote_types(embeddings.dtype, self.proxies.dtype))

    def W_as(self, embeddings: torch.Tensor) -> torch.Tensor:  # noqa: N802 - PML's name
        """``W [D, C*K]`` in the embeddings' dtype (differentiable cast)."""
        return self.W.to(torch.promote_types(embeddings.dtype, self.W.dtype))


class MarginSoftmaxLoss(ClassificationLoss):
    """Softmax cross-entropy over ``scale * cos`` with a margin on the target class, computed
    ``chunk_size`` classes at a time (:mod:`dmlkit.losses.proxy._margin_softmax`).

    ``sample_rate < 1`` is partial FC (An et al., "Partial FC", 2021): each step the softmax runs
    over every class of the batch plus a uniform sample of the others, ``ceil(sample_rate * C)``
    classes in all, drawn from a generator seeded by ``seed`` whose state is in ``state_dict``.
    """

    _parameter_constraints = {
        "scale": [Interval(float, 0, None, closed="neither")],
        "chunk_size": [Interval(int, 1, None)],
        "sample_rate": [Interval(float, 0, 1, closed="right")],
    }

    def _setup_margin_softmax(self, scale: float, chunk_size: int, sample_rate: float) -> None:
        self.scale = float(scale)
        self.chunk_size = int(chunk_size)
        self.sample_rate = float(sample_rate)
        self._sampler = torch.Generator().manual_seed(self.bank.seed)

    def target_margin(self) -> TargetMargin:  # pragma: no cover - each subclass's margin
        raise NotImplementedError

    def get_extra_state(self) -> dict:
        return {"sampler": self._sampler.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self._sampler.set_state(state["sampler"])

    def sample_classes(self, labels: torch.Tensor) -> torch.Tensor | None:
        """Sorted class ids ``[U]`` for partial FC (every class of ``labels`` included); None: all classes."""
        num_classes = self.num_classes
        count = math.ceil(self.sample_rate * num_classes)
        if self.sample_rate >= 1.0:
            return None
        scores = torch.rand(num_classes, generator=self._sampler).to(labels.device)
        scores[labels] = 2.0  # the batch's classes always take part
        count = max(count, int(torch.unique(labels).numel()))
        return torch.topk(scores, count, sorted=False).indices.sort().values

    def cosine_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` cosine to each class (its nearest sub-centre when ``K > 1``)."""
        cos = self.distance(embeddings, self.weights_as(embeddings))
        k = int(self.proxies_per_class)
        return cos if k == 1 else cos.view(embeddings.shape[0], self.num_classes, k).amax(dim=2)

    def get_logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``scale * cos`` ``[B, C]`` (PML's ``get_logits``: no margin)."""
        return self.cosine_logits(embeddings) * self.scale

    def per_sample_loss(self, embeddings: torch.Tensor, labels: torch.Tensor, chunked: bool = True) -> torch.Tensor:
        """``[B]`` margin-softmax cross-entropy (``chunked=False``: the dense autograd twin)."""
        weight = self.W_as(embeddings)
        embeddings = embeddings.to(weight.dtype)
        columns = self.sample_classes(labels)
        k = int(self.proxies_per_class)
        if not chunked:
            return dense_margin_softmax(unit_vectors(embeddings, 1), weight, labels, self.target_margin(), self.scale,
                                        k, columns)
        return chunked_margin_softmax(unit_rows(embeddings), weight, labels, self.target_margin(), self.scale, k,
                                      self.chunk_size, columns)
