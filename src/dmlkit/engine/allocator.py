"""Keep freed CPU memory for reuse: large per-step temporaries otherwise cost page faults.

A training step allocates and frees the same multi-MB tensors every time (a ``[B, R]`` matrix
against a 44,800-entry cross-batch memory is 5.7 MB; the logits against 11,318 proxies are as
large). glibc serves allocations above its mmap threshold with fresh ``mmap`` pages and returns
them on ``free``, so every step pays the kernel's page faults again (a large share of an XBM
step: ``benchmarks/bench_pair_losses.py --allocator default`` against ``tuned``). PyTorch's CPU
performance guide addresses the same cost by preloading jemalloc or tcmalloc; this does the
glibc equivalent in-process: a high mmap threshold (32 MiB, glibc's maximum for it) and a trim
threshold that keeps freed heap memory mapped for the next step. Memory use stays bounded by
the steady state of the step (nothing leaks: freed blocks are reused), but RSS does not shrink
back after a peak.

``dmlkit``'s command line applies it at start-up; library users call
:func:`tune_cpu_allocator` themselves (it changes the whole process, so the library never does
it on import).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

#: glibc caps M_MMAP_THRESHOLD at 32 MiB on 64-bit systems (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20


def tune_cpu_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; ``True`` when applied.

    A no-op returning ``False`` where the C library is not glibc (macOS, Windows, musl).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_TOP_PAD, TOP_PAD))
    return all(mallopt(option, value) == 1 for option, value in settings)
