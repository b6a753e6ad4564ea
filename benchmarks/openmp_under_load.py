"""Training steps and embeddings on 2 threads, idle and beside a busy process, with OpenMP's default wait and passive.

Run:  .venv/bin/python benchmarks/openmp_under_load.py [--threads 2] [--repeats 4]

Each cell runs in a fresh process (OpenMP reads ``OMP_WAIT_POLICY`` when torch loads): an EfficientNet-Lite2 with
a 128-D embedding, 64 random 84-px images, a forward pass in eval mode without gradients (an embedding, as a
validation or a feature cache's view runs it) and a training step (forward and backward), the median of
``--repeats`` timed passes after one warm-up, in wall seconds and the process's CPU seconds. ``default``: the
variable unset (OpenMP's own policy: waiting threads spin a while); ``PASSIVE``: what ``dmlkit`` sets for its
process (``dmlkit.engine.openmp``). ``busy``: one CPU-bound Python process at normal priority beside it. The
ratio columns are the busy wall time over the idle one of the same policy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SPIN = "while True:\n    pass\n"

#: One cell, in a fresh interpreter: threads, repeats; prints a JSON line of median wall and CPU seconds.
CELL = """
import json, statistics, sys, time, torch
from dmlkit.models import create_model
torch.set_num_threads(int(sys.argv[1]))
model = create_model("efficientnet_lite2", pretrained=False, embedding_size=128)
x = torch.randn(64, 3, 84, 84)
def embed():
    model.eval()
    with torch.no_grad():
        model(x)
def step():
    model.train()
    model(x).square().sum().backward()
    model.zero_grad(set_to_none=True)
out = {}
for name, fn in (("embed", embed), ("step", step)):
    fn()
    walls, cpus = [], []
    for _ in range(int(sys.argv[2])):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    out[name] = [statistics.median(walls), statistics.median(cpus)]
print(json.dumps(out))
"""


def cell(policy: str, busy: bool, threads: int, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    spinning = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    try:
        done = subprocess.run([sys.executable, "-c", CELL, str(threads), str(repeats)], env=env, capture_output=True,
                              text=True, check=True)
    finally:
        if spinning is not None:
            spinning.kill()
            spinning.wait()
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    print(f"| OMP_WAIT_POLICY | embed idle (wall / CPU s) | embed busy | busy / idle | step idle | step busy | busy / idle |"
          f"  ({args.threads} threads, {os.cpu_count()} cores)")
    print("|---|---|---|---|---|---|---|")
    for policy in ("default", "PASSIVE"):
        idle, busy = cell(policy, False, args.threads, args.repeats), cell(policy, True, args.threads, args.repeats)
        cells = []
        for name in ("embed", "step"):
            cells += [f"{idle[name][0]:.3f} / {idle[name][1]:.3f}", f"{busy[name][0]:.3f} / {busy[name][1]:.3f}",
                      f"{busy[name][0] / idle[name][0]:.2f}x"]
        print(f"| {policy} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
