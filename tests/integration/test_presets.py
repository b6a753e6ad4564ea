"""Every packaged preset: valid config, documented header, buildable parts; CPU presets train end to end.

Benchmark presets (CUB, Cars196, SOP, In-Shop, Omniglot at full size) are checked through
validation and construction only — their data is not on this machine. CPU presets (``cpu-*``) run 3
training steps through the real :class:`~dmlkit.engine.trainer.Trainer`: the MNIST ones on sklearn's
digits (the same labels, 1,797 images instead of 5,000; at 28 px for a model built for MNIST's size),
the Omniglot ones on a tiny synthetic tree in the official ``omniglot-py`` layout.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.config import list_presets, load_config, parse_override, preset_info
from dmlkit.data import get_dataset_spec, list_datasets
from dmlkit.engine.objective import build_objective
from dmlkit.losses import LOSSES
from dmlkit.mining import MINERS
from dmlkit.models import list_models

PRESETS = [p.name for p in list_presets()]
CPU_PRESETS = [n for n in PRESETS if n.startswith("cpu-")]
BENCHMARK_PRESETS = [n for n in PRESETS if n not in CPU_PRESETS and n != "mnist-proxy-anchor"]
PAPER_PREFIXES = ("asap-", "proxy-anchor-", "proxy-nca-", "dro-", "eps-")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "presets.md"


def command_overrides(command: str) -> list[str]:
    """The ``--set key=value`` overrides of a preset's ``# Command:`` line."""
    words = shlex.split(command)
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--set"]


def test_presets_cover_every_paper_and_cpu_experiment():
    names = set(PRESETS)
    for prefix in PAPER_PREFIXES:
        assert any(n.startswith(prefix) for n in BENCHMARK_PRESETS), prefix
    for expected in ("asap-c2-cub", "proxy-anchor-sop-paper", "proxy-anchor-sop-code", "dro-topk-pn-inshop",
                     "eps-ms-cars", "cpu-eps-mnist-parity-triplet", "cpu-eps-mnist-parity-triplet-eps",
                     "cpu-asap-mnist-2d-c2", "cpu-asap-mnist-2d-c2-proxy", "cpu-proxy-anchor-mnist",
                     "cpu-proxy-nca-mnist", "cpu-ms-mnist", "cpu-omniglot-eps-alphabet"):
        assert expected in names, expected
    for ds in ("cub", "cars", "sop", "inshop"):
        for loss in ("c1", "c2", "ms", "triplet"):
            assert {f"asap-{loss}-{ds}", f"asap-baseline-{loss}-{ds}", f"asap-proxy-{loss}-{ds}"} <= names


@pytest.mark.parametrize("name", PRESETS)
def test_preset_validates_and_documents_itself(name):
    info = preset_info(name)
    assert info.summary and "\n" not in info.summary and not info.summary.lower().startswith(("source:", "command:"))
    assert info.source, f"{name} has no '# Source:' line"
    words = shlex.split(info.command)
    assert words[:4] == ["dmlkit", "train", "--preset", name], info.command
    cfg = load_config(preset=name, overrides=command_overrides(info.command))
    assert cfg.name == name
    assert cfg.data.name in list_datasets()
    spec = get_dataset_spec(cfg.data.name)
    for label in (cfg.data.label, cfg.data.eval_label):
        assert label in (None, "class") or label in spec.label_kinds, (name, label)
    if not spec.in_memory:
        assert cfg.data.root is not None, f"{name}: the command must set data.root"
    assert cfg.model.name == "auto" or list_models(cfg.model.name) == [cfg.model.name]  # auto: the recipe picks
    if cfg.model.pretrained and cfg.model.name in ("bn_inception", "resnet50"):
        assert cfg.model.weights, f"{name}: the command must pass model.weights (no downloads)"


def test_every_shipped_preset_is_in_the_docs_table():
    text = DOCS.read_text()
    missing = [n for n in PRESETS if f"`{n}`" not in text]
    assert not missing, missing


