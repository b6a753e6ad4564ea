"""Backbones, embedding heads, preprocessing configs and offline weights.

``create_model(name, embedding_size=..., normalization=...)`` returns an :class:`Embedder`;
its ``pretrained_cfg`` tells the data pipeline how to preprocess images for that backbone
(never hard-code ImageNet constants: BN-Inception wants BGR 0-255 input).
"""

from dmlkit.models._factory import (
    MODELS,
    create_model,
    create_trunk,
    has_offline_weights,
    list_models,
    register_model,
)
from dmlkit.models.bn_inception import BN_INCEPTION_CFG, BNInception
from dmlkit.models.efficientnet_lite import (
    LITE0_PRETRAINED_CFG,
    lite0_imagenet_state_dict,
    lite_imagenet_state_dict,
    rename_lite0_keys,
)
from dmlkit.models.embedder import POOLINGS, Embedder, GlobalPool, make_linear_head, shift_radius
from dmlkit.models.ensemble import EmbedderEnsemble
from dmlkit.models.eps_mnist import EPSMnistNet
from dmlkit.models.feature_head import FeatureHead
from dmlkit.models.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocess, make_cfg, preprocess
from dmlkit.models.resnetv2 import PreActResNet
from dmlkit.models.small_cnn import SmallCNN
from dmlkit.models.timm_trunk import OFFLINE_TIMM_WEIGHTS, TimmTrunk
from dmlkit.models.trained_stages import TrainedStages
from dmlkit.models.weights import WeightsReport, load_embedder_weights, load_weights, read_state_dict

__all__ = [
    "BN_INCEPTION_CFG",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LITE0_PRETRAINED_CFG",
    "MODELS",
    "OFFLINE_TIMM_WEIGHTS",
    "POOLINGS",
    "BNInception",
    "EPSMnistNet",
    "Embedder",
    "EmbedderEnsemble",
    "FeatureHead",
    "GlobalPool",
    "PreActResNet",
    "Preprocess",
    "SmallCNN",
    "TimmTrunk",
    "TrainedStages",
    "WeightsReport",
    "create_model",
    "create_trunk",
    "has_offline_weights",
    "lite0_imagenet_state_dict",
    "lite_imagenet_state_dict",
    "list_models",
    "load_embedder_weights",
    "load_weights",
    "make_cfg",
    "make_linear_head",
    "preprocess",
    "read_state_dict",
    "register_model",
    "rename_lite0_keys",
    "shift_radius",
]
