"""Cross-batch memory (Wang et al., 2020, "XBM"): a FIFO queue of past embeddings used as the
reference set of a pair loss.

Every step the batch is enqueued first (detached), then the loss compares the batch
(anchors) with the whole filled memory (references), the batch's own fresh copies excluded.
All state — embeddings, labels, queue pointer, fill count, step count — is a registered
buffer, so ``state_dict()`` / ``load_state_dict()`` resume exactly (PML keeps the pointer
outside the state dict). PML's interface is here too: ``forward(embeddings, labels,
indices_tuple=None, enqueue_mask=None)``, ``add_to_memory``, ``curr_batch_idx`` (the slots of the
last enqueued rows), ``create_indices_tuple``, ``supported_losses()``; miners may return PML tuples
or dmlkit selections, and the wrapped loss may be PML's (it then gets PML's tuple).

During the first ``warmup_steps`` calls the memory is filled but
the loss uses the batch alone (the XBM paper's "slow drift" warm-up; ASAP trains 1K steps
before switching XBM on).
"""

from __future__ import annotations

import torch
from torch import nn

from dmlkit.core.devices import follow_device_, to_device
from dmlkit.core.validation import InstanceOf, Interval, check_embeddings_labels, validate_params
from dmlkit.distances._closed_form import reference_major
from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.losses.base import MetricLoss
from dmlkit.losses.pml_bases import register_loss_wrapper
from dmlkit.mining.selection import PairSelection, TripletSelection, selection_from_indices_tuple

#: The losses PML's CrossBatchMemory lists as supported (PML's names).
PML_SUPPORTED_LOSSES = (
    "AngularLoss", "CircleLoss", "ContrastiveLoss", "GeneralizedLiftedStructureLoss", "IntraPairVarianceLoss",
    "LiftedStructureLoss", "MarginLoss", "MultiSimilarityLoss", "NCALoss", "NTXentLoss",
    "SignalToNoiseRatioContrastiveLoss", "SupConLoss", "TripletMarginLoss", "TupletMarginLoss",
)


