"""The base class and registry of every miner: input checks, reference resolution, seeded sampling.

A miner is an ``nn.Module`` called as ``miner(embeddings [B, D], labels [B], ref_emb=None,
ref_labels=None)``. The call validates its inputs, resolves the reference set (the batch
itself unless a memory is given), and runs :meth:`BaseMiner.mine` without gradients. It
returns a :class:`~dmlkit.mining.selection.PairSelection` or ``TripletSelection``;
:meth:`BaseMiner.as_pml` gives the same miner with pytorch-metric-learning's tuple output.
"""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.core.devices import autocast_off, to_device
from dmlkit.core.registry import Registry
from dmlkit.core.validation import NONE, InstanceOf, Interval, check_embeddings_labels, validate_params
from dmlkit.distances import BaseDistance, LpDistance, as_distance
from dmlkit.exceptions import DataError
from dmlkit.mining.selection import PairSelection, TripletSelection, label_masks

MINERS: Registry[nn.Module] = Registry("miner")
class _DistanceLike:
    """Constraint: a dmlkit distance, or a pytorch-metric-learning one (converted by ``as_distance``)."""

    def accepts(self, value: object) -> bool:
        from dmlkit.exceptions import InvalidParameterError

        try:
            as_distance(value)
        except InvalidParameterError:
            return False
        return True

    def describe(self) -> str:
        return "a dmlkit or pytorch-metric-learning distance"


DISTANCE = _DistanceLike()


def default_distance() -> BaseDistance:
    """Euclidean distance between L2-normalised embeddings (PML's miner default)."""
    return LpDistance(power=1, normalize_embeddings=True)


def normalised_euclidean(distance: object | None, owner: str) -> BaseDistance:
    """``distance`` (default: :func:`default_distance`) when it is PML's asserted
    ``LpDistance(p=2, power=1, normalize_embeddings=True)``; anything else is refused."""
    from dmlkit.exceptions import InvalidParameterError

    measure = default_distance() if distance is None else as_distance(distance, owner)
    if not (isinstance(measure, LpDistance) and measure.power == 1 and measure.normalize_embeddings):
        raise InvalidParameterError(
            f"The 'distance' parameter of {owner} must be LpDistance(p=2, power=1, normalize_embeddings=True). "
            f"Got {measure!r} instead.")
    return measure


def empty_triplets(device: torch.device | str) -> TripletSelection:
    """A selection with no triplets."""
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return TripletSelection(empty, empty.clone(), empty.clone())


def empty_pairs(num_anchors: int, num_refs: int, device: torch.device | str) -> PairSelection:
    """A selection with no pairs (all-False ``[B, R]`` masks)."""
    none = torch.zeros(num_anchors, num_refs, dtype=torch.bool, device=device)
    return PairSelection(none, none.clone())


def triplet_margins(distance: BaseDistance, mat: torch.Tensor, anchor: torch.Tensor,
                    positive: torch.Tensor) -> torch.Tensor:
    """``[P, R]`` margins ``d(a, n) - d(a, p)`` (or ``s(a, p) - s(a, n)``) for each pair ``(a, p)``."""
    return distance.margin(mat[anchor], mat[anchor, positive][:, None])


