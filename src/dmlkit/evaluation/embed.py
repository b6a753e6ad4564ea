"""Embed a whole split with a model, batch by batch, in order."""

from __future__ import annotations

import torch
from torch import nn

#: Autocast dtype of each ``train.mixed_precision`` value: a run embeds in the precision it trained in.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The autocast dtype for ``train.mixed_precision`` (None: fp32)."""
    return AUTOCAST_DTYPES.get(mixed_precision)


def first_images(dataset, count: int = 2) -> torch.Tensor:
    """The first ``count`` inputs of a split as one batch, read as :func:`embed_dataset` reads them."""
    indices = list(range(min(count, len(dataset))))
    if hasattr(dataset, "get_batch"):
        return dataset.get_batch(indices)[0]
    return torch.stack([dataset[i][0] for i in indices])


@torch.no_grad()
def embed_dataset(
    model: nn.Module, dataset, batch_size: int = 512, num_workers: int = 0, autocast_dtype=None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings ``[N, D]`` (float32) and labels ``[N]`` of a whole split, in order, on the CPU.

    The one embedding loop: training evaluation, ``dmlkit evaluate``/``embed``/``search``, the
    index and :class:`dmlkit.inference.RunEmbedder` all embed through it. Batches go to the
    model's device (a GPU when the model is on one); the embeddings come back to the CPU once, at
    the end. ``progress=True`` shows a progress bar (tqdm) over the images. The batches run through
    :func:`dmlkit.models.inference_copy.inference_copy` of the model (batch norm folded into the
    convolutions, activations fused, chunks sized for the CPU's allocator), made at the first batch
    unless ``model`` already is one.
    """
    from dmlkit.models.inference_copy import InferenceCopy, inference_copy

    was_training = model.training
    model.eval()
    outs, labs = [], []
    runner = model if isinstance(model, InferenceCopy) else None
    device = next(model.parameters(), torch.empty(0)).device  # batches and autocast on the model's device
    on_cpu = device.type == "cpu"
    bar = None
    try:
        if hasattr(dataset, "get_batch"):
            n = len(dataset)
            batches = (dataset.get_batch(list(range(start, min(n, start + batch_size)))) for start in range(0, n, batch_size))
        else:
            batches = torch.utils.data.DataLoader(
                dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, pin_memory=not on_cpu
            )
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(dataset), desc="embed", unit="img", dynamic_ncols=True, leave=False)
        for x, y in batches:
            if not on_cpu:
                x = x.to(device, non_blocking=True)
            if runner is None:
                runner = inference_copy(model, x, autocast_dtype)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                outs.append(runner(x).float())
            if bar is not None:  # after the batch is embedded, so the bar's rate (and ETA) is the embedding's
                bar.update(len(y))
            labs.append(torch.as_tensor(y, dtype=torch.int64))
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    return torch.cat(outs).cpu(), torch.cat(labs)
