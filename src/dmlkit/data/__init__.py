"""dmlkit.data: benchmark datasets, class-disjoint splits and k-fold, samplers, transforms.

Every public module here is imported, so a reader module's ``register_dataset`` call is all it
takes to add a data set.
"""

from dmlkit.core.registry import import_submodules
from dmlkit.data.base import DataSplits, ImageFileDataset, TensorImageDataset
from dmlkit.data.download import download_dataset
from dmlkit.data.hierarchical_sampler import HierarchicalSampler
from dmlkit.data.info import dataset_info, datasets_table
from dmlkit.data.mnist import load_mnist5k, load_sklearn_digits
from dmlkit.data.pml_datasets import CUB, Cars196, INaturalist2018, StanfordOnlineProducts
from dmlkit.data.registry import DATASETS, DatasetSpec, SplitSource, get_dataset_spec, list_datasets, register_dataset
from dmlkit.data.samplers import (
    SAMPLERS,
    EpochSampler,
    MPerClassSampler,
    OnePerClassSampler,
    ShuffledSampler,
    create_sampler,
)
from dmlkit.data.splits import build_splits, class_disjoint_folds, write_manifest
from dmlkit.data.transforms import BackboneNormalize, Preprocessing, build_transforms, eval_transform, train_transform
from dmlkit.data.triplet_samplers import FixedSetOfTriplets, TuplesToWeightsSampler

import_submodules(__name__, __path__)  # the reader modules register their data sets

__all__ = [
    "CUB",
    "DATASETS",
    "SAMPLERS",
    "BackboneNormalize",
    "Cars196",
    "DataSplits",
    "DatasetSpec",
    "EpochSampler",
    "FixedSetOfTriplets",
    "HierarchicalSampler",
    "INaturalist2018",
    "ImageFileDataset",
    "MPerClassSampler",
    "OnePerClassSampler",
    "Preprocessing",
    "ShuffledSampler",
    "StanfordOnlineProducts",
    "SplitSource",
    "TensorImageDataset",
    "TuplesToWeightsSampler",
    "build_splits",
    "build_transforms",
    "class_disjoint_folds",
    "create_sampler",
    "dataset_info",
    "download_dataset",
    "datasets_table",
    "eval_transform",
    "get_dataset_spec",
    "list_datasets",
    "load_mnist5k",
    "load_sklearn_digits",
    "register_dataset",
    "train_transform",
    "write_manifest",
]