def _fake_batch(cfg, num_classes: int = 6, per_class: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(num_classes, dtype=torch.int64).repeat_interleave(per_class)
    embeddings = torch.randn(len(labels), cfg.model.embedding_size, generator=g, dtype=torch.float32)
    return torch.nn.functional.normalize(embeddings, dim=1), labels


@pytest.mark.parametrize("name", PRESETS)
def test_preset_parts_exist_and_the_objective_runs(name):
    cfg = load_config(preset=name)
    assert cfg.loss.name in LOSSES.names()
    if cfg.loss.miner.name is not None:
        assert cfg.loss.miner.name in MINERS.names()
    pair = cfg.loss.args.get("pair_loss")
    if pair is not None:
        assert (pair if isinstance(pair, str) else pair["name"]) in LOSSES.names()
    if cfg.model.embedding_size is None:  # left to the recipe (the default job): the small CNN's 64
        cfg.model.embedding_size = 64
    objective = build_objective(cfg, num_classes=6)
    embeddings, labels = _fake_batch(cfg)
    embeddings.requires_grad_(True)
    loss = objective(embeddings, labels)
    assert loss.ndim == 0 and torch.isfinite(loss), (name, loss)
    loss.backward()
    assert embeddings.grad is not None and torch.isfinite(embeddings.grad).all()
    if cfg.asap.enabled:
        assert objective.loss.bank.proxies_per_class == cfg.asap.proxies_per_class


# ----------------------------------------------------------------------------- CPU presets end to end


def _write_png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(20, 20), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(path)


@pytest.fixture(scope="module")
def omniglot_root(tmp_path_factory) -> Path:
    """``omniglot-py`` tree: 10 background alphabets (2 characters x 4 images), 2 evaluation alphabets."""
    root = tmp_path_factory.mktemp("omniglot")
    seed = 0
    for set_name, alphabets, per_char in (("images_background", 10, 4), ("images_evaluation", 2, 3)):
        for a in range(alphabets):
            for c in range(2):
                for j in range(per_char):
                    seed += 1
                    _write_png(root / "omniglot-py" / set_name / f"Alphabet_{set_name[7]}{a}" / f"character{c + 1:02d}"
                               / f"{seed:04d}_{j:02d}.png", seed)
    return root


#: One torch thread: the cpu-* presets ask for 2, and a test process that once ran on 2 threads stays
#: slower afterwards even when set back to 1 (test_folder_train after a 2-thread run: 30 s CPU, not 5).
QUICK = ["train.max_steps=3", "train.eval_every=3", "train.checkpoint_every=3", "train.log_every=1",
         "train.progress=false", "eval.clustering=false", "eval.save_embeddings=false", "train.num_threads=1"]


#: The input side of a model whose layers fix it (its flattened features feed a linear layer); digits are
#: read at that size for it, at their own 8 px for every other model.
FIXED_INPUT = {"eps_mnist_net": 28}


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_cpu_preset_trains_three_steps(name, tmp_path, omniglot_root):
    from dmlkit.recipe import Trainer

    overrides = list(QUICK)
    cfg = load_config(preset=name)
    if not get_dataset_spec(cfg.data.name).in_memory:
        overrides.append(f"data.root={omniglot_root}")
    if cfg.data.name == "mnist":  # the preset's loss, miner and model on the smallest data with MNIST's labels
        overrides.append("data.name=digits")
        if cfg.model.name in FIXED_INPUT:
            overrides.append(f"data.image_size={FIXED_INPUT[cfg.model.name]}")
    cfg = load_config(preset=name, overrides=overrides)
    result = Trainer(cfg, tmp_path / "run", echo=lambda _: None).fit()
    assert result.steps == 3
    assert 0.0 <= result.test_metrics["map_at_r"] <= 1.0
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


def test_command_overrides_are_parsed_like_the_cli():
    info = preset_info("asap-c2-cub")
    overrides = command_overrides(info.command)
    assert [parse_override(o)[0] for o in overrides] == [["data", "root"], ["model", "weights"]]


@pytest.mark.parametrize("ds", ["cub", "cars", "sop", "inshop"])
def test_proxy_anchor_code_variant_differs_from_the_paper_as_documented(ds):
    paper = load_config(preset=f"proxy-anchor-{ds}-paper")
    code = load_config(preset=f"proxy-anchor-{ds}-code")
    assert (paper.model.pooling, code.model.pooling) == ("avg", "avg+max")
    assert (paper.optimizer.grad_clip, code.optimizer.grad_clip) == (None, 10.0)
    assert paper.optimizer.warmup_steps == 0 < code.optimizer.warmup_steps
    assert paper.sampler.name == code.sampler.name == "random"
    assert paper.optimizer.loss_lr_multiplier == code.optimizer.loss_lr_multiplier == 100
    assert paper.loss.args == code.loss.args == {"margin": 0.1, "alpha": 32}


@pytest.mark.parametrize("ds, proxies, pool, every", [("cub", 8, 12, 25), ("cars", 8, 12, 25),
                                                      ("sop", 4, 7, 250), ("inshop", 4, 7, 250)])
def test_asap_presets_carry_appendix_a2_hyperparameters(ds, proxies, pool, every):
    for loss in ("c1", "c2", "ms", "triplet"):
        cfg = load_config(preset=f"asap-{loss}-{ds}")
        assert cfg.asap.enabled and cfg.asap.proximal_lambda == pytest.approx(2e-4)
        assert (cfg.asap.proxies_per_class, cfg.asap.pool_size, cfg.asap.patience) == (proxies, pool, 3)
        assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.weight_decay) == ("adam", 1e-5, 1e-4)
        assert (cfg.sampler.batch_size, cfg.sampler.m, cfg.model.embedding_size) == (32, 4, 128)
        assert cfg.model.normalization == "bounded" and cfg.train.eval_every == every
        assert cfg.optimizer.loss_lr_multiplier == 1
