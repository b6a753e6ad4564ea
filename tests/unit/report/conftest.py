"""A fake run directory in the engine's format, for the report tests."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml


def make_fake_run(
    tmp_path: Path,
    name: str = "run",
    *,
    seed: int = 0,
    num_classes: int = 5,
    per_class: int = 8,
    embedding_size: int = 16,
    train_steps: int = 60,
    eval_every: int = 20,
    val: bool = True,
    embeddings: bool = True,
    thumbnails: str | None = "gray",
    image_paths: bool = False,
    proxies: bool = False,
    projections: int = 0,
    env: bool = True,
    config: dict[str, Any] | None = None,
    extra_metrics: dict[str, Any] | None = None,
    lr: float = 1e-4,
    class_separation: float = 1.5,
    class_names: bool = False,
) -> Path:
    """Write ``tmp_path/name`` as the engine would: config, metrics, log, embeddings, env.

    ``thumbnails`` is ``"gray"`` ([N, H, W]), ``"rgb"`` ([N, H, W, 3]) or None; ``image_paths``
    writes PNG files and a ``paths`` array instead; ``projections`` > 0 adds ASAP records;
    ``class_names`` saves long bird-like class names (as a photo folder run does).
    Class centres are ``class_separation`` standard deviations apart on average, so the
    default data has some wrong neighbours.
    """
    rng = np.random.default_rng(seed)
    run_dir = tmp_path / name
    (run_dir / "embeddings").mkdir(parents=True)
    cfg = {
        "name": name,
        "seed": seed,
        "data": {"name": "fake-mnist", "root": "/data/fake"},
        "loss": {"name": "proxy_anchor", "margin": 0.1, "alpha": 32.0},
        "model": {"name": "resnet18", "embedding_size": embedding_size},
        "optimizer": {"name": "adamw", "lr": lr},
    }
    if config:
        cfg.update(config)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")

    metrics = {
        "precision_at_1": 0.61, "recall_at_1": 0.61, "recall_at_2": 0.72, "recall_at_4": 0.81,
        "recall_at_8": 0.88, "r_precision": 0.33, "map_at_r": 0.22, "nmi": 0.67,
        "selected_on": "val" if val else "last",
    }
    metrics.update(extra_metrics or {})
    (run_dir / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")

    lines = []
    for step in range(1, train_steps + 1):
        lines.append({"kind": "train", "step": step, "epoch": step // 20, "time": 0.5 * step,
                      "loss": float(3.0 / (1 + 0.05 * step) + 0.05 * rng.standard_normal()), "lr": lr})
        if step % eval_every == 0:
            for split in (("val", "test") if val else ("test",)):
                frac = step / train_steps * (1.0 - 0.1 * (seed % 3))
                lines.append({"kind": "eval", "split": split, "step": step, "time": 0.5 * step + 0.1,
                              "map_at_r": 0.1 + 0.12 * frac, "precision_at_1": 0.4 + 0.2 * frac,
                              "recall_at_1": 0.4 + 0.2 * frac, "recall_at_2": 0.5 + 0.2 * frac})
    for p in range(projections):
        lines.append({"kind": "projection", "projection": p, "steps": 20, "best_map_at_r": 0.1 + 0.02 * p,
                      "covering_radius_before": 0.9 - 0.1 * p, "covering_radius_after": 0.7 - 0.1 * p,
                      "proxy_spread": 1.0 + 0.05 * p})
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")

    if embeddings:
        labels = np.repeat(np.arange(num_classes, dtype=np.int64), per_class)
        centres = rng.standard_normal((num_classes, embedding_size)) * class_separation / np.sqrt(2.0)
        emb = (centres[labels] + rng.standard_normal((labels.size, embedding_size))).astype(np.float32)
        arrays: dict[str, np.ndarray] = {"embeddings": emb, "labels": labels}
        if class_names:
            arrays["class_names"] = np.array([f"Pileated_Woodpecker_{c:03d}" for c in range(num_classes)])
        if proxies:
            arrays["proxies"] = centres.astype(np.float32)
            arrays["proxy_labels"] = np.arange(num_classes, dtype=np.int64)
        shade = (labels * (200 // max(num_classes, 1)) + 30).astype(np.uint8)
        if thumbnails == "gray":
            arrays["thumbnails"] = np.broadcast_to(shade[:, None, None], (labels.size, 12, 12)).copy()
        elif thumbnails == "rgb":
            rgb = np.stack([shade, 255 - shade, np.full_like(shade, 90)], axis=1)
            arrays["thumbnails"] = np.broadcast_to(rgb[:, None, None, :], (labels.size, 12, 12, 3)).copy()
        if image_paths:
            from PIL import Image

            image_dir = run_dir / "images"
            image_dir.mkdir()
            paths = []
            for i, value in enumerate(shade):
                Image.fromarray(np.full((20, 16, 3), value, dtype=np.uint8)).save(image_dir / f"{i}.png")
                paths.append(f"images/{i}.png")  # relative to the run directory
            arrays["paths"] = np.array(paths)
        np.savez(run_dir / "embeddings" / "test.npz", **arrays)

    if env:
        record = {"python": "3.11.2", "torch": "2.14.1", "git_commit": "abc123", "seed": seed,
                  "command": f"dmlkit train --config {name}.yaml"}
        (run_dir / "env.json").write_text(json.dumps(record), encoding="utf-8")
    return run_dir


@pytest.fixture
def fake_run(tmp_path):
    """``fake_run(name="run", **options)`` builds a run directory under ``tmp_path``."""

    def build(name: str = "run", **options: Any) -> Path:
        return make_fake_run(tmp_path, name, **options)

    return build


class PageParser(HTMLParser):
    """Collects section ids, <img> sources, table rows and the set of tags of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.section_ids: list[str] = []
        self.image_sources: list[str] = []
        self.tags: set[str] = set()
        self.rows: list[tuple[str, list[str]]] = []  # (tr class, cell texts)
        self._row: list[str] | None = None
        self._row_class = ""
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.add(tag)
        if tag == "section" and attributes.get("id"):
            self.section_ids.append(attributes["id"])
        elif tag == "img":
            self.image_sources.append(attributes.get("src") or "")
        elif tag == "tr":
            self._row, self._row_class = [], attributes.get("class") or ""
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append((self._row_class, self._row))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse_page(text: str) -> PageParser:
    """Parse an HTML page into a :class:`PageParser`."""
    parser = PageParser()
    parser.feed(text)
    parser.close()
    return parser


