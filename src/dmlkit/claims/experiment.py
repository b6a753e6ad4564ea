"""The claims experiment end to end: train the arms the chosen claims need, then write tables and figures.

``OUT/claims.json`` holds every claim's arms and comparisons; ``OUT/claims.md`` the tables
(:func:`dmlkit.claims.analysis.claim_markdown`) under a header with the protocol and the wall time;
``OUT/figures/<claim>.png`` the validation curves of the convergence claims. Runs already recorded
under ``OUT/runs`` are read back, so a repeated or interrupted command continues where it stopped.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

from dmlkit.claims.analysis import LOWER_IS_BETTER, claim_markdown, summarise_claim
from dmlkit.claims.catalogue import ARMS, CLAIMS, LEARNING_RATES, UNTESTED
from dmlkit.claims.figures import convergence_figure
from dmlkit.claims.runner import FULL, QUICK, Budget, run_arms
from dmlkit.engine.checkpoint_files import atomic_write_json, atomic_write_text
from dmlkit.exceptions import ConfigError

#: Seeds of the full run (each re-draws the test classes) and of ``--quick``.
FULL_SEEDS = (0, 1, 2, 3, 4)
QUICK_SEEDS = (0, 1)


def arms_of(claim_names: Sequence[str]) -> list[str]:
    """The arms the claims compare, each once, in catalogue order (an ablation's reference arm included)."""
    wanted = {n for c in claim_names for n in CLAIMS[c].arms}
    wanted |= {ARMS[n].tuned_with for n in wanted if ARMS[n].tuned_with}
    return [n for n in ARMS if n in wanted]


def run_claims(claim_names: Sequence[str], out: Path, data_root: str, *, quick: bool = False,
               seeds: Sequence[int] | None = None, budget: Budget | None = None, subset: int | None = None,
               workers: int = 1, echo: Callable[[str], None] = print) -> dict[str, dict]:
    """Train what ``claim_names`` need (resuming), summarise each claim and write ``OUT/claims.{json,md}`` and figures."""
    unknown = [c for c in claim_names if c not in CLAIMS]
    if unknown:
        raise ConfigError(f"Unknown claims {unknown}; known: {', '.join(CLAIMS)}.")
    seeds = list(seeds if seeds is not None else (QUICK_SEEDS if quick else FULL_SEEDS))
    if len(seeds) < 2:
        raise ConfigError(f"A paired comparison needs at least 2 seeds; got {seeds}.")
    budget = budget or (QUICK if quick else FULL)
    learning_rates = (1e-3,) if quick else LEARNING_RATES
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    records = run_arms(arms_of(claim_names), seeds, budget, out, data_root, learning_rates=learning_rates,
                       narrow=quick, subset=subset, workers=workers, echo=echo)
    summaries = {name: summarise_claim(CLAIMS[name], records) for name in claim_names}
    figures = {name: str(convergence_figure(s, records, out / "figures" / f"{name}.png"))
               for name, s in summaries.items() if s["metric"] in LOWER_IS_BETTER}
    train_seconds = sum(r["wall_seconds"] for runs in _all_records(out) for r in runs)
    meta = {
        "seeds": seeds, "steps": budget.steps, "eval_every": budget.eval_every, "learning_rates": list(learning_rates),
        "quick": quick, "subset": subset, "wall_seconds_this_call": round(time.perf_counter() - t0, 1),
        "train_seconds_all_runs": round(train_seconds, 1), "figures": figures,
    }
    atomic_write_json(out / "claims.json", {"meta": meta, "claims": summaries})
    atomic_write_text(out / "claims.md", render_markdown(summaries, meta))
    return summaries


def _all_records(out: Path) -> list[list[dict]]:
    return [[json.loads(p.read_text()) for p in sorted(d.glob("seed*/*.json"))] for d in sorted((out / "runs").glob("*"))]


def render_markdown(summaries: dict[str, dict], meta: dict) -> str:
    """Every claim's tables, under the protocol and cost of the run, then the claims this data cannot test."""
    longer = sorted({f"{a['arm']} {meta['steps'] * ARMS[a['arm']].steps_scale}" for s in summaries.values()
                     for a in s["arms"] if ARMS[a["arm"]].steps_scale != 1})
    head = [
        "## Claims tested on Omniglot glyphs" + (" (quick check: not a result)" if meta["quick"] else ""), "",
        f"Seeds {meta['seeds']} (each re-draws the test characters); {meta['steps']} steps"
        + (f" (longer for every arm of the claims they serve: {', '.join(longer)})" if longer else "")
        + ", validation every "
        f"{meta['eval_every']}; learning rate chosen per arm from {meta['learning_rates']} on seed {meta['seeds'][0]}'s "
        f"validation classes; {meta['train_seconds_all_runs']:.0f} s of training over all runs.", "",
    ]
    body = [claim_markdown(s) for s in summaries.values()]
    tail = ["### Claims this data cannot test", ""] + [f"- {k}: {v}." for k, v in UNTESTED.items()]
    return "\n".join(head) + "\n" + "\n".join(body) + "\n" + "\n".join(tail) + "\n"
