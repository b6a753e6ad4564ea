"""Suite-wide settings: one torch thread per test process (the suite runs on 2 cores with 2 xdist
workers), inherited by the CLI subprocesses the integration tests start."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