@register_loss_wrapper
class CrossBatchMemory(nn.Module):
    """``loss(batch [B, D] vs memory [M, D])`` with a FIFO memory of ``memory_size`` embeddings.

    Wang et al. (2020) Sec. 3.2. ``miner(embeddings, labels, ref_emb, ref_labels)`` (optional)
    selects pairs or triplets against the memory; otherwise all pairs are used (the wrapped
    loss's own ``miner`` only runs during warm-up). Works with every loss that accepts
    ``ref_emb`` (all pair losses except N-pairs). The memory follows the embeddings' device and takes
    their dtype, as PML's (``cast_types``): a float16 batch is stored as given (nothing is lost), and a
    wrapped PML loss meets one dtype; dmlkit's losses accumulate it in float32.
    """

    def __init__(
        self,
        loss: MetricLoss,
        embedding_size: int,
        memory_size: int = 1024,
        miner: object | None = None,
        warmup_steps: int = 0,
    ):
        super().__init__()
        validate_params(
            type(self).__name__,
            {"loss": loss, "embedding_size": embedding_size, "memory_size": memory_size, "warmup_steps": warmup_steps},
            {
                "loss": [InstanceOf((nn.Module,))],
                "embedding_size": [Interval(int, 1, None)],
                "memory_size": [Interval(int, 1, None)],
                "warmup_steps": [Interval(int, 0, None)],
            },
        )
        if not getattr(loss, "supports_references", True):
            raise InvalidParameterError(
                f"CrossBatchMemory cannot wrap {type(loss).__name__}: that loss does not take a reference set."
            )
        if miner is not None and not callable(miner):
            raise InvalidParameterError(f"The 'miner' parameter of CrossBatchMemory must be callable. Got {miner!r} instead.")
        self.loss = loss
        self.miner = miner
        self.embedding_size = embedding_size
        self.memory_size = memory_size
        self.warmup_steps = warmup_steps
        self.register_buffer("embedding_memory", torch.zeros(memory_size, embedding_size))
        self.register_buffer("label_memory", torch.zeros(memory_size, dtype=torch.long))
        self.register_buffer("queue_idx", torch.zeros((), dtype=torch.long))
        self.register_buffer("num_filled", torch.zeros((), dtype=torch.long))
        self.register_buffer("num_steps", torch.zeros((), dtype=torch.long))
        # slots written by the last enqueue (PML's curr_batch_idx); rebuilt every step, so not saved
        self.register_buffer("curr_batch_idx", torch.zeros(0, dtype=torch.long), persistent=False)

    @staticmethod
    def supported_losses() -> list[str]:
        """PML's list of losses it supports with a memory (dmlkit wraps any loss taking ``ref_emb``)."""
        return list(PML_SUPPORTED_LOSSES)

    @classmethod
    def check_loss_support(cls, loss_name: str) -> None:
        """PML's check: raise for a loss name outside :meth:`supported_losses`."""
        if loss_name not in cls.supported_losses():
            raise InvalidParameterError(f"CrossBatchMemory does not list {loss_name} among its supported losses "
                                        f"{cls.supported_losses()}.")

    def extra_repr(self) -> str:
        return f"embedding_size={self.embedding_size}, memory_size={self.memory_size}, warmup_steps={self.warmup_steps}"

    @property
    def has_been_filled(self) -> bool:
        return int(self.num_filled) >= self.memory_size

    def reset_queue(self) -> None:
        """Empty the memory (step count included)."""
        self.embedding_memory.zero_()
        self.label_memory.zero_()
        self.queue_idx = torch.zeros_like(self.queue_idx)
        self.num_filled = torch.zeros_like(self.num_filled)
        self.num_steps.zero_()
        self.curr_batch_idx = self.curr_batch_idx[:0]

    def memory(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part of the memory: ``(embeddings [F, D], labels [F])`` (views, no copy)."""
        filled = min(int(self.num_filled), self.memory_size)
        return self.embedding_memory[:filled], self.label_memory[:filled]

    @torch.no_grad()
    def enqueue(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Write ``embeddings [n, D]`` (detached) at the queue pointer; return their slots ``[n]``
        (also kept as ``curr_batch_idx``). The pointer and fill count are replaced, not updated in
        place, so a value read before the call keeps its meaning (as PML's integer does)."""
        n = embeddings.shape[0]
        # PML's users move embedding_memory / label_memory by hand and then call add_to_memory (no forward):
        # the pointer, counts and memory follow the embeddings, as in forward
        follow_device_(self, embeddings.device, *self._buffers.values())
        slots = (self.queue_idx + torch.arange(n, device=self.queue_idx.device)) % self.memory_size
        self.embedding_memory.index_copy_(0, slots, embeddings.detach().to(self.embedding_memory.dtype))
        self.label_memory.index_copy_(0, slots, labels.to(self.label_memory.device, self.label_memory.dtype))
        self.queue_idx = (self.queue_idx + n) % self.memory_size
        self.num_filled = torch.clamp_max(self.num_filled + n, self.memory_size)
        self.curr_batch_idx = slots
        return slots

    def add_to_memory(self, embeddings: torch.Tensor, labels: torch.Tensor, batch_size: int | None = None) -> None:
        """PML's name for :meth:`enqueue` (the first ``batch_size`` rows; default all)."""
        n = embeddings.shape[0] if batch_size is None else int(batch_size)
        self.enqueue(embeddings[:n], labels[:n])

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        indices_tuple: tuple | PairSelection | TripletSelection | None = None,
        enqueue_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Enqueue the batch, then return the wrapped loss of the batch against the memory.

        ``enqueue_mask [B]`` (bool): only those rows go to the memory and only the others are
        anchors (MoCo-style); no self-pair then needs excluding. ``indices_tuple`` (PML's): extra
        pairs or triplets (anchor rows, memory slots) added to the mined ones, as PML concatenates them.
        """
        if indices_tuple is not None and enqueue_mask is not None:
            raise InvalidParameterError("CrossBatchMemory takes indices_tuple or enqueue_mask, not both.")
        check_embeddings_labels(embeddings, labels)
        labels, indices_tuple, enqueue_mask = to_device((labels, indices_tuple, enqueue_mask), embeddings.device)
        if embeddings.shape[1] != self.embedding_size:
            raise DataError(
                f"embeddings has {embeddings.shape[1]} columns but the memory's embedding_size is {self.embedding_size}."
            )
        if enqueue_mask is not None:
            if enqueue_mask.dtype != torch.bool or tuple(enqueue_mask.shape) != (embeddings.shape[0],):
                raise DataError(
                    f"enqueue_mask must be a bool tensor [{embeddings.shape[0]}] (one per row of embeddings). "
                    f"Got {enqueue_mask.dtype} {tuple(enqueue_mask.shape)}."
                )
            queued_emb, queued_labels = embeddings[enqueue_mask], labels[enqueue_mask]
            embeddings, labels = embeddings[~enqueue_mask], labels[~enqueue_mask]
        else:
            queued_emb, queued_labels = embeddings, labels
        if queued_emb.shape[0] > self.memory_size:
            raise DataError(
                f"the batch enqueues {queued_emb.shape[0]} rows but memory_size is {self.memory_size}."
            )
        # PML's cast_types: the memory follows the embeddings; every buffer is checked, since PML's users move
        # embedding_memory / label_memory themselves and the pointer and counts must come along
        follow_device_(self, embeddings.device, *self._buffers.values())
        if self.embedding_memory.dtype != embeddings.dtype:  # the batch's dtype, as PML's (a PML loss meets one dtype)
            self.embedding_memory = self.embedding_memory.to(embeddings.dtype)
        warming_up = int(self.num_steps) < self.warmup_steps
        slots = self.enqueue(queued_emb, queued_labels)
        self.num_steps += 1
        if warming_up:
            return self.loss(embeddings, labels)
        mem_emb, mem_labels = self.memory()
        own_slots = None if enqueue_mask is not None else slots
        if indices_tuple is not None:
            pairs = self.create_indices_tuple(embeddings, labels, mem_emb, mem_labels, indices_tuple, True)
        else:
            pairs = self._select(embeddings, labels, mem_emb, mem_labels, own_slots)
        if isinstance(self.loss, MetricLoss):  # dmlkit losses take a selection (or PML's tuple) as indices_tuple
            return self.loss(embeddings, labels, pairs, mem_emb, mem_labels)
        if isinstance(pairs, (PairSelection, TripletSelection)):
            pairs = pairs.to_indices_tuple()
        return self.loss(embeddings, labels, pairs, mem_emb, mem_labels)

    def create_indices_tuple(self, embeddings, labels, mem_emb, mem_labels, input_indices_tuple=None,
                             do_remove_self_comparisons: bool = True) -> tuple[torch.Tensor, ...]:
        """PML's tuple of the mined (or all) pairs against the memory, the batch's own slots left out
        when ``do_remove_self_comparisons``, followed by ``input_indices_tuple`` (PML's order; triplets
        given with mined pairs become pairs ``(a, p, a, n)``, pairs given with mined triplets make the
        mined triplets pairs too)."""
        own = self.curr_batch_idx if do_remove_self_comparisons and len(self.curr_batch_idx) == len(embeddings) else None
        mined = self._select(embeddings, labels, mem_emb, mem_labels, own).to_indices_tuple()
        if input_indices_tuple is None:
            return mined
        given = input_indices_tuple
        if isinstance(given, (PairSelection, TripletSelection)):
            given = given.to_indices_tuple()
        if len(given) != len(mined):
            mined, given = _as_pairs(mined), _as_pairs(given)
        return tuple(torch.cat([m, g.to(m.device).long()]) for m, g in zip(mined, given))

    def _select(self, embeddings, labels, mem_emb, mem_labels, own_slots):
        """Pairs of the batch against the memory (mined or all), without each row's own slot."""
        rows = torch.arange(embeddings.shape[0], device=embeddings.device)
        if self.miner is None:
            # 0/1 masks in the loss's dtype: the loss needs them as numbers, and one pass over
            # the [B, M] matrix builds each (the memory is usually large).
            dtype = torch.float64 if embeddings.dtype == torch.float64 else torch.float32
            pos = _same_label(labels, mem_labels, dtype)
            neg = 1.0 - pos
            if own_slots is not None:
                pos[rows, own_slots] = 0.0
                neg[rows, own_slots] = 0.0
            return PairSelection(pos, neg)
        mined = self.miner(embeddings, labels, mem_emb, mem_labels)
        if not isinstance(mined, (PairSelection, TripletSelection)):  # a PML miner's tuple
            mined = selection_from_indices_tuple(mined, embeddings.shape[0], mem_emb.shape[0])
        if own_slots is None:
            return mined
        self_pairs = torch.zeros(embeddings.shape[0], mem_emb.shape[0], dtype=torch.bool, device=embeddings.device)
        self_pairs[rows, own_slots] = True
        if isinstance(mined, PairSelection):
            keep = ~self_pairs
            return PairSelection(
                mined.positive & keep,
                mined.negative & keep,
                None if mined.positive_weight is None else mined.positive_weight * keep,
                None if mined.negative_weight is None else mined.negative_weight * keep,
            )
        if isinstance(mined, TripletSelection):
            a, p, n = mined.anchor, mined.positive, mined.negative
            keep = ~self_pairs[a, p] & ~self_pairs[a, n]
            return TripletSelection(a[keep], p[keep], n[keep])
        raise InvalidParameterError(
            f"CrossBatchMemory's miner must return a PairSelection or TripletSelection. Got {type(mined).__name__}."
        )


def _as_pairs(indices: tuple) -> tuple:
    """PML's pair tuple ``(a1, p, a2, n)`` of a pair or triplet tuple (``(a, p, n)`` -> ``(a, p, a, n)``)."""
    return tuple(indices) if len(indices) == 4 else (indices[0], indices[1], indices[0], indices[2])


_INT32 = torch.iinfo(torch.int32)


def _same_label(labels: torch.Tensor, mem_labels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, M]`` 1.0 where a batch label equals a memory label, written straight into ``dtype``.

    Class ids that fit in int32 are compared as int32, which is several times faster than
    int64 over a large memory; the result is the same. Against a large memory the mask is
    stored ``[M, B]`` (a transposed view), the layout of the loss's distance matrix.
    """
    if labels.numel() and mem_labels.numel():
        lo, hi = torch.stack([*torch.aminmax(labels), *torch.aminmax(mem_labels)]).view(2, 2).T.tolist()
        if _INT32.min <= min(lo) and max(hi) <= _INT32.max:
            labels, mem_labels = labels.int(), mem_labels.int()
    if reference_major(mem_labels.shape[0]):  # the layout of the loss's distance matrix
        out = torch.empty(mem_labels.shape[0], labels.shape[0], dtype=dtype, device=labels.device)
        return torch.eq(mem_labels[:, None], labels[None, :], out=out).T
    out = torch.empty(labels.shape[0], mem_labels.shape[0], dtype=dtype, device=labels.device)
    return torch.eq(labels[:, None], mem_labels[None, :], out=out)