class BaseMiner(nn.Module):
    """Base of every miner: ``forward(embeddings [B, D], labels [B], ref_emb=None, ref_labels=None)``."""

    #: True for a miner that thresholds its distance matrix as PML does, in the batch's own dtype (a triplet
    #: whose float16 margin sits on the threshold is PML's choice); the others mine half precision in float32.
    mines_in_input_dtype: bool = False

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ref_emb: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> PairSelection | TripletSelection:
        return self._run(self.mine, embeddings, labels, ref_emb, ref_labels)

    def pml_tuple(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor | None = None,
                  ref_labels: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """PML's index tuple of this call (what :class:`PMLStyleMiner` returns); a miner whose list
        costs less built alone than from its selection overrides it (with :meth:`_run`)."""
        return self(embeddings, labels, ref_emb, ref_labels).to_indices_tuple()

    def _run(self, mine, embeddings, labels, ref_emb, ref_labels):
        """Check the inputs, resolve the reference set, and call ``mine`` on them without gradients."""
        check_embeddings_labels(embeddings, labels)
        same_set = ref_emb is None
        if same_set:
            if ref_labels is not None:
                raise DataError("ref_labels was given without ref_emb; pass both or neither.")
            ref_emb, ref_labels = embeddings, labels
        else:
            if ref_labels is None:
                raise DataError("ref_emb was given without ref_labels; pass both or neither.")
            check_embeddings_labels(ref_emb, ref_labels, name="ref_emb", labels_name="ref_labels")
            if ref_emb.shape[1] != embeddings.shape[1]:
                raise DataError(
                    f"embeddings has {embeddings.shape[1]} columns but ref_emb has {ref_emb.shape[1]}."
                )
        labels, ref_emb, ref_labels = to_device((labels, ref_emb, ref_labels), embeddings.device)
        # fp16/bf16 inputs are mined in fp32 (as the losses compute): half-precision distances of
        # zero or duplicate rows overflow into inf/NaN sampling weights.
        half = () if self.mines_in_input_dtype else (torch.float16, torch.bfloat16)
        embeddings = embeddings.detach().float() if embeddings.dtype in half else embeddings.detach()
        ref_emb = embeddings if same_set else (ref_emb.detach().float() if ref_emb.dtype in half else ref_emb.detach())
        if ref_emb.dtype != embeddings.dtype:  # e.g. a float16 batch against a float32 memory: the wider of the two
            common = torch.promote_types(embeddings.dtype, ref_emb.dtype)
            embeddings, ref_emb = embeddings.to(common), ref_emb.to(common)
        with torch.no_grad(), autocast_off(embeddings.device.type):
            pos, neg = label_masks(labels, ref_labels, same_set=same_set)
            return mine(embeddings, ref_emb, pos, neg)

    def mine(self, embeddings: torch.Tensor, ref_emb: torch.Tensor, positive: torch.Tensor,
             negative: torch.Tensor) -> PairSelection | TripletSelection:  # pragma: no cover
        """Select from ``[B, R]`` positive/negative masks between anchors and references."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        keys = getattr(self, "_repr_keys", ())
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in keys)

    def as_pml(self) -> "PMLStyleMiner":
        """This miner called PML's way: ``miner(embeddings, labels)`` returns PML's index tuple."""
        return PMLStyleMiner(self)


class PMLStyleMiner(nn.Module):
    """A dmlkit miner with pytorch-metric-learning's output: ``(a1, p, a2, n)`` or ``(a, p, n)``.

    Drop it into a PML training loop in place of a PML miner; the tuple it returns is accepted
    by PML's losses and by dmlkit's (``loss(embeddings, labels, indices_tuple)``). Pairs come
    out in row-major order of the selection's masks.
    """

    def __init__(self, miner: BaseMiner):
        super().__init__()
        if not isinstance(miner, BaseMiner):
            raise TypeError(f"PMLStyleMiner wraps a dmlkit miner (a BaseMiner). Got {type(miner).__name__} instead.")
        self.miner = miner

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ref_emb: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return self.miner.pml_tuple(embeddings, labels, ref_emb, ref_labels)

    def mine(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor,
             ref_labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """PML's ``mine(embeddings, labels, ref_emb, ref_labels)``: the batch passed as its own
        reference set (the same tensors) is mined as one set, without self-pairs, as in PML."""
        if ref_emb is embeddings and ref_labels is labels:
            ref_emb = ref_labels = None
        with torch.no_grad():
            return self(embeddings, labels, ref_emb, ref_labels)


class SeededMinerMixin:
    """Owns a private ``torch.Generator`` (from ``seed`` or a caller's ``generator``).

    The generator state is part of ``state_dict`` (as extra state), so a resumed run draws
    the same samples as an uninterrupted one.
    """

    def _init_generator(self, seed: int, generator: torch.Generator | None) -> None:
        owner = type(self).__name__
        validate_params(owner, {"seed": seed, "generator": generator},
                        {"seed": [Interval(int, 0, None)], "generator": [InstanceOf((torch.Generator,)), NONE]})
        self.seed = seed
        self.generator = generator if generator is not None else torch.Generator().manual_seed(seed)

    def get_extra_state(self) -> dict:
        return {"generator_state": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.generator.set_state(state["generator_state"])

    def sample_rows(self, probabilities: torch.Tensor, num_samples: int = 1) -> torch.Tensor:
        """``[N, num_samples]`` column indices drawn (with replacement) from each row's distribution."""
        if probabilities.shape[0] == 0:
            return torch.zeros(0, num_samples, dtype=torch.long, device=probabilities.device)
        gen_device = self.generator.device
        drawn = torch.multinomial(probabilities.to(gen_device, torch.float64), num_samples,
                                  replacement=True, generator=self.generator)
        return drawn.to(probabilities.device)
