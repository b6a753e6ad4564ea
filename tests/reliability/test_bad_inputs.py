"""Bad input everywhere a user can give it: one table, one clear message per case.

Each row is either an API call (``pytest.raises(type, match=...)``) or a CLI invocation (non-zero exit,
the message on stderr, no traceback, and every file that existed before is byte-identical afterwards).
The CLI rows run ``dmlkit.cli.main.main`` in-process; those marked ``subprocess=True`` (a config error of
``validate``, a checkpoint error of ``train --resume``) run the real ``python -m dmlkit`` in a subprocess, so the exit code and
stderr a user's shell sees are checked too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from dmlkit.exceptions import CheckpointError, ConfigError, DataError, InvalidParameterError

# ----------------------------------------------------------------------------- workspace builders


def write_png(path: Path, seed: int = 0, size: int = 12) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels, mode="RGB").save(path)
    return path


def truncated_png(path: Path) -> Path:
    write_png(path, seed=7, size=64)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def image_folder(root: Path, classes: list[str], per_class: int = 2) -> Path:
    for ci, cls in enumerate(classes):
        for k in range(per_class):
            write_png(root / cls / f"{k}.png", seed=10 * ci + k)
    return root


def csv_manifest(root: Path, rows: list[str], header: str = "path,label,split") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "manifest.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def good_csv_rows(root: Path) -> list[str]:
    rows = []
    for split, classes in (("train", ("a", "b")), ("test", ("c", "d"))):
        for cls in classes:
            for k in range(2):
                write_png(root / "img" / f"{cls}{k}.png", seed=hash((cls, k)) % 1000)
                rows.append(f"img/{cls}{k}.png,{cls},{split}")
    return rows


def folder_with(root: Path, bad: dict[str, str], classes: int = 8, per_class: int = 6) -> Path:
    """A small uniform folder (decoded into memory) where ``bad`` maps ``<class>/<file>`` to "truncated" or "text"."""
    image_folder(root, [f"c{i}" for i in range(classes)], per_class)
    for rel, kind in bad.items():
        if kind == "truncated":
            data = (root / rel).read_bytes()
            (root / rel).write_bytes(data[: len(data) // 2])
        else:
            (root / rel).write_text("not an image")
    return root


def no_run_left(out: Path):
    """An ``also`` check: a failed ``train --out`` leaves nothing that looks like a finished run."""
    def check(ctx) -> None:
        target = ctx.tmp / out
        if (target / "metrics.json").exists() or (target / "checkpoints" / "last.pt").exists():
            pytest.fail(f"a failed run left {sorted(p.name for p in target.rglob('*'))} in {target}")
    return check


# noise-image fixtures read as photos: the small CNN keeps these data-handling cases small (not the pretrained backbone)
TRAIN_QUICK = ["--quiet", "--no-report", "--set", "train.max_steps=4", "--set", "model.ensemble=1",
               "--set", "model.shift_average=0", "--set", "eval.clustering=false", "--set", "model.name=small_cnn"]


def emb_labels(n: int = 8, d: int = 4):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g), torch.arange(n, dtype=torch.int64) // 2


# ----------------------------------------------------------------------------- the table


@dataclass
class Ctx:
    """What a case may use: a scratch folder and (lazily) a private copy of a finished run."""

    tmp: Path
    get_run: Callable[[], Path]

    @property
    def run(self) -> Path:
        return self.get_run()


@dataclass
class Api:
    """``call(ctx)`` must raise ``error`` with a message matching ``match`` (regex)."""

    call: Callable[[Ctx], object]
    error: type
    match: str


@dataclass
class Cli:
    """``python -m dmlkit <args(ctx)>`` must fail with ``match`` on stderr and leave ``protect(ctx)`` untouched."""

    args: Callable[[Ctx], list[str]]
    match: str
    protect: Callable[[Ctx], Path] = lambda ctx: ctx.tmp
    setup: Callable[[Ctx], None] = lambda ctx: None
    also: Callable[[Ctx], None] = field(default=lambda ctx: None)
    code: int = 2
    subprocess: bool = False


def _set(*pairs: str) -> list[str]:
    out = []
    for p in pairs:
        out += ["--set", p]
    return out


def _edit_config(run: Path, **changes) -> None:
    data = yaml.safe_load((run / "config.yaml").read_text())
    for dotted, value in changes.items():
        node = data
        *head, last = dotted.split("__")
        for k in head:
            node = node[k]
        node[last] = value
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def _foreign_checkpoint(run: Path) -> None:
    """Rewrite best.pt as if a run with embedding_size=32 had written it."""
    from dmlkit.config import load_config
    from dmlkit.config.schema import config_to_dict
    from dmlkit.engine.checkpoint_files import config_fingerprint, load_checkpoint, save_checkpoint

    other = load_config(path=run / "config.yaml", overrides=["model.embedding_size=32"])
    state = load_checkpoint(run / "checkpoints" / "best.pt")
    state["fingerprint"] = config_fingerprint(config_to_dict(other))
    save_checkpoint(run / "checkpoints" / "best.pt", state)


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def _pickled_object_checkpoint(path: Path) -> Path:
    torch.save({"format": "dmlkit-checkpoint-1", "model": {}, "payload": _Evil()}, path)
    return path


def _bad_config(tmp: Path, text: str) -> str:
    path = tmp / "config.yaml"
    path.write_text(text)
    return str(path)


def _load_checkpoint(path):
    from dmlkit.engine.checkpoint_files import load_checkpoint

    return load_checkpoint(path)


def _retrieval(*args, **kwargs):
    from dmlkit.evaluation import retrieval_metrics

    return retrieval_metrics(*args, **kwargs)


def _build_splits(*args, **kwargs):
    from dmlkit.data import build_splits

    return build_splits(*args, **kwargs)


def _loss(name, **kwargs):
    from dmlkit.losses import create_loss

    return create_loss(name, **kwargs)


def _read_truncated_image(tmp: Path):
    from dmlkit.data import ImageFileDataset

    ds = ImageFileDataset([str(truncated_png(tmp / "cls" / "broken.png"))], torch.tensor([0]), ["cls"])
    return ds[0]


def _sampler(**kwargs):
    from dmlkit.data import create_sampler

    return create_sampler("m_per_class", seed=0, **kwargs).batches(0)


E, L = emb_labels()

CASES: dict[str, Api | Cli] = {
    # --- configuration (API) -------------------------------------------------------------
    "config-wrong-type": Api(
        lambda c: __import__("dmlkit.config", fromlist=["x"]).config_from_dict({"train": {"max_steps": "10"}}),
        ConfigError, r"train\.max_steps must be int\. Got '10' \(str\)"),
    "config-section-not-mapping": Api(
        lambda c: __import__("dmlkit.config", fromlist=["x"]).config_from_dict({"optimizer": 3}),
        ConfigError, r"optimizer must be a mapping\. Got 3"),
    "config-lists-every-problem": Api(
        lambda c: __import__("dmlkit.config", fromlist=["x"]).config_from_dict(
            {"optimizer": {"lr": -1}, "sampler": {"bacth_size": 8}}),
        ConfigError, r"(?s)2 problems.*optimizer\.lr must be None or a float > 0\. Got -1.*Did you mean 'batch_size'"),
    "config-bool-for-int": Api(
        lambda c: __import__("dmlkit.config", fromlist=["x"]).config_from_dict({"model": {"embedding_size": True}}),
        ConfigError, r"model\.embedding_size must be int\. Got True \(bool\)"),
    # --- configuration and flags (CLI) -----------------------------------------------------
    "cli-unknown-key": Cli(lambda c: ["validate", *_set("optimzer.lr=0.1")],
                           r"Unknown key 'optimzer'\. Did you mean 'optimizer'\?", subprocess=True),
    "cli-wrong-type": Cli(lambda c: ["validate", *_set("sampler.batch_size=sixty")],
                          r"sampler\.batch_size must be int\. Got 'sixty' \(str\)"),
    "cli-negative-size": Cli(lambda c: ["validate", *_set("model.embedding_size=-8")],
                             r"model\.embedding_size must be None or an int > 0, at most 1048576\. Got -8"),
    "cli-more-proxies-than-pool": Cli(
        lambda c: ["validate", *_set("asap.enabled=true", "asap.proxies_per_class=4", "asap.pool_size=2",
                                     "protocol.val_fraction=0.2")],
        r"asap\.proxies_per_class \(4\) cannot exceed asap\.pool_size \(2\)"),
    "cli-malformed-override": Cli(lambda c: ["validate", "--set", "optimizer.lr"],
                                  r"Override 'optimizer\.lr' must look like key\.path=value"),
    "cli-unknown-preset": Cli(lambda c: ["validate", "--preset", "proxy-anchr-cub-paper"],
                              r"Unknown preset 'proxy-anchr-cub-paper'\. Did you mean 'proxy-anchor-cub-paper'"),
    "cli-config-file-missing": Cli(lambda c: ["validate", "--config", str(c.tmp / "nope.yaml")],
                                   r"Config file '.*nope\.yaml' does not exist"),
    "cli-config-not-yaml": Cli(lambda c: ["validate", "--config", _bad_config(c.tmp, "optimizer: [1, 2\n")],
                               r"Config file '.*config\.yaml' is not valid YAML"),
    "cli-config-python-tag": Cli(
        lambda c: ["validate", "--config",
                   _bad_config(c.tmp, f"!!python/object/apply:os.system ['touch {c.tmp / 'PWNED'}']\n")],
        r"is not valid YAML: could not determine a constructor for the tag",
        also=lambda c: None if not (c.tmp / "PWNED").exists() else pytest.fail("YAML tag executed a command")),
    "cli-config-top-level-list": Cli(lambda c: ["validate", "--config", _bad_config(c.tmp, "- 1\n- 2\n")],
                                     r"must hold a mapping at the top level\. Got list"),
    "cli-batch-not-divisible-by-m": Cli(
        lambda c: ["train", "--out", str(c.run), "--quiet", *_set("sampler.batch_size=16", "sampler.m=5")],
        r"sampler\.batch_size \(16\) must be divisible by sampler\.m \(5\)", protect=lambda c: c.run),
    "cli-out-already-holds-a-run": Cli(
        lambda c: ["train", "--out", str(c.run), "--quiet"],
        r"already holds a run; use --resume", protect=lambda c: c.run),
    "cli-resume-with-overrides": Cli(
        lambda c: ["train", "--resume", str(c.run), *_set("train.max_steps=9")],
        r"--resume takes the run's saved config\.yaml", protect=lambda c: c.run),
    "cli-resume-not-a-run": Cli(
        lambda c: ["train", "--resume", str(c.tmp)], r"no config\.yaml there; not a dmlkit run directory"),
    "cli-resume-embedding-size-mismatch": Cli(
        lambda c: ["train", "--resume", str(c.run), "--quiet", "--no-report"],
        r"written by a different configuration .*cannot be resumed with this config",
        setup=lambda c: _edit_config(c.run, model__embedding_size=32), protect=lambda c: c.run),
    "cli-resume-truncated-checkpoint": Cli(
        lambda c: ["train", "--resume", str(c.run), "--quiet", "--no-report"],
        r"last\.pt' cannot be read safely \(truncated, corrupted",
        setup=lambda c: _truncate(c.run / "checkpoints" / "last.pt"), protect=lambda c: c.run, subprocess=True),
    "cli-evaluate-checkpoint-of-other-config": Cli(
        lambda c: ["evaluate", str(c.run)],
        r"best\.pt was written by a different configuration than .*config\.yaml",
        setup=lambda c: _foreign_checkpoint(c.run), protect=lambda c: c.run),
    "cli-evaluate-overrides-model": Cli(
        lambda c: ["evaluate", str(c.run), *_set("model.embedding_size=32")],
        r"evaluate only overrides data\.\*, protocol\.\* and eval\.\* fields", protect=lambda c: c.run),
    "cli-embed-bad-suffix": Cli(
        lambda c: ["embed", str(c.run), "--out", str(c.tmp / "emb.txt")],
        r"--out must end in \.npz or \.npy", protect=lambda c: c.run),
    "cli-manifest-path-outside-root": Cli(
        lambda c: ["train", "--out", str(c.tmp / "new-run"), "--quiet",
                   *_set("data.name=csv", f"data.root={csv_manifest(c.tmp / 'data', ['../secret.png,a,train'])}")],
        r"line 2 of '.*manifest\.csv' points outside the manifest's folder",
        also=lambda c: None if not (c.tmp / "new-run").exists() else pytest.fail("run directory was created")),
    "cli-search-missing-gallery": Cli(
        lambda c: ["search", "--gallery", str(c.tmp / "gallery.npz"), "--query-embeddings", str(c.tmp / "q.npz")],
        r"'.*gallery\.npz' does not exist"),
    # --- what a new user types or feeds in ---------------------------------------------
    "cli-truncated-image-in-a-folder-decoded-into-memory": Cli(
        lambda c: ["train", "--out", "run", *TRAIN_QUICK, *_set(
            "data.name=folder", "data.class_split=sorted", f"data.root={folder_with(c.tmp / 'imgs', {'c1/2.png': 'truncated'})}")],
        r"Cannot read image '.*c1/2\.png' \(item \d+ of the train split\): image file is truncated",
        also=no_run_left(Path("run"))),
    "cli-text-file-named-png-in-a-folder": Cli(
        lambda c: ["train", "--out", "run", *TRAIN_QUICK, *_set(
            "data.name=folder", "data.class_split=sorted", f"data.root={folder_with(c.tmp / 'imgs', {'c6/0.png': 'text'})}")],
        r"Cannot read image '.*c6/0\.png' \(item \d+ of the test split\): cannot identify image file",
        also=no_run_left(Path("run"))),
    "cli-validate-loss-args-typo": Cli(lambda c: ["validate", *_set("loss.args.marign=0.2")],
                                       r"'loss\.args\.marign' is not an argument of loss 'proxy_anchor'\. "
                                       r"Did you mean 'loss\.args\.margin'\?"),
    "cli-validate-model-args-typo": Cli(lambda c: ["validate", *_set("model.args.widht=8")],
                                        r"'model\.args\.widht' is not an argument of model 'small_cnn'\. "
                                        r"Did you mean 'model\.args\.width'\?"),
    "cli-validate-miner-args-typo": Cli(
        lambda c: ["validate", *_set("loss.miner.name=multi_similarity", "loss.miner.args.epsilonn=0.1")],
        r"'loss\.miner\.args\.epsilonn' is not an argument of miner 'multi_similarity'\. "
        r"Did you mean 'loss\.miner\.args\.epsilon'\?"),
    "cli-validate-loss-args-bad-value": Cli(lambda c: ["validate", *_set("loss.args.margin=-1")],
                                            r"loss\.args\.margin: The 'margin' parameter of ProxyAnchorLoss must be"),
    "cli-validate-data-root-missing": Cli(
        lambda c: ["validate", *_set("data.name=folder", f"data.root={c.tmp / 'nowhere'}")],
        r"data\.root '.*nowhere' does not exist \(data set 'folder'\)\. Expected layout"),
    "cli-validate-timm-model-args": Cli(
        lambda c: ["validate", *_set("model.name=resnet18", "model.args.widht=8")],
        r"model\.args \{'widht': 8\} do not fit model 'resnet18' \(passed on to timm\): .*unexpected keyword"),
    "cli-train-model-args-typo": Cli(
        lambda c: ["train", "--out", "run", *TRAIN_QUICK, *_set("model.args.widht=8")],
        r"Did you mean 'model\.args\.width'\?", also=no_run_left(Path("run"))),
    "cli-train-timm-model-args": Cli(
        lambda c: ["train", "--out", "run", *TRAIN_QUICK, *_set("model.name=resnet18", "model.args.widht=8")],
        r"do not fit model 'resnet18' \(passed on to timm\)", also=no_run_left(Path("run"))),
    "cli-train-batch-larger-than-the-split": Cli(
        lambda c: ["train", "--out", "run", *TRAIN_QUICK, *_set(
            "data.name=folder", f"data.root={folder_with(c.tmp / 'imgs', {}, classes=8, per_class=2)}",
            "sampler.batch_size=16", "sampler.m=2")],
        r"The training split has 10 images, fewer than one batch of sampler\.batch_size=16",  # 5 of the 8 classes
        also=no_run_left(Path("run"))),
    "cli-evaluate-val-of-a-run-without-one": Cli(
        lambda c: ["evaluate", str(c.run), "--split", "val", *_set("protocol.val_fraction=0")],
        r"this run has no validation split .*Use --split test or --split train", protect=lambda c: c.run),
    "data-float-labels-in-an-image-file-split": Api(
        lambda c: __import__("dmlkit.data", fromlist=["x"]).ImageFileDataset(["a.png"] * 4,
                                                                               torch.tensor([0.2, 0.9, 1.5, 1.99]),
                                                                               ["a", "b"]),
        DataError, r"labels given to ImageFileDataset 'dataset' must hold integer class ids \(int64\)\. "
                   r"Got dtype torch\.float32"),
    "data-float-labels-in-memory": Api(
        lambda c: __import__("dmlkit.data", fromlist=["x"]).TensorImageDataset(torch.zeros(4, 1, 2, 2),
                                                                                 [0.2, 0.9, 1.5, 1.99], ["a", "b"]),
        DataError, r"labels given to TensorImageDataset 'dataset' must hold integer class ids"),
    "eval-interclass-distance-non-finite": Api(
        lambda c: __import__("dmlkit.evaluation.geometry", fromlist=["x"]).interclass_distance(
            torch.cat([E[:7], torch.full((1, 4), float("nan"))]), L),
        DataError, r"embeddings contains 4 NaN or infinite value\(s\)"),
    "eval-class-collapse-non-finite": Api(
        lambda c: __import__("dmlkit.evaluation.geometry", fromlist=["x"]).class_collapse(
            torch.cat([E[:7], torch.full((1, 4), float("inf"))]), L),
        DataError, r"embeddings contains 4 NaN or infinite value\(s\)"),
    # --- data sets and manifests -----------------------------------------------------------
    "data-empty-dataset": Api(
        lambda c: _build_splits("folder", root=(c.tmp / "empty" / "cls").mkdir(parents=True) or c.tmp / "empty"),
        DataError, r"folder: no images found under '.*empty'"),
    "data-single-class-dataset": Api(
        lambda c: _build_splits("folder", root=image_folder(c.tmp / "one", ["only"])),
        DataError, r"needs at least 2 classes; found 1"),
    "data-truncated-image": Api(lambda c: _read_truncated_image(c.tmp), DataError,
                                r"Cannot read image '.*broken\.png' \(item 0 of dataset\)"),
    "data-manifest-path-outside-root": Api(
        lambda c: _build_splits("csv", root=csv_manifest(c.tmp / "d", good_csv_rows(c.tmp / "d") + ["../x.png,a,train"])),
        DataError, r"line 10 of '.*manifest\.csv' points outside the manifest's folder .*allow_outside_root=True"),
    "data-manifest-bad-header": Api(
        lambda c: _build_splits("csv", root=csv_manifest(c.tmp / "d", ["a.png,a"], header="file,class")),
        DataError, r"first line of '.*manifest\.csv' must be a header naming the columns 'path' and 'label'.*Got 'file,class'"),
    "data-manifest-bad-split": Api(
        lambda c: _build_splits("csv", root=csv_manifest(c.tmp / "d", ["a.png,a,valid"])),
        DataError, r"line 2 of '.*manifest\.csv', column 'split': expected 'train', 'test' or 'validation' "
                   r"\(the same as test\)\. Got 'valid'"),
    "data-manifest-ragged-row": Api(
        lambda c: _build_splits("csv", root=csv_manifest(c.tmp / "d", ["a.png,a,train,extra"])),
        DataError, r"line 2 of '.*manifest\.csv' has 4 fields but the header has 3"),
    "data-disk-dataset-without-root": Api(lambda c: _build_splits("cub200"), InvalidParameterError,
                                          r"Dataset 'cub200' is read from disk: pass root=<directory>"),
    "data-unknown-dataset": Api(lambda c: _build_splits("cub", root=c.tmp), InvalidParameterError,
                                r"Unknown dataset 'cub'\. Did you mean 'cub200'\?"),
    "data-negative-image-size": Api(lambda c: _build_splits("mnist", image_size=-1), InvalidParameterError,
                                    r"The 'image_size' parameter of build_splits must be an int >= 1 or None\. Got -1"),
    "data-sampler-batch-not-divisible": Api(lambda c: _sampler(labels=L, m=3, batch_size=8), InvalidParameterError,
                                            r"batch_size 8 of MPerClassSampler is not divisible by m 3"),
    "data-sampler-single-class": Api(
        lambda c: _sampler(labels=torch.zeros(8, dtype=torch.int64), m=4, batch_size=8), DataError,
        r"needs 2 distinct classes per batch but labels has 1 classes"),
    "data-sampler-float-labels": Api(lambda c: _sampler(labels=L.float(), m=2, batch_size=8), DataError,
                                     r"must hold integer class ids \(int64\)\. Got dtype torch\.float32"),
    # --- checkpoints -------------------------------------------------------------------------
    "ckpt-missing": Api(lambda c: _load_checkpoint(c.tmp / "last.pt"), CheckpointError,
                        r"Checkpoint '.*last\.pt' does not exist"),
    "ckpt-truncated": Api(
        lambda c: (_truncate(c.run / "checkpoints" / "last.pt"), _load_checkpoint(c.run / "checkpoints" / "last.pt")),
        CheckpointError, r"cannot be read safely \(truncated, corrupted"),
    "ckpt-pickled-object": Api(lambda c: _load_checkpoint(_pickled_object_checkpoint(c.tmp / "evil.pt")),
                               CheckpointError, r"evil\.pt' cannot be read safely .*Weights only load failed"),
    "ckpt-not-dmlkit": Api(
        lambda c: (torch.save({"weight": torch.ones(2)}, c.tmp / "other.pt"), _load_checkpoint(c.tmp / "other.pt")),
        CheckpointError, r"other\.pt' is not a dmlkit checkpoint \(missing format tag\)"),
    "ckpt-load-from-non-run": Api(lambda c: __import__("dmlkit").load(c.tmp),
                                  ConfigError, r"is not a dmlkit run directory \(no config\.yaml\)"),
    # --- embeddings given to the evaluation API ---------------------------------------------
    "eval-labels-are-strings": Api(lambda c: _retrieval(E, ["a"] * 8), InvalidParameterError,
                                   r"labels must be a torch\.Tensor of integer class ids\. Got list"),
    "eval-labels-are-floats": Api(lambda c: _retrieval(E, L.float()), DataError,
                                  r"labels must hold integer class ids \(int64\)\. Got dtype torch\.float32"),
    "eval-rows-mismatch": Api(lambda c: _retrieval(E, L[:7]), DataError, r"embeddings has 8 rows but labels has 7"),
    "eval-non-finite": Api(lambda c: _retrieval(torch.cat([E[:7], torch.full((1, 4), float("nan"))]), L), DataError,
                           r"embeddings contains 4 NaN or infinite value\(s\)"),
    "eval-reference-size-mismatch": Api(
        lambda c: _retrieval(E, L, reference=torch.randn(5, 8), reference_labels=L[:5]), DataError,
        r"embeddings has 4 columns but reference has 8"),
    "eval-single-sample": Api(lambda c: _retrieval(E[:1], L[:1]), DataError, r"needs at least two samples"),
    "eval-ks-not-positive": Api(lambda c: _retrieval(E, L, ks=[0]), InvalidParameterError,
                                r"The 'ks' parameter of retrieval_metrics must be a non-empty sequence of ints >= 1"),
    "eval-embeddings-1d": Api(lambda c: _retrieval(E.flatten(), L), DataError, r"embeddings must be 2-D \[B, D\]"),
    # --- losses, miners, memory -------------------------------------------------------------
    "loss-bad-parameter": Api(lambda c: _loss("proxy_anchor", num_classes=4, embedding_size=4, alpha=0),
                              InvalidParameterError,
                              r"The 'alpha' parameter of ProxyAnchorLoss must be a float > 0\. Got 0 instead\."),
    "loss-embedding-size-mismatch": Api(lambda c: _loss("proxy_anchor", num_classes=4, embedding_size=8)(E, L),
                                        DataError, r"embeddings has 4 columns but ProxyAnchorLoss has embedding_size=8"),
    "loss-label-outside-classes": Api(lambda c: _loss("proxy_nca", num_classes=2, embedding_size=4)(E, L),
                                      DataError, r"labels must lie in \[0, 2\) for num_classes=2; got labels in \[0, 3\]"),
    "loss-float-labels": Api(lambda c: _loss("contrastive")(E, L.float()), DataError,
                             r"labels must hold integer class ids"),
    "loss-integer-embeddings": Api(lambda c: _loss("triplet_margin")(L.view(8, 1), L), DataError,
                                   r"embeddings must be a floating-point tensor\. Got dtype torch\.int64"),
    "miner-unknown-name": Api(lambda c: __import__("dmlkit.mining", fromlist=["x"]).create_miner("batch_hardd"),
                              InvalidParameterError, r"Unknown miner 'batch_hardd'\. Did you mean 'batch_hard', 'batch_easy_hard'\?"),
    "memory-embedding-size-mismatch": Api(
        lambda c: __import__("dmlkit.memory", fromlist=["x"]).CrossBatchMemory(
            _loss("contrastive"), embedding_size=8, memory_size=16)(E, L),
        DataError, r"embeddings has 4 columns but the memory's embedding_size is 8"),
}


def test_the_table_is_large_enough():
    assert len(CASES) >= 30
    assert sum(isinstance(c, Cli) for c in CASES.values()) >= 10
    assert sum(isinstance(c, Cli) and c.subprocess for c in CASES.values()) >= 2


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input_gives_a_clear_error(case_id, tmp_path, request, dmlkit_cli, dmlkit_in_process, snap):
    case = CASES[case_id]
    run_holder: list[Path] = []

    def get_run() -> Path:
        if not run_holder:
            run_holder.append(request.getfixturevalue("run_copy"))
        return run_holder[0]

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ctx = Ctx(scratch, get_run)
    if isinstance(case, Api):
        with pytest.raises(case.error, match=case.match):
            case.call(ctx)
        return
    case.setup(ctx)
    args = case.args(ctx)  # may create input files; they are part of the "before" state
    protected = case.protect(ctx)
    before = snap(protected)
    proc = (dmlkit_cli if case.subprocess else dmlkit_in_process)(*args, cwd=scratch)
    assert proc.returncode == case.code, proc.stdout + proc.stderr
    assert re.search(case.match, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    after = snap(protected)
    assert after.keys() >= before.keys(), f"files removed: {sorted(before.keys() - after.keys())}"
    changed = [k for k in before if before[k] != after[k]]
    assert not changed, f"files changed by a failed command: {changed}"
    case.also(ctx)
