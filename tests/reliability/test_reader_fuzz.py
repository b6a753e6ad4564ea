"""Every file reader behind one error contract.

Each reader gets a good file cut at every 10 % of its length, empty, with seeded random bit flips,
in a wrong text encoding (configs) and in another reader's format; it either reads the file (a bit
flip may leave it valid) or raises the documented error naming the file: ``DataError`` (``.npz``,
index files, images), ``ConfigError`` (configs) or ``CheckpointError`` (checkpoints). Nothing else.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.exceptions import CheckpointError, ConfigError, DataError

FLIPS = 12  # damaged copies per file, each with 1-8 flipped bits


def _npz_gallery(path: Path) -> None:
    np.savez(path, embeddings=np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32),
             labels=np.arange(20) // 4, paths=np.asarray([f"img/{i}.png" for i in range(20)]))


def _index(path: Path) -> None:
    from dmlkit.index.gallery import Index

    vectors = np.random.default_rng(1).normal(size=(30, 8)).astype(np.float32)
    Index.from_embeddings(vectors, labels=[str(i % 3) for i in range(30)], paths=[f"{i}.png" for i in range(30)]).save(path)


def _config(path: Path) -> None:
    path.write_text("# a user's config\nseed: 3\nname: café-run\noptimizer: {lr: 0.001}\n"
                    "sampler: {batch_size: 16, m: 4}\ntrain: {max_steps: 10}\n", encoding="utf-8")


def _png(path: Path) -> None:
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(path)


def _jpeg(path: Path) -> None:
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(path, quality=90)


def _checkpoint(path: Path) -> None:
    from dmlkit.engine.checkpoint_files import save_checkpoint

    save_checkpoint(path, {"format": "dmlkit-checkpoint-1", "model": {"w": torch.ones(4, 4)}, "step": 3})


def _read_gallery(path: Path):
    from dmlkit.cli.search import _load_npz

    return _load_npz(str(path))


def _read_index(path: Path):
    from dmlkit.index.gallery import Index

    return Index.load(path)


def _read_config(path: Path):
    from dmlkit.config import load_config

    return load_config(path=path)


def _read_image(path: Path):
    from dmlkit.data.base import decode_image

    return decode_image(str(path), "RGB", "fuzz")


def _read_checkpoint(path: Path):
    from dmlkit.engine.checkpoint_files import load_checkpoint

    return load_checkpoint(path)


#: reader name -> (file name, writer of a good file, reader, the error it documents)
READERS: dict[str, tuple[str, Callable[[Path], None], Callable[[Path], object], type]] = {
    "npz-gallery": ("gallery.npz", _npz_gallery, _read_gallery, DataError),
    "index": ("items.index", _index, _read_index, DataError),
    "config": ("config.yaml", _config, _read_config, ConfigError),
    "png": ("image.png", _png, _read_image, DataError),
    "jpeg": ("image.jpg", _jpeg, _read_image, DataError),
    "checkpoint": ("last.pt", _checkpoint, _read_checkpoint, CheckpointError),
}


def _damaged(data: bytes, seed: int) -> list[tuple[str, bytes]]:
    """Cuts at every 10 %, an empty file, and bit-flipped copies of ``data``."""
    out = [(f"cut at {p}0%", data[: len(data) * p // 10]) for p in range(10)]
    rng = np.random.default_rng(seed)
    for n in range(FLIPS):
        flipped = bytearray(data)
        for _ in range(int(rng.integers(1, 9))):
            bit = int(rng.integers(0, 8 * len(data)))
            flipped[bit // 8] ^= 1 << (bit % 8)
        out.append((f"bit flips #{n}", bytes(flipped)))
    return out


def _check(reader, error: type, path: Path, what: str) -> None:
    try:
        reader(path)
    except error as exc:
        # a config that reads as YAML but holds a wrong value gets the field's message (config_from_dict)
        field_problem = error is ConfigError and " must be " in str(exc) or "Unknown key" in str(exc)
        assert field_problem or path.name in str(exc), f"{what}: the message does not name the file: {exc}"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{what}: {type(exc).__name__} instead of {error.__name__}: {exc}")


@pytest.mark.parametrize("name", list(READERS))
def test_a_damaged_file_is_read_or_refused_with_the_documented_error(name, tmp_path):
    file_name, write, reader, error = READERS[name]
    good = tmp_path / "good" / file_name
    good.parent.mkdir()
    write(good)
    reader(good)  # the undamaged file reads
    data = good.read_bytes()
    for i, (what, damaged) in enumerate(_damaged(data, seed=sum(map(ord, name)))):
        path = tmp_path / f"{i}" / file_name
        path.parent.mkdir()
        path.write_bytes(damaged)
        _check(reader, error, path, f"{name}, {what}")


@pytest.mark.parametrize("name", list(READERS))
def test_another_readers_file_is_refused_with_the_documented_error(name, tmp_path):
    file_name, _, reader, error = READERS[name]
    for other, (other_file, write, _, _) in READERS.items():
        if other == name or (name, other) in (("png", "jpeg"), ("jpeg", "png")):
            continue
        source = tmp_path / other / other_file
        source.parent.mkdir()
        write(source)
        path = tmp_path / other / file_name
        path.write_bytes(source.read_bytes())
        _check(reader, error, path, f"{name} given a {other} file")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"])
def test_a_config_in_another_encoding_is_read_or_refused_with_a_config_error(encoding, tmp_path):
    text = "seed: 3\nname: café-run\n"
    path = tmp_path / "config.yaml"
    path.write_bytes(text.encode(encoding))
    _check(_read_config, ConfigError, path, encoding)


def test_a_utf16_config_with_a_byte_order_mark_reads_as_utf8_does(tmp_path):
    from dmlkit.config import load_config

    path = tmp_path / "config.yaml"
    path.write_bytes("seed: 3\nname: café-run\n".encode("utf-16"))
    cfg = load_config(path=path)
    assert (cfg.seed, cfg.name) == (3, "café-run")


def test_an_npz_header_declaring_more_than_it_holds_is_refused_before_allocating(tmp_path):
    buf = io.BytesIO()
    np.savez(buf, embeddings=np.ones((4000, 2), np.float32))
    data = buf.getvalue().replace(b"(4000, 2)", b"(9000, 9)", 1)  # the same length: only the shape lies
    path = tmp_path / "g.npz"
    path.write_bytes(data)
    with pytest.raises(DataError, match=r"g\.npz' is damaged: its array 'embeddings\.npy' declares shape \(9000, 9\)"):
        _read_gallery(path)
