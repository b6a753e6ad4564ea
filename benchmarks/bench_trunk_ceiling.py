"""EfficientNet-Lite0's trunk alone, forward pass: the plain fp32 NCHW model against dmlkit's
inference copy (bf16, channels-last, batch norm folded, convolution + ReLU6 fused), whole batches and
in chunks. The ceiling of the embedding speed-up on this CPU, before pooling, head and the loop.

Run:  .venv/bin/python benchmarks/bench_trunk_ceiling.py [--allocator default|no-faults] [--rounds 5]
      [--batch 64] [--size 160] [--threads 2]

``--allocator no-faults`` raises glibc's mmap and trim thresholds to 1 GiB for this whole process
(both sides), so no activation comes from fresh zero-filled pages: what is left is computation.
``default`` leaves glibc as a plain script runs. Rounds interleave the rows (order alternating);
cells are medians. The last line is the share of oneDNN's convolution primitives in one call of
the fused copy (``torch.profiler``, self CPU time).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import ctypes.util
import statistics
import time

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def no_page_faults() -> None:
    """glibc keeps every freed block for reuse (mmap and trim thresholds at 1 GiB)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not (libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1):
        raise SystemExit("--allocator no-faults needs glibc (Linux)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocator", choices=("default", "no-faults"), default="default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.allocator == "no-faults":
        no_page_faults()
    torch.set_num_threads(args.threads)

    from dmlkit.models import create_trunk
    from dmlkit.models.inference_copy import InferenceCopy, inference_copy

    plain = create_trunk("efficientnet_lite0", pretrained=True).eval()
    plain.channels_last = False
    plain.model.to(memory_format=torch.contiguous_format)
    x = (torch.randint(0, 256, (args.batch, 3, args.size, args.size)).float() - 127) / 128  # the Lite0 scaling
    x_cl = x.contiguous(memory_format=torch.channels_last)
    cl = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    chunked = inference_copy(cl, x_cl, torch.bfloat16)
    whole = InferenceCopy(chunked.model, None)

    def run(model, inputs, bf16):
        def call():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                model(inputs)
        return call

    rows = {
        "plain trunk, fp32 NCHW (the PML loop's)": run(plain, x, False),
        "inference copy, bf16 channels-last, whole batch": run(whole, x_cl, True),
        f"inference copy, bf16 channels-last, chunks of {chunked.chunk_size}": run(chunked, x_cl, True),
    }
    for call in rows.values():  # warm-up: oneDNN primitives
        call()
        call()
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(args.rounds):
        for name in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            t0 = time.perf_counter()
            rows[name]()
            rates[name].append(args.batch / (time.perf_counter() - t0))
    base = statistics.median(rates[next(iter(rows))])
    print(f"efficientnet_lite0 trunk, batch {args.batch} at {args.size} px, {args.threads} threads, "
          f"{args.allocator} allocator, medians of {args.rounds} rounds")
    print("| forward pass | img/s | against fp32 NCHW |\n| --- | --- | --- |")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):.1f} | {statistics.median(values) / base:.2f}x |")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        rows[next(reversed(rows))]()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    onednn = sum(e.self_cpu_time_total for e in events if e.key == "mkldnn::_convolution_pointwise")
    print(f"oneDNN convolution primitives: {100 * onednn / total:.0f}% of the chunked copy's self CPU time")


if __name__ == "__main__":
    main()
