"""pytorch-metric-learning's ``pytorch_metric_learning.datasets`` path: ``from dmlkit import datasets``.

The classes live in :mod:`dmlkit.data.pml_datasets` (also exported from :mod:`dmlkit.data`, where
PML's samplers are too); this module only gives them PML's import path.
"""

from dmlkit.data.pml_datasets import CUB, BaseDataset, Cars196, INaturalist2018, StanfordOnlineProducts

__all__ = ["CUB", "BaseDataset", "Cars196", "INaturalist2018", "StanfordOnlineProducts"]
