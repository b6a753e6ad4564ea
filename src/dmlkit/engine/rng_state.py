"""Seeds and RNG state capture, so a resumed run replays exactly."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch global generators (libraries we call may use them)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Global RNG states in a ``weights_only``-loadable form."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "python_version": int(py[0]),
        "python_state": torch.tensor(py[1], dtype=torch.int64),
        "python_gauss": py[2],
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
        "numpy_has_gauss": int(np_state[3]),
        "numpy_cached_gaussian": float(np_state[4]),
        # CUDA generators (dropout etc. on a GPU); only once CUDA is in use, so CPU runs never initialise it
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured.

    CUDA generator states are restored when this machine sees as many GPUs as the writer did;
    a checkpoint written on GPUs still resumes on the CPU (and one written on the CPU on GPUs).
    """
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    random.setstate((state["python_version"], tuple(int(x) for x in state["python_state"].tolist()), state["python_gauss"]))
    np.random.set_state(
        (
            "MT19937",
            state["numpy_keys"].numpy().astype(np.uint32),
            state["numpy_pos"],
            state["numpy_has_gauss"],
            state["numpy_cached_gaussian"],
        )
    )
