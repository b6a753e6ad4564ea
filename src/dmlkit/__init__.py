"""dmlkit: deep metric learning for PyTorch."""

__version__ = "0.1.0"

#: Public names imported on first use (``import dmlkit`` stays light): name -> module.
_LAZY = {
    "fit": "dmlkit.api",
    "Trainer": "dmlkit.recipe",
    "TrainResult": "dmlkit.engine.trainer",
    "Callback": "dmlkit.engine.callbacks",
    "EarlyStopping": "dmlkit.engine.callbacks",
    "TensorBoardLogger": "dmlkit.engine.loggers",
    "MLflowLogger": "dmlkit.engine.loggers",
    "WandbLogger": "dmlkit.engine.loggers",
}


def load(source, checkpoint: str = "best", *, token: str | None = None):
    """The trained embedding model, with its preprocessing, of a run directory, of a folder written by
    ``dmlkit push --local``, or of a pushed model repository ``"hf://user/name[@revision]"``.

    An ``nn.Module`` in eval mode on the CPU (``checkpoint``: ``"best"`` or ``"last"``): ``model(batch)``
    embeds preprocessed pixels ``[B, C, H, W]`` (``model.preprocess``), and ``model.embed(images)`` embeds
    image files, PIL images, numpy arrays or tensors, one or a list, as the run embedded its test split
    (:class:`dmlkit.inference.RunEmbedder`, :mod:`dmlkit.sharing`).
    """
    from dmlkit.inference import RunEmbedder

    return RunEmbedder.from_run(source, checkpoint, device="cpu", token=token).model


def __getattr__(name: str):
    """``dmlkit.fit``, ``dmlkit.Callback``...: the object API (docs/python-api.md), imported when first used."""
    if name not in _LAZY:
        raise AttributeError(f"module 'dmlkit' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
