"""Training the arms: one resumable run per (arm, purpose, seed, grid point), settings chosen on tuning classes.

Three kinds of run, each recorded in its own file (a finished record is never recomputed, also on
another machine that has the committed records; an interrupted run resumes from its checkpoint in
the folder beside its record):

* ``tune`` (``OUT/runs/<arm>/tune/<point>.json``): the tuning split (:func:`dmlkit.claims.glyphs.build_splits`
  with ``tuning=True``; photos: :func:`dmlkit.claims.photos.photo_splits` with ``tuning=True``), scored on
  the tuning pool, classes no seed ever trains, validates or tests on. Every arm trains its grid: the
  learning rates times the three values of its one tuned parameter; a chosen value at a grid edge adds
  the next value beyond it (the grid's own ratio) until it is interior or meets a hard limit
  (:func:`tune_arms`). The grids, scores and the choice go to ``OUT/runs/<arm>/tuning.json``.
* ``result`` (``OUT/runs/<arm>/seed<S>/<point>.json``): the chosen point on seed ``S``'s splits, trained
  until validation has not improved for ``patience`` validations, up to the cap; a tuning run is never
  a result.
* ``curve`` (``OUT/runs/<arm>/seed<S>/curve-<point>.json``): the convergence claims' early curves,
  validated every ``curve_every`` steps for ``curve_steps`` steps, at the arm's own chosen point and at
  one common learning rate.

Every glyph run trains the glyph CNN from the seed's initial weights (the same for every arm) with
``dmlkit.fit`` (m-per-class batches, affine augmentation, Adam-W), validates every ``eval_every`` steps
and keeps the best validation MAP@R (Musgrave et al.'s protocol); the starting point (the untrained
network) is scored on the same splits first. Every photo run is ``dmlkit.fit`` of the pretrained backbone's last
stages on the frozen stages' outputs stored once per experiment (:mod:`dmlkit.claims.photos`), with the same
selection; its starting point is the backbone alone.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from dmlkit.claims.catalogue import (
    ARMS,
    COMMON_LEARNING_RATE,
    EMBEDDING_SIZE,
    LEARNING_RATES,
    LR_LIMITS,
    PHOTO_SETTINGS,
    Arm,
    apply_point,
    learning_rates_for,
)
from dmlkit.claims.glyphs import GLYPH_WIDTH, TUNING_SEED, GlyphSplits, build_splits, create_glyph_model, load_pool
from dmlkit.claims.photos import photo_protocol
from dmlkit.claims.records import read_record
from dmlkit.engine.checkpoint_files import atomic_write_json
from dmlkit.engine.run_layout import LAST_CHECKPOINT, LOG_FILE, TEST_EMBEDDINGS_FILE
from dmlkit.evaluation.embed import embed_dataset
from dmlkit.exceptions import ConfigError

PURPOSES = ("tune", "result", "curve")
#: Grid extensions per arm at most (each adds one point beyond an edge); past it the edge is reported.
MAX_EXTENSIONS = 4


@dataclass(frozen=True)
class Budget:
    """Steps, validations and stopping of every run (equal for every arm)."""

    steps: int = 1500  # the cap (times the arm's steps_scale)
    eval_every: int = 25
    #: Validations without improvement before a run stops (None: train to the cap).
    patience: int | None = 5
    #: Convergence curves: steps and the validation interval of their dense early curve.
    curve_steps: int = 150
    curve_every: int = 5
    batch_size: int = 64
    m: int = 4
    alphabet_batch: int = 60  # 5 alphabets x 12 drawings
    #: Torch threads a run (runs go side by side on ``workers`` processes instead: small convolutions scale poorly).
    threads: int = 1
    #: Photo runs: cap, validations, patience, photos a class (None: all), the resolution and the batch size
    #: (measured in docs/claims.md: about 0.15 CPU-s a step at 128 px training the last stage and the head).
    photo_steps: int = 400
    photo_eval_every: int = 20
    photo_patience: int | None = 3
    photo_cap: int | None = None
    photo_size: int = 128
    photo_batch_size: int = 64
    #: Extend a grid whose chosen point sits at an edge (off for ``--quick``'s one-point grids).
    extend: bool = True
    device: str = "cpu"

    def photo_steps_of(self, arm: Arm) -> int:
        """A photo arm's cap: the photo cap times the arm's :attr:`~dmlkit.claims.catalogue.Arm.photo_steps_scale`."""
        return self.photo_steps * arm.photo_steps_scale

    def plan(self, arm: Arm, purpose: str) -> dict:
        """What a run of ``arm`` for ``purpose`` trains: its record must agree to be read back."""
        if arm.setting in PHOTO_SETTINGS:
            return {"steps": self.photo_steps_of(arm), "eval_every": self.photo_eval_every,
                    "patience": self.photo_patience, "photo_cap": self.photo_cap, "photo_size": self.photo_size,
                    "photo_batch_size": self.photo_batch_size,
                    **photo_protocol(arm.setting)}
        network = {"width": GLYPH_WIDTH}  # a record of another network is refused, never mixed in
        if purpose == "curve":
            return {"steps": self.curve_steps, "eval_every": self.curve_every, "patience": None, **network}
        return {"steps": self.steps * arm.steps_scale, "eval_every": self.eval_every, "patience": self.patience,
                **network}


FULL = Budget()
#: ``--quick``: every arm end to end on two seeds, one grid point (a check that everything runs, not a result).
QUICK = Budget(steps=20, eval_every=10, patience=None, curve_steps=10, curve_every=5, photo_steps=2,
               photo_eval_every=2, photo_patience=None, photo_cap=4, photo_size=96, extend=False)
#: ``--quick`` keeps this many drawings of each character (the full run keeps all 20).
QUICK_DRAWINGS = 5


def grid_axes(arm: Arm, learning_rates: tuple[float, ...], narrow: bool = False) -> dict[str, list]:
    """The tuning axes: ``lr`` and the arm's tuned parameter (``narrow``: each axis's middle value only)."""
    axes = {"lr": list(learning_rates), **{k: list(v) for k, v in arm.tuned.items()}}
    return {k: [v[len(v) // 2]] for k, v in axes.items()} if narrow else axes


def point_tag(point: dict) -> str:
    """A file-name tag for a grid point: ``lr0.001`` or ``lr0.001-softmax_scale8``."""
    return "-".join(f"{k}{point[k]:g}" for k in ["lr", *sorted(k for k in point if k != "lr")])


def embeddings_metrics(emb: torch.Tensor, labels: torch.Tensor, *, clustering: bool = False, over_cluster: int = 1,
                       seed: int = 0) -> dict:
    """P@1, R@1/2/4/8, R-Precision, MAP@R (and NMI, with ``over_cluster`` NMI+) of embeddings under ``labels``
    (:func:`dmlkit.evaluation.evaluate`, leave-one-out)."""
    from dmlkit.evaluation import evaluate

    out = evaluate(emb, labels, metrics=("retrieval", "clustering") if clustering else ("retrieval",),
                   ks=(1, 2, 4, 8), over_cluster=over_cluster, seed=seed)
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}


def _test_scores(emb: torch.Tensor, splits: GlyphSplits, seed: int) -> dict:
    """Test metrics: on characters; in the alphabet settings also on alphabets (``languages_*``, NMI+ at 30x)."""
    eps = splits.setting.startswith("alphabets")
    scores = {f"letters_{k}" if eps else k: v
              for k, v in embeddings_metrics(emb, splits.test.labels, clustering=True, seed=seed).items()}
    if eps:
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


def record_path(out: Path, arm: str, seed: int, point: dict, purpose: str) -> Path:
    """Where a run's record lives (see the module docstring)."""
    if purpose == "tune":
        return out / "runs" / arm / "tune" / f"{point_tag(point)}.json"
    return out / "runs" / arm / f"seed{seed}" / f"{'curve-' if purpose == 'curve' else ''}{point_tag(point)}.json"


