"""dmlkit: deep metric learning for PyTorch."""

__version__ = "0.1.0"
