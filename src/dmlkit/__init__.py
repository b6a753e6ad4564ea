"""dmlkit: deep metric learning for PyTorch."""

__version__ = "0.1.0"


def load(run_dir, checkpoint: str = "best"):
    """The trained embedding model of a run directory, with its preprocessing (see :mod:`dmlkit.engine.loading`)."""
    from dmlkit.engine.loading import load as _load

    return _load(run_dir, checkpoint)