def _save_record(record: dict, path: Path, echo: Callable[[str], None]) -> dict:
    """Write a run's record atomically and say what it learned."""
    from dmlkit.claims.analysis import learned

    record["learned"] = learned(record)
    atomic_write_json(path, record)
    echo(f"    val MAP@R {record['start']['val']['map_at_r']:.3f} -> {record['selected_val_map_at_r']:.3f} "
         f"(step {record['best_step']}), {record['wall_seconds']:.0f} s")
    return record


def read_back(path: Path, plan: dict) -> dict | None:
    """The record at ``path`` when it exists and was trained to ``plan`` (None: not trained yet)."""
    if not path.exists() and not path.is_symlink():
        return None
    record = read_record(path)
    if record.get("budget", plan) != plan:
        raise ConfigError(f"claims: {path} was trained to {record['budget']}, this call plans {plan}; give another "
                          "--out (or delete that run) to train the new budget.")
    return record


def train_run(arm: Arm, seed: int, point: dict, budget: Budget, out: Path, data_root: str, subset: int | None,
              echo: Callable[[str], None], purpose: str = "result") -> dict:
    """Train (or resume, or read back) one run; returns its record."""
    if purpose not in PURPOSES:
        raise ConfigError(f"claims: unknown run purpose {purpose!r}; expected one of {PURPOSES}.")
    seed = TUNING_SEED if purpose == "tune" else seed
    path = record_path(out, arm.name, seed, point, purpose)
    plan = budget.plan(arm, purpose)
    done = read_back(path, plan)
    if done is not None:
        return done
    run_dir = path.with_suffix("")
    resume = (run_dir / LAST_CHECKPOINT).exists()
    if run_dir.exists() and not resume:
        shutil.rmtree(run_dir)
    caller_threads = torch.get_num_threads()  # given back after the run (a run in the caller's own process)
    torch.set_num_threads(budget.threads)
    echo(f"[{time.strftime('%H:%M:%S')}] {arm.name} {purpose} seed {seed} {point_tag(point)}{' (resume)' if resume else ''}")
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        if arm.setting in PHOTO_SETTINGS:
            record = _photo_run(arm, seed, point, budget, out, Path(data_root), run_dir, purpose)
        else:
            record = _glyph_run(arm, seed, point, budget, plan, run_dir, data_root, subset, purpose)
    finally:
        torch.set_num_threads(caller_threads)
    record.update(arm=arm.name, seed=seed, point=point, purpose=purpose, budget=plan, budget_steps=plan["steps"],
                  wall_seconds=round(time.perf_counter() - t0, 2),
                  # the work itself (this process's CPU time): the wall time of a shared machine is not
                  cpu_seconds=round(time.process_time() - cpu0, 2))
    return _save_record(record, path, echo)


