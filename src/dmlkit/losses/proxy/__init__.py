"""Proxy-based losses; each keeps its proxies in ``loss.proxies`` (class-major ``[C*K, D]``).

Every class here is registered in :data:`dmlkit.losses.base.LOSSES`.
"""

from dmlkit.losses.proxy._base import ProxyLoss
from dmlkit.losses.proxy.proxy_anchor import ProxyAnchorLoss
from dmlkit.losses.proxy.proxy_nca import ProxyNCALoss, ProxyNCAPlusPlusLoss
from dmlkit.losses.proxy.proxy_pair import ProxyPairLoss
from dmlkit.losses.proxy.proxy_triplet import ProxyTripletLoss
from dmlkit.losses.proxy.soft_triple import SoftTripleLoss

__all__ = [
    "ProxyLoss",
    "ProxyAnchorLoss",
    "ProxyNCALoss",
    "ProxyNCAPlusPlusLoss",
    "ProxyPairLoss",
    "ProxyTripletLoss",
    "SoftTripleLoss",
]
