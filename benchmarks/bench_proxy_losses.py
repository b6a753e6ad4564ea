"""Proxy losses and greedy k-center: dmlkit vs pytorch-metric-learning, forward + backward.

Run: .venv/bin/python benchmarks/bench_proxy_losses.py [--repeats 15] [--threads 2] [--pml-only] [--json]
SOP scale: B=128, D=128, C=11,318 classes. Each pair is measured interleaved (dmlkit, then
the reference, alternating) and the median of N is reported. The K=4 rows have no PML
counterpart; their ``medium`` rows (``matmul_precision="medium"``: bf16 products) take the
same loss in fp32 as the reference, so their ratio is the speed-up of bf16 products. ``ratio`` is
reference median / dmlkit median; ``paired`` is the median of the per-round ratios of calls made
back to back (robust to the host's speed drifting during a run). Both use 2 threads (``--threads``;
on a machine shared with other jobs, 1 thread gives steadier ratios). ``--pml-only`` keeps the rows
measured against PML; ``--json`` adds one ``CATALOGUE_ROWS`` line of them for ``benchmarks/run_all.py --summary``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from pytorch_metric_learning import losses as pml

from dmlkit.engine.allocator import tune_cpu_allocator
from dmlkit.losses.proxy import ProxyAnchorLoss, ProxyNCALoss, SoftTripleLoss
from dmlkit.proxies import greedy_k_center

B, D, C = 128, 128, 11_318


def step(loss, x, y):
    """One forward + backward; gradients are cleared so no accumulation cost is measured."""
    def run():
        loss.zero_grad(set_to_none=True)
        x.grad = None
        loss(x, y).backward()
    return run


def interleaved(fns, repeats, paired=None):
    """Median milliseconds of each callable, measured in alternation.

    With a list ``paired``, it also receives the median over rounds of ``time[1] / time[0]``: a
    ratio of two calls made back to back, which the host's speed drifts cancel out of.
    """
    times = [[] for _ in fns]
    for fn in fns:
        fn()
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append((time.perf_counter() - t0) * 1e3)
    if paired is not None:
        paired.append(statistics.median(b / a for a, b in zip(times[0], times[1])))
    return [statistics.median(t) for t in times]


def k_center_naive(pool, k, existing):
    """Reference: Alg. 2 with a Python loop over classes (the obvious port), on a class subset."""
    out = []
    for c in range(pool.shape[0]):
        centers = existing[c]
        d = torch.cdist(pool[c], centers).amin(1)
        picks = []
        for _ in range(k):
            j = int(d.argmax())
            picks.append(j)
            d = torch.minimum(d, torch.cdist(pool[c], pool[c, j : j + 1]).squeeze(1))
        out.append(picks)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--allocator", choices=("tuned", "default"), default="tuned",
        help="tuned: dmlkit.engine.allocator.tune_cpu_allocator() for the whole process, as `dmlkit` runs "
        "(applies to both libraries); default: glibc's own settings",
    )
    parser.add_argument("--pml-only", action="store_true", help="only the rows measured against PML")
    parser.add_argument("--json", action="store_true", help="also print the PML rows as one CATALOGUE_ROWS json line")
    args = parser.parse_args()
    if args.allocator == "tuned" and not tune_cpu_allocator():
        parser.error("--allocator tuned needs glibc (Linux)")
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, D, generator=g, requires_grad=True)
    y = torch.randint(0, C, (B,), generator=g)
    rows, pml_rows = [], []

    def pair(name, ours, theirs, copy):
        copy(ours, theirs)
        ratio = []
        a, b = interleaved([step(ours, x, y), step(theirs, x, y)], args.repeats, ratio)
        rows.append((name, a, b, ratio[0]))
        pml_rows.append({"name": name, "pml_class": type(theirs).__name__, "dmlkit_ms": a, "pml_ms": b})

    def copy_proxies(o, t):
        t.proxies.data.copy_(o.proxies.data)

    def copy_fc(o, t):
        t.fc.data.copy_(o.proxies.data.T)

    pair("ProxyAnchor K=1", ProxyAnchorLoss(C, D), pml.ProxyAnchorLoss(C, D), copy_proxies)
    pair("ProxyNCA K=1", ProxyNCALoss(C, D), pml.ProxyNCALoss(C, D), copy_proxies)
    pair("SoftTriple K=4", SoftTripleLoss(C, D, centers_per_class=4), pml.SoftTripleLoss(C, D, centers_per_class=4), copy_fc)
    for name, make in [] if args.pml_only else [
        ("ProxyAnchor K=4", lambda **kw: ProxyAnchorLoss(C, D, proxies_per_class=4, **kw)),
        ("ProxyAnchor K=4 nearest", lambda **kw: ProxyAnchorLoss(C, D, proxies_per_class=4, assignment="nearest", **kw)),
        ("ProxyNCA K=4", lambda **kw: ProxyNCALoss(C, D, proxies_per_class=4, **kw)),
    ]:
        exact, fast = make(), make(matmul_precision="medium")
        fast.load_state_dict(exact.state_dict())
        ratio = []
        a, b = interleaved([step(fast, x, y), step(exact, x, y)], args.repeats, ratio)
        rows.append((name, b, float("nan"), float("nan")))
        rows.append((f"{name} medium (ref: the same, highest)", a, b, ratio[0]))

    if not args.pml_only:
        pool = torch.randn(C, 7, D, generator=g)
        existing = torch.randn(C, 4, D, generator=g)
        (a,) = interleaved([lambda: greedy_k_center(pool, 4, existing)], args.repeats)
        sub = 500
        (b,) = interleaved([lambda: k_center_naive(pool[:sub], 4, existing[:sub])], max(3, args.repeats // 5))
        rows.append((f"k-center C={C} b=7 K=4 (ref: per-class loop x{C}/{sub})", a, b * C / sub, float("nan")))

    print(f"{'name':<52} {'dmlkit ms':>10} {'reference ms':>13} {'ratio':>7} {'paired':>7}")
    for name, a, b, paired in rows:
        ratio = b / a if b == b else float("nan")
        ref = f"{b:13.1f}" if b == b else f"{'-':>13}"
        print(f"{name:<52} {a:10.1f} {ref} {ratio:7.2f} {paired:7.2f}")
    if args.json:
        print("CATALOGUE_ROWS " + json.dumps(pml_rows))


if __name__ == "__main__":
    main()