def decode_png_images(sources: list[str]) -> list[Any]:
    """Decode every ``data:image/png;base64,...`` source into a loaded PIL image (fails otherwise)."""
    from PIL import Image

    prefix = "data:image/png;base64,"
    images = []
    for source in sources:
        assert source.startswith(prefix), f"image source is not an inline PNG: {source[:60]!r}"
        raw = base64.b64decode(source[len(prefix):], validate=True)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n", "decoded bytes lack the PNG signature"
        image = Image.open(io.BytesIO(raw))
        image.load()
        assert image.format == "PNG"
        images.append(image)
    return images


@pytest.fixture
def page():
    """``page(text)`` parses report HTML (see :class:`PageParser`)."""
    return parse_page


@pytest.fixture
def decode_pngs():
    """``decode_pngs(sources)`` decodes inline PNG sources into PIL images."""
    return decode_png_images


@pytest.fixture(scope="session")
def asap_report(tmp_path_factory) -> tuple[Path, str]:
    """One ASAP-style run (proxies, projections, RGB thumbnails) and its written report text."""
    from dmlkit.report import write_report

    run_dir = make_fake_run(tmp_path_factory.mktemp("asap"), "asap-run", proxies=True, projections=4,
                            thumbnails="rgb", extra_metrics={"covering_radius": 0.42})
    path = write_report(run_dir)
    return run_dir, path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def make_run():
    """The :func:`make_fake_run` function itself, for module- or session-scoped fixtures."""
    return make_fake_run
