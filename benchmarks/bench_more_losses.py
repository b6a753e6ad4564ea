"""Forward+backward time of the rest of PML's loss catalogue in dmlkit against PML (same run, one table).

    .venv/bin/python benchmarks/bench_more_losses.py [--repeats 15] [--threads 2] [--only NAME ...] [--json]

B=256, D=128, 64 classes x 4 samples. Each case is ``(name, dmlkit factory, PML factory)`` and
may take the call's inputs from ``inputs(name)``; calls are interleaved (dmlkit, PML, dmlkit, ...)
and the median of ``--repeats`` timed calls is reported after warm-up, with PML / dmlkit.
``--json`` adds one ``CATALOGUE_ROWS`` line for ``benchmarks/run_all.py --summary``.
Cases live in lists by origin (one block per engineer's slice) so they merge without conflict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
from pytorch_metric_learning import losses as pml

import dmlkit.losses as dml

B, D, PER_CLASS = 256, 128, 4

Case = tuple[str, Callable[[], torch.nn.Module], Callable[[], torch.nn.Module]]

#: The pair losses, NCA, Manifold and MultipleLosses.
REST_CASES: list[Case] = [
    ("angular", lambda: dml.AngularLoss(), lambda: pml.AngularLoss()),
    ("tuplet_margin", lambda: dml.TupletMarginLoss(), lambda: pml.TupletMarginLoss()),
    ("threshold_consistent_margin", lambda: dml.ThresholdConsistentMarginLoss(),
     lambda: pml.ThresholdConsistentMarginLoss()),
    ("instance", lambda: dml.InstanceLoss(), lambda: pml.InstanceLoss()),
    ("snr_contrastive", lambda: dml.SignalToNoiseRatioContrastiveLoss(), lambda: pml.SignalToNoiseRatioContrastiveLoss()),
    ("intra_pair_variance", lambda: dml.IntraPairVarianceLoss(), lambda: pml.IntraPairVarianceLoss()),
    ("dynamic_soft_margin", lambda: dml.DynamicSoftMarginLoss(), lambda: _DetachedHistogram(pml.DynamicSoftMarginLoss())),
    ("nca", lambda: dml.NCALoss(), lambda: pml.NCALoss()),
    ("manifold (K=64)", lambda: _manifold(dml.ManifoldLoss), lambda: _manifold(pml.ManifoldLoss)),
    ("multiple (contrastive + 0.5 NCA)",
     lambda: dml.MultipleLosses([dml.ContrastiveLoss(), dml.NCALoss()], weights=[1, 0.5]),
     lambda: pml.MultipleLosses([pml.ContrastiveLoss(), pml.NCALoss()], weights=[1, 0.5])),
]

#: The contrastive, ranking and self-supervised losses (i30-rank). The two-view losses
#: are wrapped so the call is ``loss(x, labels=y)``: their second view is ``x`` shifted by a fixed noise.
RANK_CASES: list[Case] = [
    ("ntxent", lambda: dml.NTXentLoss(), lambda: pml.NTXentLoss()),
    ("supcon", lambda: dml.SupConLoss(), lambda: pml.SupConLoss()),
    ("circle", lambda: dml.CircleLoss(), lambda: pml.CircleLoss()),
    ("ranked_list", lambda: dml.RankedListLoss(margin=0.4, Tn=10), lambda: pml.RankedListLoss(margin=0.4, Tn=10)),
    ("fastap", lambda: dml.FastAPLoss(), lambda: pml.FastAPLoss()),
    ("smooth_ap (PML: positives by position)", lambda: dml.SmoothAPLoss(), lambda: pml.SmoothAPLoss()),
    ("pnp", lambda: dml.PNPLoss(), lambda: pml.PNPLoss()),
    ("histogram", lambda: dml.HistogramLoss(), lambda: pml.HistogramLoss()),
    ("vicreg", lambda: _TwoViews(dml.VICRegLoss(), wrapper=False), lambda: _TwoViews(pml.VICRegLoss(), wrapper=False)),
    ("self_supervised (NT-Xent)", lambda: _TwoViews(dml.SelfSupervisedLoss(dml.NTXentLoss())),
     lambda: _TwoViews(pml.SelfSupervisedLoss(pml.NTXentLoss()))),
]

CASES: list[Case] = [*REST_CASES, *RANK_CASES]


class _TwoViews(torch.nn.Module):
    """``loss(x, labels)`` for a two-view loss: the second view is ``x`` plus a fixed noise (labels unused)."""

    def __init__(self, loss: torch.nn.Module, wrapper: bool = True):
        super().__init__()
        self.loss, self.wrapper = loss, wrapper
        self.noise = 0.1 * torch.randn(B, D, generator=torch.Generator().manual_seed(2))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.wrapper:
            return self.loss(x, x + self.noise)
        return self.loss(x, ref_emb=x + self.noise)


class _DetachedHistogram(torch.nn.Module):
    """PML's DynamicSoftMarginLoss keeps its histogram on the graph, so a second backward fails; detach it between calls."""

    def __init__(self, loss: torch.nn.Module):
        super().__init__()
        self.loss = loss

    def forward(self, *args, **kwargs):
        self.loss.hist_ = self.loss.hist_.detach()
        return self.loss(*args, **kwargs)


