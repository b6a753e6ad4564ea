"""Losses: pair-based (``losses.pair``), proxy-based (``losses.proxy``), ranking (``losses.ranking``),
self-supervised (``losses.self_supervised``) and DRO (``losses.dro``).

Every loss is called ``loss(embeddings [B, D], labels [B])`` and is registered in
:data:`LOSSES` under a snake_case name usable in configs (``loss.name: proxy_anchor``).
"""

from dmlkit.losses.base import LOSSES, MetricLoss, zero_loss
from dmlkit.losses.combine import MultipleLosses
from dmlkit.losses.dro import *  # noqa: F401,F403
from dmlkit.losses.dro import __all__ as _dro_all
from dmlkit.losses.pair import *  # noqa: F401,F403
from dmlkit.losses.pair import __all__ as _pair_all
from dmlkit.losses.pml_bases import *  # noqa: F401,F403
from dmlkit.losses.pml_bases import __all__ as _pml_bases_all
from dmlkit.losses.proxy import *  # noqa: F401,F403
from dmlkit.losses.proxy import __all__ as _proxy_all
from dmlkit.losses.ranking import *  # noqa: F401,F403
from dmlkit.losses.ranking import __all__ as _ranking_all
from dmlkit.losses.self_supervised import SelfSupervisedLoss, VICRegLoss


def create_loss(name: str, **kwargs):
    """Build a registered loss by name, e.g. ``create_loss("proxy_anchor", num_classes=100, embedding_size=128)``."""
    return LOSSES.create(name, **kwargs)


def list_losses(pattern: str = "*") -> list[str]:
    """Registered loss names matching a shell pattern."""
    return LOSSES.names(pattern)


__all__ = [
    "LOSSES", "MetricLoss", "create_loss", "list_losses", "zero_loss", *_pair_all, *_proxy_all, *_dro_all,
    *_ranking_all, "SelfSupervisedLoss", "VICRegLoss", "MultipleLosses", *_pml_bases_all,
]
