"""Proxies: class-major storage and assignment (ProxyBank), initialisers, greedy k-center (ASAP)."""

from dmlkit.proxies.bank import ASSIGNMENTS, LAYOUTS, DynamicTriplets, ProxyBank, dynamic_triplets, num_proxies_for
from dmlkit.proxies.init import PROXY_INITS, fractional_class_to_proxy, init_proxies_, sample_rows_per_class
from dmlkit.proxies.kcenter import (
    average_covering_radius,
    covering_radius,
    gather_centers,
    greedy_k_center,
    refresh_proxies_k_center,
)

__all__ = [
    "ASSIGNMENTS",
    "DynamicTriplets",
    "LAYOUTS",
    "PROXY_INITS",
    "ProxyBank",
    "average_covering_radius",
    "covering_radius",
    "dynamic_triplets",
    "fractional_class_to_proxy",
    "gather_centers",
    "greedy_k_center",
    "init_proxies_",
    "num_proxies_for",
    "refresh_proxies_k_center",
    "sample_rows_per_class",
]