def _glyph_run(arm: Arm, seed: int, point: dict, budget: Budget, plan: dict, run_dir: Path, data_root: str,
               subset: int | None, purpose: str) -> dict:
    import dmlkit

    splits = build_splits(load_pool(str(Path(data_root) / "omniglot"), subset), arm.setting, seed,
                          tuning=purpose == "tune")
    model = create_glyph_model(seed, EMBEDDING_SIZE, arm.normalization)
    start = {"val": embeddings_metrics(*embed_dataset(model, splits.val), seed=seed),
             "test": _test_scores(embed_dataset(model, splits.test)[0], splits, seed)}
    batch = budget.alphabet_batch if arm.setting.startswith("alphabets") else budget.batch_size
    m = batch // len(splits.train.class_names) if arm.setting.startswith("alphabets") else budget.m
    # checkpoints only at validations (the resume points); a curve's dense validations checkpoint every 25
    checkpoint_every = max(plan["eval_every"], 25 // plan["eval_every"] * plan["eval_every"])
    result = dmlkit.fit(
        model, None, splits.train, val_data=splits.val, test_data=splits.test, out=run_dir,
        resume=(run_dir / LAST_CHECKPOINT).exists(),
        report=False, echo=lambda s: None,
        config={
            "seed": seed, "loss": apply_point(arm.loss, point), "asap": arm.asap,
            "optimizer": {"name": "adamw", "lr": point["lr"]},
            "sampler": {"batch_size": batch, "m": m},
            "data": {"augment": "affine"},
            "protocol": {"selection": "best"},
            "train": {"max_steps": plan["steps"], "eval_every": plan["eval_every"], "checkpoint_every": checkpoint_every,
                      "progress": False, "num_threads": budget.threads, "patience": plan["patience"], "time_budget": None,
                      "mixed_precision": "none", "device": budget.device},
            "eval": {"save_embeddings": True},
        },
    )
    logs = _log_records(run_dir)
    val_curve = _val_curve(logs)
    projections = [r for r in logs if r.get("kind") == "projection"]
    emb = torch.from_numpy(np.load(run_dir / TEST_EMBEDDINGS_FILE)["embeddings"])
    selected_val = max((v["map_at_r"] for v in val_curve if v["step"] == result.best_step),
                       default=start["val"]["map_at_r"])
    test = _test_scores(emb, splits, seed)
    return {
        "steps": result.steps, "best_step": result.best_step, "start": start, "val_curve": val_curve,
        "selected_val_map_at_r": selected_val, "test": test,
        # tuning runs validate on the tuning pool: their selected validation MAP@R is the tuning score
        "tuning_score": selected_val,
        "projections": [{"projection": p["projection"], "step": p["step"], "complete": p["complete"],
                         "best_map_at_r": p["best_map_at_r"]} for p in projections],
        "test_classes": splits.test_classes,
    }


def _photo_run(arm: Arm, seed: int, point: dict, budget: Budget, out: Path, data_root: Path, run_dir: Path,
               purpose: str) -> dict:
    """A photo arm's run (:mod:`dmlkit.claims.photos`: fine-tuned on the stored frozen stages) and its record's pieces."""
    from dmlkit.claims.photos import train_photo_run

    done = train_photo_run(arm, point, seed, run_dir, data_root, out, budget, embeddings_metrics, tuning=purpose == "tune")
    result = done["result"]
    logs = _log_records(run_dir)
    val_curve = _val_curve(logs)
    selected_val = max((v["map_at_r"] for v in val_curve if v["step"] == result.best_step),
                       default=done["start"]["val"]["map_at_r"])
    score_key = "fine_map_at_r" if "fine_map_at_r" in done["test"] else "map_at_r"
    return {
        "steps": result.steps, "best_step": result.best_step, "start": done["start"], "val_curve": val_curve,
        "selected_val_map_at_r": selected_val, "test": done["test"],
        "projections": [{"projection": p["projection"], "step": p["step"], "complete": p["complete"],
                         "best_map_at_r": p["best_map_at_r"]} for p in logs if p.get("kind") == "projection"],
        # tuning runs test on the tuning pool (their validation classes come from their training classes)
        "tuning_score": done["test"][score_key], "test_classes": done["test_classes"],
    }


def _train_job(job: tuple) -> dict:
    """``train_run`` of one ``(arm name, seed, point, budget, out, data_root, subset, purpose)`` job (a worker's entry)."""
    name, seed, point, budget, out, data_root, subset, purpose = job
    return train_run(ARMS[name], seed, point, budget, out, data_root, subset, print, purpose)


#: The worker processes of the runs (kept across the stages of one experiment: each start imports torch anew).
_workers: dict[int, object] = {}


def _worker_pool(workers: int):
    """The pool of ``workers`` processes, started on first use and kept until :func:`close_workers`."""
    if workers not in _workers:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        close_workers()
        # spawn: a forked child of a process whose torch already started its thread pools can hang
        _workers[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    return _workers[workers]


def close_workers() -> None:
    """Stop the worker processes (the end of an experiment)."""
    while _workers:
        _workers.popitem()[1].shutdown()


def _recorded(job: tuple) -> dict | None:
    """The record of ``job`` when it was trained already (read here: no worker needed), else None."""
    name, seed, point, budget, out, _, _, purpose = job
    arm = ARMS[name]
    return read_back(record_path(out, name, TUNING_SEED if purpose == "tune" else seed, point, purpose),
                     budget.plan(arm, purpose))


def _train_all(jobs: list[tuple], workers: int, echo: Callable[[str], None]) -> list[dict]:
    """Train ``jobs`` (records read back where they exist) in order, or on ``workers`` processes (each with
    ``budget.threads`` torch threads)."""
    done = [_recorded(job) for job in jobs]
    todo = [job for job, record in zip(jobs, done) if record is None]
    if workers <= 1 or len(todo) <= 1:
        trained = iter([train_run(ARMS[j[0]], *j[1:7], echo, j[7]) for j in todo])
    else:
        trained = iter(_worker_pool(workers).map(_train_job, todo))
    return [record if record is not None else next(trained) for record in done]


def _next_value(values: list, chosen: float, limits: tuple[float, float]) -> float | None:
    """The value beyond ``chosen`` at an edge of ``values`` (the grid's own ratio, stopped at the hard limit when
    a full step would pass it), or None when ``chosen`` is interior or is the hard limit itself."""
    ordered = sorted(set(values))
    if len(ordered) < 2 or ordered[0] < chosen < ordered[-1]:
        return None
    ratio = ordered[1] / ordered[0] if chosen == ordered[0] else ordered[-1] / ordered[-2]
    new = min(max(chosen / ratio if chosen == ordered[0] else chosen * ratio, limits[0]), limits[1])
    new = int(round(new)) if all(isinstance(v, int) for v in ordered) else float(f"{new:.6g}")
    return None if new == chosen or new in ordered else new


def _edge_notes(arm: Arm, axes: dict[str, list], chosen: dict, extensions: int, budget: Budget) -> dict[str, str]:
    """Why a chosen value still sits at its grid's edge (``{axis: reason}``; interior values are not listed)."""
    notes = {}
    for axis, values in axes.items():
        ordered = sorted(set(values))
        if ordered[0] < chosen[axis] < ordered[-1]:
            continue
        if len(ordered) == 1:
            notes[axis] = "one value (--quick)"
        elif not budget.extend:
            notes[axis] = "grid edge, not extended"
        elif chosen[axis] in (limits := LR_LIMITS if axis == "lr" else arm.limits.get(axis, (1e-6, 1e6))):
            notes[axis] = f"hard limit [{limits[0]:g}, {limits[1]:g}]"
        else:  # the arm's extensions ran out (MAX_EXTENSIONS) before the edge became interior
            notes[axis] = f"grid edge after {extensions} extensions"
    return notes


def _stage_points(arm: Arm, axis: str, axes: dict[str, list], base: dict) -> list[dict]:
    """The points of one tuning stage: ``base`` with ``axis`` set to each value of its grid."""
    return [{**base, axis: value} for value in axes[axis]]


def tune_arms(arm_names: list[str], budget: Budget, out: Path, data_root: str, *,
              learning_rates: tuple[float, ...] = LEARNING_RATES, narrow: bool = False, subset: int | None = None,
              workers: int = 1, echo: Callable[[str], None] = print) -> dict[str, dict]:
    """Tune every arm on the tuning split, one axis after the other, extending edges; ``{arm: tuning}``.

    Every arm follows the same two stages (equal budgets): the learning rates with the method parameter at
    the middle of its grid (the paper's value), then the parameter's other values at the chosen rate; after
    each stage a chosen value at the stage's edge adds the next value beyond it (the grid's own ratio) until
    it is interior or meets a hard limit (:data:`MAX_EXTENSIONS` an arm at most). Five runs an arm with a
    tuned parameter, three for the ``@paper`` arms. A tuning is ``{"chosen", "grid": [{"point", "score",
    "selected_step", "steps", "start_val"}], "axes", "edges"}``, also written to
    ``OUT/runs/<arm>/tuning.json``. Arms ``tuned_with`` another take that arm's point.
    """
    tuned = [n for n in arm_names if not ARMS[n].tuned_with]
    axes = {n: grid_axes(ARMS[n], learning_rates_for(ARMS[n].setting, learning_rates), narrow) for n in tuned}
    middle = {n: {k: v[len(v) // 2] for k, v in axes[n].items()} for n in tuned}
    stage = {n: 0 for n in tuned}  # index into the arm's axes: lr first, then its parameter
    records: dict[str, list[dict]] = {n: [] for n in tuned}
    extensions = {n: 0 for n in tuned}
    pending = {n: _stage_points(ARMS[n], "lr", axes[n], middle[n]) for n in tuned}
    while any(pending.values()):
        jobs = [(n, 0, p, budget, out, data_root, subset, "tune") for n in tuned for p in pending[n]]
        for job, record in zip(jobs, _train_all(jobs, workers, echo)):
            records[job[0]].append(record)
        for n in tuned:
            pending[n] = []
            names = list(axes[n])
            best = max(records[n], key=lambda r: r["tuning_score"])["point"]
            while stage[n] < len(names) and not pending[n]:
                axis = names[stage[n]]
                limits = LR_LIMITS if axis == "lr" else ARMS[n].limits.get(axis, (1e-6, 1e6))
                new = (_next_value(axes[n][axis], best[axis], limits)
                       if budget.extend and extensions[n] < MAX_EXTENSIONS else None)
                if new is not None:  # still at this stage's edge: one more value beyond it
                    axes[n][axis].append(new)
                    extensions[n] += 1
                    pending[n] = [{**best, axis: new}]
                    continue
                stage[n] += 1
                if stage[n] < len(names):  # the next axis at the point chosen so far
                    tried = [r["point"] for r in records[n]]
                    pending[n] = [p for p in _stage_points(ARMS[n], names[stage[n]], axes[n], best) if p not in tried]
    tunings = {}
    for n in tuned:
        best = max(records[n], key=lambda r: r["tuning_score"])
        tunings[n] = {
            "chosen": best["point"], "extensions": extensions[n], "axes": axes[n],
            "edges": _edge_notes(ARMS[n], axes[n], best["point"], extensions[n], budget),
            "grid": [{"point": r["point"], "score": r["tuning_score"], "selected_step": r["best_step"],
                      "steps": r["steps"], "start_val": r["start"]["val"]["map_at_r"]} for r in records[n]],
        }
        atomic_write_json(out / "runs" / n / "tuning.json", tunings[n])
    for n in arm_names:
        if ARMS[n].tuned_with:
            tunings[n] = {**tunings[ARMS[n].tuned_with], "tuned_with": ARMS[n].tuned_with}
    return tunings


def run_arms(arm_names: list[str], seeds: list[int], budget: Budget, out: Path, data_root: str, *,
             learning_rates: tuple[float, ...] = LEARNING_RATES, narrow: bool = False, subset: int | None = None,
             curve_arms: tuple[str, ...] = (), workers: int = 1,
             echo: Callable[[str], None] = print) -> tuple[dict[str, list[dict]], dict[str, dict], dict[str, dict]]:
    """Tune every arm, then train every seed at the chosen point; ``curve_arms`` also train their early curves.

    Returns ``(records, curves, tunings)``: result records by arm; curve records by ``"own"`` / ``"common"``
    then arm; the tunings (:func:`tune_arms`). Results do not depend on ``workers``: each run is seeded by its
    own arguments.
    """
    tunings = tune_arms(arm_names, budget, out, data_root, learning_rates=learning_rates, narrow=narrow,
                        subset=subset, workers=workers, echo=echo)
    chosen = {n: tunings[n]["chosen"] for n in arm_names}
    # seed-major: every arm has seed s before any has seed s + 1
    results = [(n, seed, chosen[n], budget, out, data_root, subset, "result") for seed in seeds for n in arm_names]
    curve_jobs = {rate: [(n, seed, chosen[n] if rate == "own" else {**chosen[n], "lr": COMMON_LEARNING_RATE}, budget,
                          out, data_root, subset, "curve") for seed in seeds for n in curve_arms]
                  for rate in ("own", "common")}
    # an arm whose own rate is the common one has one curve a seed, read by both comparisons (trained once)
    unique = list({(j[0], j[1], point_tag(j[2]), j[7]): j for j in results + curve_jobs["own"] + curve_jobs["common"]}.values())
    trained = {(j[0], j[1], point_tag(j[2]), j[7]): r for j, r in zip(unique, _train_all(unique, workers, echo))}

    def record_of(job: tuple) -> dict:
        return trained[(job[0], job[1], point_tag(job[2]), job[7])]

    records: dict[str, list[dict]] = {name: [] for name in arm_names}
    for job in results:
        records[job[0]].append(record_of(job))
    curves: dict[str, dict[str, list[dict]]] = {rate: {n: [] for n in curve_arms} for rate in ("own", "common")}
    for rate, jobs in curve_jobs.items():
        for job in jobs:
            curves[rate][job[0]].append(record_of(job))
    return records, curves, tunings


def budget_dict(budget: Budget) -> dict:
    """The budget as JSON (``claims.json``'s meta)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(budget).items()}
