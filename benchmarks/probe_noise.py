"""How much the CPU time of one and the same planning probe moves between stretches of a few seconds.

Run:  .venv/bin/python benchmarks/probe_noise.py

On one thread, an EfficientNet-Lite2 training step (8 random 96-px images, 2 frozen stages, bf16 autocast) is
timed between two passes of a reference workload (20 products of 384 x 384 matrices), four times per stretch,
in stretches idle, beside one CPU-bound Python process at normal priority and at nice 19. Each figure is the
fastest of two passes in CPU time (what the plan's probes read). If the step's time moves with the reference,
their ratio is steady and a reference could correct the step's cost; if not, no short probe can.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from dmlkit.models import create_model

SPIN = "while True:\n    pass\n"


def cpu_seconds(fn, passes: int = 2) -> float:
    """The fastest of ``passes`` calls of ``fn`` in this process's CPU time."""
    out = []
    for _ in range(passes):
        start = time.process_time()
        fn()
        out.append(time.process_time() - start)
    return min(out)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = create_model("efficientnet_lite2", pretrained=False, embedding_size=128, pooling="avg", freeze_bn=True,
                         frozen_stages=2)
    images, matrix = torch.randn(8, 3, 96, 96), torch.randn(384, 384)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(images).float().square().sum()
        loss.backward()
        model.zero_grad(set_to_none=True)

    def reference() -> None:
        for _ in range(20):
            matrix @ matrix

    step(), reference()  # warm-up
    for load in ("idle", "normal", "idle", "normal", "nice19"):
        competitor = None
        if load != "idle":
            competitor = subprocess.Popen([sys.executable, "-c", SPIN],
                                          preexec_fn=(lambda: os.nice(19)) if load == "nice19" else None)
            time.sleep(0.5)
        rows = []
        for _ in range(4):
            before = cpu_seconds(reference)
            probe = cpu_seconds(step)
            after = cpu_seconds(reference)
            rows.append((probe, (before + after) / 2))
        if competitor is not None:
            competitor.kill()
            competitor.wait()
        print(load, " ".join(f"step {p * 1000:.0f} ms, ref {r * 1000:.1f} ms, ratio {p / r:.1f};" for p, r in rows),
              flush=True)


if __name__ == "__main__":
    main()
