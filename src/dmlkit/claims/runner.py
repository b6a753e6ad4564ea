"""Training the arms: one resumable run per (arm, seed, learning rate), learning rates chosen on validation.

Every run trains the glyph CNN from the seed's initial weights (the same for every arm) with
``dmlkit.fit`` (m-per-class batches, affine augmentation, Adam-W), validates every ``eval_every``
steps on the seed's validation classes and keeps the best validation MAP@R (Musgrave et al.'s
protocol); the starting point (the untrained network) is scored on the same splits first. A run's
record is ``OUT/runs/<arm>/seed<S>/<tag>.json``; a finished record is never recomputed and an
interrupted run resumes from its checkpoint in ``OUT/runs/<arm>/seed<S>/<tag>/``.

Tuning: on the tuning seed (the first one) every arm trains once per grid point (learning rate x
its tuned loss arguments) and keeps the point with the best selected validation MAP@R; the other
seeds train that point only. Test classes never enter the choice.
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from dmlkit.claims.catalogue import ARMS, EMBEDDING_SIZE, LEARNING_RATES, PHOTO_SETTINGS, Arm, learning_rates_for
from dmlkit.claims.glyphs import GlyphSplits, build_splits, create_glyph_model, load_pool
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.run_layout import LAST_CHECKPOINT, LOG_FILE, TEST_EMBEDDINGS_FILE
from dmlkit.evaluation.embed import embed_dataset
from dmlkit.exceptions import ConfigError


@dataclass(frozen=True)
class Budget:
    """Steps and validations of every run (equal for every arm)."""

    steps: int = 400
    eval_every: int = 25
    batch_size: int = 64
    m: int = 4
    alphabet_batch: int = 60  # 5 alphabets x 12 drawings
    threads: int = 2
    #: Photo runs: steps and validations (the photo recipe's batches).
    photo_steps: int = 500
    photo_eval_every: int = 50
    photo_cap: int | None = None  # photos a class (None: the set's own cap)
    device: str = "cpu"


FULL = Budget(steps=300, eval_every=25)
#: ``--quick``: every arm end to end on two seeds, one learning rate (a check that everything runs, not a result).
QUICK = Budget(steps=40, eval_every=20, photo_steps=4, photo_eval_every=2, photo_cap=10)


def grid_points(arm: Arm, learning_rates: tuple[float, ...], narrow: bool = False) -> list[dict]:
    """Every ``{"lr": ..., <tuned arg>: ...}`` point of the arm's tuning grid (``narrow``: each tuned argument's middle value)."""
    keys = sorted(arm.tuned)
    values = [(arm.tuned[k][len(arm.tuned[k]) // 2],) if narrow else arm.tuned[k] for k in keys]
    return [{"lr": lr, **dict(zip(keys, combo))} for lr in learning_rates for combo in itertools.product(*values)]


def point_tag(point: dict) -> str:
    """A file-name tag for a grid point: ``lr0.001`` or ``lr0.001-softmax_scale8``."""
    return "-".join(f"{k}{point[k]:g}" for k in ["lr", *sorted(k for k in point if k != "lr")])


def embeddings_metrics(emb: torch.Tensor, labels: torch.Tensor, *, clustering: bool = False, over_cluster: int = 1,
                       seed: int = 0) -> dict:
    """P@1, R@1/2/4/8, R-Precision, MAP@R (and NMI, with ``over_cluster`` NMI+) of embeddings under ``labels``."""
    from dmlkit.evaluation import clustering_metrics, retrieval_metrics

    out = dict(retrieval_metrics(emb, labels, ks=(1, 2, 4, 8)))
    if clustering:
        out["nmi"] = clustering_metrics(emb, labels, seed=seed)["nmi"]
        if over_cluster > 1:
            out["nmi_plus"] = clustering_metrics(emb, labels, over_cluster=over_cluster, seed=seed)["nmi_plus"]
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}


def _test_scores(emb: torch.Tensor, splits: GlyphSplits, seed: int) -> dict:
    """Test metrics: on characters; in the alphabets setting also on alphabets (``languages_*``, NMI+ at 30x)."""
    scores = {f"letters_{k}" if splits.setting == "alphabets" else k: v
              for k, v in embeddings_metrics(emb, splits.test.labels, clustering=True, seed=seed).items()}
    if splits.setting == "alphabets":
        scores.update({f"languages_{k}": v for k, v in embeddings_metrics(
            emb, splits.test_alphabets, clustering=True, over_cluster=30, seed=seed).items()})
    return scores


def _log_records(run_dir: Path) -> list[dict]:
    path = run_dir / LOG_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _val_curve(logs: list[dict]) -> list[dict]:
    """The validations after step 0 (step 0 is the record's ``start``): step, MAP@R and training seconds."""
    return [{"step": r["step"], "map_at_r": r["map_at_r"], "time": r["time"]}
            for r in logs if r.get("kind") == "eval" and r.get("split") == "val" and r["step"] > 0]


def _save_record(record: dict, path: Path, echo: Callable[[str], None]) -> dict:
    """Write a run's record atomically and say what it learned."""
    atomic_write_json(path, record)
    echo(f"    val MAP@R {record['start']['val']['map_at_r']:.3f} -> {record['selected_val_map_at_r']:.3f} "
         f"(step {record['best_step']}), {record['wall_seconds']:.0f} s")
    return record


def train_run(arm: Arm, seed: int, point: dict, budget: Budget, out: Path, data_root: str, subset: int | None,
              echo: Callable[[str], None]) -> dict:
    """Train (or resume, or read back) one run; returns its record."""
    import dmlkit

    record_path = out / "runs" / arm.name / f"seed{seed}" / f"{point_tag(point)}.json"
    steps = budget.photo_steps if arm.setting in PHOTO_SETTINGS else budget.steps * arm.steps_scale
    if record_path.exists():
        record = json.loads(record_path.read_text())
        if record.get("budget_steps", steps) != steps:
            raise ConfigError(f"claims: {record_path} was trained for {record['budget_steps']} steps, this call plans "
                              f"{steps}; give another --out (or delete that run) to train the new budget.")
        return record
    run_dir = record_path.with_suffix("")
    resume = (run_dir / LAST_CHECKPOINT).exists()
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)
    torch.set_num_threads(budget.threads)
    if arm.setting in PHOTO_SETTINGS:
        return _photo_run(arm, seed, point, budget, out, Path(data_root), record_path, echo)
    splits = build_splits(load_pool(str(Path(data_root) / "omniglot"), subset), arm.setting, seed)
    model = create_glyph_model(seed, EMBEDDING_SIZE, arm.normalization)
    start = {"val": embeddings_metrics(*embed_dataset(model, splits.val), seed=seed),
             "test": _test_scores(embed_dataset(model, splits.test)[0], splits, seed)}
    batch = budget.alphabet_batch if arm.setting == "alphabets" else budget.batch_size
    m = batch // len(splits.train.class_names) if arm.setting == "alphabets" else budget.m
    loss = copy.deepcopy(arm.loss)
    loss["args"] = {**loss.get("args", {}), **{k: v for k, v in point.items() if k != "lr"}}
    echo(f"[{time.strftime('%H:%M:%S')}] {arm.name} seed {seed} {point_tag(point)}{' (resume)' if resume else ''}")
    t0 = time.perf_counter()
    result = dmlkit.fit(
        model, None, splits.train, val_data=splits.val, test_data=splits.test, out=run_dir, resume=resume,
        report=False, echo=lambda s: None,
        config={
            "seed": seed, "loss": loss, "asap": arm.asap,
            "optimizer": {"name": "adamw", "lr": point["lr"]},
            "sampler": {"batch_size": batch, "m": m},
            "data": {"augment": "affine"},
            "protocol": {"selection": "best"},
            "train": {"max_steps": steps, "eval_every": budget.eval_every, "checkpoint_every": budget.eval_every,
                      "progress": False, "num_threads": budget.threads, "patience": None, "time_budget": None,
                      "mixed_precision": "none", "device": budget.device},
            "eval": {"save_embeddings": True},
        },
    )
    logs = _log_records(run_dir)
    val_curve = _val_curve(logs)
    projections = [r for r in logs if r.get("kind") == "projection"]
    emb = torch.from_numpy(np.load(run_dir / TEST_EMBEDDINGS_FILE)["embeddings"])
    selected_val = max((v["map_at_r"] for v in val_curve if v["step"] == result.best_step), default=float("nan"))
    record = {
        "arm": arm.name, "seed": seed, "point": point, "steps": result.steps, "budget_steps": steps,
        "best_step": result.best_step, "start": start, "val_curve": val_curve, "selected_val_map_at_r": selected_val,
        "learned": bool(selected_val > start["val"]["map_at_r"]),
        "test": _test_scores(emb, splits, seed),
        "projections": [{"projection": p["projection"], "step": p["step"], "complete": p["complete"],
                         "best_map_at_r": p["best_map_at_r"]} for p in projections],
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "test_classes": splits.test_classes,
    }
    return _save_record(record, record_path, echo)