def _manifold(cls):
    loss = cls(D, K=64)
    loss.proxies.data = torch.randn(64, D, generator=torch.Generator().manual_seed(1))
    return loss


def inputs(name: str, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Keyword inputs of one call: ManifoldLoss takes the proxy of each sample as indices_tuple (PML's form)."""
    if name.startswith("manifold"):
        return {"indices_tuple": y % 64}
    return {"labels": y}


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, D, generator=g)
    y = (torch.arange(B) // PER_CLASS)[torch.randperm(B, generator=g)]
    return x, y


def forward_backward(loss: torch.nn.Module, x: torch.Tensor, kwargs: dict) -> Callable[[], None]:
    def run() -> None:
        e = x.detach().requires_grad_(True)
        loss(e, **kwargs).backward()

    return run


def pml_class(case: Case) -> str:
    """The PML class a case measures (inside the benchmark's wrappers)."""
    loss = case[2]()
    return type(getattr(loss, "loss", loss)).__name__


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def measure(case: Case, repeats: int) -> tuple[float, float]:
    name, make_ours, make_pml = case
    x, y = batch()
    kwargs = inputs(name, x, y)
    ours = forward_backward(make_ours(), x, kwargs)
    theirs = forward_backward(make_pml(), x, kwargs)
    for _ in range(2):  # warm-up
        ours(), theirs()
    t_ours, t_pml = [], []
    for _ in range(repeats):
        t_ours.append(timed(ours))
        t_pml.append(timed(theirs))
    return statistics.median(t_ours), statistics.median(t_pml)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="case names (prefixes) to run")
    parser.add_argument("--json", action="store_true", help="also print the rows as one CATALOGUE_ROWS json line")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = [c for c in CASES if not args.only or any(c[0].startswith(o) for o in args.only)]
    print(f"forward+backward, B={B}, D={D}, {args.threads} threads, median of {args.repeats}\n")
    print("| loss | dmlkit ms | PML ms | PML / dmlkit |\n| --- | --- | --- | --- |")
    rows = []
    for case in cases:
        ours, theirs = measure(case, args.repeats)
        rows.append({"name": case[0], "pml_class": pml_class(case), "dmlkit_ms": ours, "pml_ms": theirs})
        print(f"| {case[0]} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.1f}x |", flush=True)
    if rows:
        ratios = [r["pml_ms"] / r["dmlkit_ms"] for r in rows]
        print(f"\nmedian ratio: {statistics.median(ratios):.1f}x over {len(ratios)} cases")
    if args.json:
        print("CATALOGUE_ROWS " + json.dumps(rows))


if __name__ == "__main__":
    main()
