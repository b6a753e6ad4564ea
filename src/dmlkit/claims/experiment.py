"""The claims experiment end to end: train the arms the chosen claims need, then write tables and figures.

``OUT/claims.json`` holds every claim's arms (per-seed values, selected steps, tuning grids with their
scores) and comparisons (per-seed values, every statistic printed); ``OUT/claims.md`` the tables
(:func:`dmlkit.claims.analysis.claim_markdown`) under a header with the protocol and the cost;
``OUT/figures/<claim>.png`` the early validation curves of the convergence claims. Runs already
recorded under ``OUT/runs`` are read back, so a repeated or interrupted command (or a fresh clone
holding the records) continues where it stopped and re-runs nothing recorded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from dmlkit.claims.analysis import LEARN_MARGIN, LOWER_IS_BETTER, add_global_holm, claim_markdown, summarise_claim
from dmlkit.claims.catalogue import (
    ARMS,
    CLAIMS,
    COMMON_LEARNING_RATE,
    LEARNING_RATES,
    PHOTO_LEARNING_RATES,
    PHOTO_SETTINGS,
    UNTESTED,
)
from dmlkit.claims.figures import convergence_figure
from dmlkit.claims.records import check_out_folder, read_record
from dmlkit.claims.runner import FULL, QUICK, QUICK_DRAWINGS, Budget, budget_dict, close_workers, run_arms
from dmlkit.engine.checkpoint_files import atomic_write_json, atomic_write_text
from dmlkit.engine.timing import cpu_seconds_with_children
from dmlkit.exceptions import ConfigError

#: Seeds of the full run (each re-draws the test classes): 8 for glyphs, the first 5 of them for photos.
FULL_SEEDS = (0, 1, 2, 3, 4, 5, 6, 7)
PHOTO_SEEDS = 5
QUICK_SEEDS = (0, 1)


def arms_of(claim_names: Sequence[str]) -> list[str]:
    """The arms the claims compare, each once, in catalogue order (an ablation's reference arm included)."""
    wanted = {n for c in claim_names for n in CLAIMS[c].arms}
    wanted |= {ARMS[n].tuned_with for n in wanted if ARMS[n].tuned_with}
    return [n for n in ARMS if n in wanted]


def convergence_threshold(claim_name: str, tunings: dict[str, dict]) -> float:
    """The validation MAP@R gain over step 0 that a convergence claim times its arms to: the claim's fraction of
    the smallest gain among its arms in their tuning runs (each at its chosen point), fixed before any seed
    trains; each seed's level is its own step 0 plus this gain (:func:`~dmlkit.claims.analysis.run_value`)."""
    claim = CLAIMS[claim_name]
    chosen = [next(g for g in tunings[a]["grid"] if g["point"] == tunings[a]["chosen"]) for a in claim.arms]
    return claim.threshold_fraction * max(min(g["score"] - g["start_val"] for g in chosen), 0.0)


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
    learning_rates = (COMMON_LEARNING_RATE,) if quick else LEARNING_RATES
    subset = QUICK_DRAWINGS if quick and subset is None else subset
    check_out_folder(Path(out))
    t0, cpu0 = time.perf_counter(), cpu_seconds_with_children()
    arms = arms_of(claim_names)
    photo_seeds = seeds[:max(2, min(len(seeds), PHOTO_SEEDS))]
    convergence = [c for c in claim_names if CLAIMS[c].metric in LOWER_IS_BETTER]
    curve_arms = tuple(a for a in arms if any(a in CLAIMS[c].arms for c in convergence))
    records: dict[str, list[dict]] = {}
    curves: dict[str, dict[str, list[dict]]] = {"own": {}, "common": {}}
    tunings: dict[str, dict] = {}
    try:
        for group, group_seeds in (([a for a in arms if ARMS[a].setting not in PHOTO_SETTINGS], seeds),
                                   ([a for a in arms if ARMS[a].setting in PHOTO_SETTINGS], photo_seeds)):
            if not group:
                continue
            r, c, t = run_arms(group, group_seeds, budget, out, data_root, learning_rates=learning_rates, narrow=quick,
                               subset=subset, curve_arms=tuple(a for a in curve_arms if a in group), workers=workers,
                               echo=echo)
            records.update(r)
            tunings.update(t)
            for rate in c:
                curves[rate].update(c[rate])
    finally:
        close_workers()
    summaries: dict[str, dict] = {}
    figures: dict[str, str] = {}
    for name in claim_names:
        claim = CLAIMS[name]
        if claim.metric not in LOWER_IS_BETTER:
            summaries[name] = summarise_claim(claim, records, tuning=tunings)
            continue
        threshold = convergence_threshold(name, tunings)
        for rate, variant in (("own", ""), ("common", f"every arm at lr {COMMON_LEARNING_RATE:g}")):
            s = summarise_claim(claim, curves[rate], threshold=threshold, tuning=tunings, variant=variant)
            summaries[s["claim"]] = s
            figure = convergence_figure(s, curves[rate], out / "figures" / f"{s['claim']}.png")
            figures[s["claim"]] = figure.relative_to(out).as_posix()  # relative to OUT: the same on every clone
    add_global_holm(summaries)
    meta = {
        "seeds": seeds, "photo_seeds": photo_seeds, "budget": budget_dict(budget), "learning_rates": list(learning_rates),
        # --quick's one-point grids take each axis's middle value
        "photo_learning_rates": [PHOTO_LEARNING_RATES[len(PHOTO_LEARNING_RATES) // 2]] if quick else list(PHOTO_LEARNING_RATES),
        "common_learning_rate": COMMON_LEARNING_RATE, "learn_margin": LEARN_MARGIN, "quick": quick, "subset": subset,
        "wall_seconds_this_call": round(time.perf_counter() - t0, 1),
        # every process's CPU time (this one and its finished workers): the work, whatever else ran beside it
        "cpu_seconds_this_call": round(cpu_seconds_with_children() - cpu0, 1), "costs": run_costs(out), "figures": figures,
    }
    atomic_write_json(out / "claims.json", {"meta": meta, "claims": summaries})
    atomic_write_text(out / "claims.md", render_markdown(summaries, meta))
    return summaries


def run_costs(out: Path) -> dict[str, dict]:
    """Runs and training seconds recorded under ``OUT/runs``, by setting kind (glyph / photo) and purpose."""
    costs: dict[str, dict] = {}
    for path in sorted((out / "runs").glob("**/*.json")):
        if path.name == "tuning.json" or path.name.endswith(".start.json") or "/data/" in str(path):
            continue
        if not path.parent.name.startswith(("seed", "tune")):
            continue
        record = read_record(path)
        kind = ("photo" if ARMS[record["arm"]].setting in PHOTO_SETTINGS else "glyph") if record["arm"] in ARMS else "other"
        entry = costs.setdefault(f"{kind}/{record.get('purpose', 'result')}",
                                 {"runs": 0, "seconds": 0.0, "cpu_seconds": 0.0, "steps": 0})
        entry["runs"] += 1
        entry["seconds"] = round(entry["seconds"] + record["wall_seconds"], 2)
        entry["cpu_seconds"] = round(entry["cpu_seconds"] + float(record.get("cpu_seconds", 0.0)), 2)
        entry["steps"] += record["steps"]
    return costs


def _stopping(patience: int | None) -> str:
    return "train to the cap" if patience is None else f"stop after {patience} validations without a gain"


def render_markdown(summaries: dict[str, dict], meta: dict) -> str:
    """Every claim's tables, under the protocol and cost of the run, then the claims this data cannot test."""
    b = meta["budget"]
    cost = ", ".join(f"{k}: {v['runs']} runs, {v['seconds']:.0f} s ({v['cpu_seconds']:.0f} CPU-s)"
                     for k, v in sorted(meta["costs"].items()))
    head = [
        "## Claims tested on Omniglot glyphs and grocery photos" + (" (quick check: not a result)" if meta["quick"] else ""),
        "",
        f"Glyph seeds {meta['seeds']}, photo seeds {meta['photo_seeds']} (each re-draws the test classes). Every arm "
        f"tunes the learning rate (glyphs from {meta['learning_rates']}, photos from {meta['photo_learning_rates']}) and "
        f"one method parameter on the tuning classes; "
        f"glyph runs validate every {b['eval_every']} steps and {_stopping(b['patience'])} (cap {b['steps']} steps, "
        f"4x for the ASAP claims' arms); convergence curves validate every {b['curve_every']} steps for "
        f"{b['curve_steps']} steps; photo runs at {b['photo_size']} px validate every {b['photo_eval_every']} steps and "
        f"{_stopping(b['photo_patience'])} (cap {b['photo_steps']}, 2x for the EPS arms). A run learned when its "
        f"selected checkpoint beats its "
        f"start (glyphs: step 0; photos: the backbone alone) on validation MAP@R by {100 * meta['learn_margin']:g} point "
        f"or more. Training cost: {cost}.",
        "",
    ]
    body = [claim_markdown(s) for s in summaries.values()]
    tail = ["### Claims this data cannot test", ""] + [f"- {k}: {v}." for k, v in UNTESTED.items()]
    return "\n".join(head) + "\n" + "\n".join(body) + "\n" + "\n".join(tail) + "\n"