def _photo_run(arm: Arm, seed: int, point: dict, budget: Budget, out: Path, data_root: Path, record_path: Path,
               echo: Callable[[str], None]) -> dict:
    """A photo arm's run (:mod:`dmlkit.claims.photos`) and its record; learning = a significant gain over step 0."""
    from dmlkit.claims.photos import train_photo_run

    run_dir = record_path.with_suffix("")
    echo(f"[{time.strftime('%H:%M:%S')}] {arm.name} seed {seed} {point_tag(point)}")
    t0 = time.perf_counter()
    done = train_photo_run(arm.setting, copy.deepcopy(arm.loss), point, seed, run_dir, data_root, out,
                           budget.photo_steps, budget.photo_eval_every, budget.threads, budget.device,
                           budget.photo_cap)
    result = done["result"]
    val_curve = _val_curve(_log_records(run_dir))
    selected_val = max((v["map_at_r"] for v in val_curve if v["step"] == result.best_step),
                       default=done["start"]["val"]["map_at_r"])
    record = {
        "arm": arm.name, "seed": seed, "point": point, "steps": result.steps, "budget_steps": budget.photo_steps,
        "best_step": result.best_step, "start": done["start"], "val_curve": val_curve, "selected_val_map_at_r": selected_val,
        "learned": bool(result.best_step > 0 and selected_val > done["start"]["val"]["map_at_r"]),
        "test": done["test"], "projections": [], "wall_seconds": round(time.perf_counter() - t0, 2),
        "test_classes": done["test_classes"],
    }
    return _save_record(record, record_path, echo)


