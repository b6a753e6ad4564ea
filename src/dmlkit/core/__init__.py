"""The ground floor: what every room of dmlkit stands on and which imports none of them.

Parameter validation (``validation``), registries with did-you-mean errors (``registry``), where messages
go (``messages``), device moves, autocast and fused CPU kernels (``devices``, ``transfer``, ``cpu_ops``),
optional dependencies named with their install line (``extras``), JSON records read whole and checked
(``json_files``, ``records``), user paths (``paths``) and seed derivation (``seeds``). The errors
themselves are public, in :mod:`dmlkit.exceptions`.
"""
