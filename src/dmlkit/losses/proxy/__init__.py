"""Proxy-based losses; each keeps its proxies in ``loss.proxies`` (class-major ``[C*K, D]``).

Every public module here is imported and every class it registers in
:data:`dmlkit.losses.base.LOSSES` is exported (and so re-exported by :mod:`dmlkit.losses`): a new
loss needs only its module.
"""

from dmlkit.core.registry import import_submodules
from dmlkit.losses.base import LOSSES
from dmlkit.losses.proxy._base import ProxyLoss

import_submodules(__name__, __path__)
_losses = LOSSES.classes_in(__name__)
globals().update(_losses)

__all__ = ["ProxyLoss", *_losses]