def _train_job(job: tuple) -> dict:
    """``train_run`` of one ``(arm name, seed, point, budget, out, data_root, subset)`` job (a worker process's entry)."""
    name, seed, point, budget, out, data_root, subset = job
    return train_run(ARMS[name], seed, point, budget, out, data_root, subset, print)


def _train_all(jobs: list[tuple], workers: int, echo: Callable[[str], None]) -> list[dict]:
    """Train ``jobs`` in order, or on ``workers`` processes (each with ``budget.threads`` torch threads)."""
    if workers <= 1 or len(jobs) <= 1:
        return [train_run(ARMS[j[0]], *j[1:], echo) for j in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn: a forked child of a process whose torch already started its thread pools can hang
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_train_job, jobs))


def choose_point(records: list[dict], out: Path) -> dict:
    """The grid point whose run has the best selected validation MAP@R (written to ``runs/<arm>/tuning.json``)."""
    best = max(records, key=lambda r: r["selected_val_map_at_r"])
    atomic_write_json(out / "runs" / best["arm"] / "tuning.json",
                 {"seed": best["seed"], "chosen": best["point"],
                  "grid": [{"point": r["point"], "selected_val_map_at_r": r["selected_val_map_at_r"]} for r in records]})
    return best["point"]


def run_arms(arm_names: list[str], seeds: list[int], budget: Budget, out: Path, data_root: str, *,
             learning_rates: tuple[float, ...] = LEARNING_RATES, narrow: bool = False, subset: int | None = None,
             workers: int = 1, echo: Callable[[str], None] = print) -> dict[str, list[dict]]:
    """Tune every arm on ``seeds[0]``, then train the other seeds; the records of the chosen point, by arm.

    An arm ``tuned_with`` another trains at that arm's chosen point. ``workers > 1`` trains that many runs at once
    (results do not depend on it: each run is seeded by its own arguments)."""
    tuned = [n for n in arm_names if not ARMS[n].tuned_with]
    grids = {n: grid_points(ARMS[n], learning_rates_for(ARMS[n].setting, learning_rates), narrow) for n in tuned}
    jobs = [(n, seeds[0], p, budget, out, data_root, subset) for n in tuned for p in grids[n]]
    done = iter(_train_all(jobs, workers, echo))
    chosen = {n: choose_point([next(done) for _ in grids[n]], out) for n in tuned}
    chosen.update({n: chosen[ARMS[n].tuned_with] for n in arm_names if ARMS[n].tuned_with})
    # seed-major: every arm has seed s before any has seed s + 1
    jobs = [(n, seed, chosen[n], budget, out, data_root, subset) for seed in seeds for n in arm_names]
    records: dict[str, list[dict]] = {name: [] for name in arm_names}
    for job, record in zip(jobs, _train_all(jobs, workers, echo)):
        records[job[0]].append(record)
    return records
