"""What a new user who makes mistakes does, and what dmlkit answers (docs/reliability.md).

Every case names the numbered item of the issue it reproduces. CLI cases assert the exit code, the
message, no traceback, and that every file the user had is byte-identical afterwards. Cases about memory
run the real ``dmlkit`` in a subprocess (``python -m dmlkit``) under an address-space limit
(``RLIMIT_AS``), cases about a full disk under a file-size limit (``RLIMIT_FSIZE``, which fails writes
with ``EFBIG`` as a full disk fails them with ``ENOSPC``), and so do the two trainings started together
on one folder; the other cases run ``dmlkit.cli.main.main`` in-process (the same exit code and stderr,
without a process start).
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from PIL import Image

from dmlkit.exceptions import DataError, InvalidParameterError

from .conftest import run_dmlkit_in_process

#: A tiny run's options (8x8 digits, small CNN, 4 steps), as ``tiny_run`` in conftest.py trains it.
TINY_OVERRIDES = ["train.max_steps=4", "train.checkpoint_every=2", "train.eval_every=2", "train.progress=false",
                  "eval.clustering=false", "protocol.val_fraction=0.2", "sampler.batch_size=16", "sampler.m=4",
                  "model.embedding_size=16", "data.name=digits"]
#: One thread per subprocess (two shared cores).
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
GiB = 1 << 30
#: Address space a ``dmlkit`` process may use in the memory cases: torch, faiss and the model need
#: about 4 GiB of (mostly unreserved) virtual address space; an image or YAML bomb needs far more.
ADDRESS_SPACE = 5 * GiB


def run_limited(*args: str, cwd: Path, address_space: int | None = None, file_size: int | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m dmlkit ARGS`` under optional ``RLIMIT_AS`` / ``RLIMIT_FSIZE`` limits."""

    def limits() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return subprocess.run([sys.executable, "-m", "dmlkit", *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV, cwd=cwd, preexec_fn=limits)


def run_dmlkit(*args: str, cwd: Path, address_space: int | None = None, file_size: int | None = None) -> subprocess.CompletedProcess:
    """A subprocess under :func:`run_limited` where a limit is asked for (limits apply to a whole process),
    else ``dmlkit`` in-process (:func:`run_dmlkit_in_process`)."""
    if address_space is None and file_size is None:
        return run_dmlkit_in_process(*args, cwd=cwd)
    return run_limited(*args, cwd=cwd, address_space=address_space, file_size=file_size)


# ----------------------------------------------------------------------------- fixtures


def write_png(path: Path, seed: int = 0, size: tuple[int, int] = (12, 12), mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
    Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode).save(path)
    return path


@pytest.fixture(scope="session")
def photo_run(tmp_path_factory) -> Path:
    """A finished run on noise photos read as their centre-crop view (shorter side 329 px, crop 288)."""
    from dmlkit.config import load_config
    from dmlkit.recipe import Trainer

    root = tmp_path_factory.mktemp("photos")
    for c in range(8):
        for k in range(4):
            write_png(root / "imgs" / f"c{c}" / f"{k}.png", seed=10 * c + k, size=(20, 16))
    overrides = ["data.name=folder", f"data.root={root / 'imgs'}", "data.image_size=288", "data.crop_size=256",
                 "model.name=small_cnn", "model.ensemble=1", "model.shift_average=0", "model.embedding_size=8",
                 "train.max_steps=1", "train.progress=false", "eval.clustering=false", "sampler.batch_size=8",
                 "sampler.m=2"]
    run_dir = root / "run"
    Trainer(load_config(overrides=overrides), run_dir, echo=lambda _: None).fit()
    return run_dir


@pytest.fixture(scope="session")
def digit_index(tiny_run, tmp_path_factory) -> Path:
    """An index over eight 8x8 grey images embedded by :func:`tiny_run`."""
    from dmlkit.index.gallery import Index
    from dmlkit.inference import RunEmbedder

    root = tmp_path_factory.mktemp("index")
    paths = [str(write_png(root / "g" / f"d{i % 2}" / f"{i}.png", seed=i, size=(8, 8), mode="L")) for i in range(8)]
    index = Index.build(RunEmbedder.from_run(tiny_run), paths, labels=[f"d{i % 2}" for i in range(8)])
    return index.save(root / "digits.index")


# ----------------------------------------------------------------------------- the table


@dataclass
class Ctx:
    tmp: Path
    get_run: Callable[[], Path]
    fixtures: Callable[[str], object]

    @property
    def run(self) -> Path:
        return self.get_run()

    @property
    def photo_run(self) -> Path:
        return self.fixtures("photo_run")

    def index_copy(self) -> Path:
        target = self.tmp / "digits.index"
        if not target.exists():
            target.write_bytes(Path(self.fixtures("digit_index")).read_bytes())
        return target


@dataclass
class Cli:
    """``dmlkit <args(ctx)>`` (in ``cwd(ctx)``) exits with ``code``, ``match`` on stderr, no traceback, and
    leaves every file under ``protect(ctx)`` byte-identical."""

    item: int
    args: Callable[[Ctx], list[str]]
    match: str
    protect: Callable[[Ctx], Path] = lambda c: c.tmp
    cwd: Callable[[Ctx], Path] = lambda c: c.tmp
    address_space: int | None = None
    file_size: int | None = None
    max_stderr: int = 5000
    also: Callable[[Ctx, subprocess.CompletedProcess], None] = field(default=lambda c, p: None)
    code: int = 2


def _set(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


TINY = [a for o in TINY_OVERRIDES for a in ("--set", o)]


def _file(path: Path, data: bytes | str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def _npz(path: Path, **arrays) -> str:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return _file(path, buf.getvalue())


def _alias_bomb(path: Path) -> str:
    """324 bytes of YAML whose aliases expand to 9**9 strings (the issue's 8 levels)."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(8):
        prev, name = chr(ord("a") + level), chr(ord("b") + level)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    lines.append("name: *i")
    return _file(path, "\n".join(lines) + "\n")


def _user_folder(root: Path) -> Path:
    _file(root / "notes.txt", "my notes\n")
    _file(root / "config.yaml", "# my own config, with comments\ntrain: {max_steps: 2}\n")
    _file(root / "checkpoints" / "best.pt", b"my own weights")
    return root


def _without_last_checkpoint(run: Path) -> Path:
    (run / "checkpoints" / "last.pt").unlink()
    return run


def _edited_index(c: Ctx, **changes) -> str:
    """A copy of the digit index with arrays replaced (``header`` given as a dict)."""
    from dmlkit.data._files import read_npz

    data = read_npz(c.index_copy())
    for key, value in changes.items():
        data[key] = np.asarray(json.dumps(value)) if key == "header" else value
    return _npz(c.tmp / "edited.index", **data)


def _header_without_params(c: Ctx) -> dict:
    from dmlkit.data._files import read_npz

    header = json.loads(str(read_npz(c.index_copy())["header"]))
    header.pop("params")
    return header


def _truncated(path: Path, fraction: float = 0.5) -> str:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    return str(path)


def _no_tmp_left(c: Ctx, proc) -> None:
    left = [str(p) for p in c.tmp.rglob("*.tmp")]
    assert not left, f"temporary files left behind: {left}"


def _stderr_is_short(limit: int):
    def check(c: Ctx, proc) -> None:
        assert len(proc.stderr) < limit, f"{len(proc.stderr)} characters of error message"
    return check


def _gallery(c: Ctx, **arrays) -> str:
    return _npz(c.tmp / "gallery.npz", **arrays)


def _query(c: Ctx) -> str:
    return _npz(c.tmp / "q.npz", embeddings=np.ones((1, 4), np.float32))


def _search(c: Ctx, gallery: str) -> list[str]:
    return ["search", "--gallery", gallery, "--query-embeddings", _query(c)]


CASES: dict[str, Cli] = {
    # --- denial of service ---------------------------------------------------------------------
    "search-a-60000x1-png-with-a-photo-run": Cli(
        1, lambda c: ["search", "--gallery", _gallery(c, embeddings=np.ones((2, 8), np.float32)), "--run",
                      str(c.photo_run), str(write_png(c.tmp / "strip.png", size=(60000, 1), mode="L"))],
        r"strip\.png' is 60000 x 1 px \(aspect ratio 60000:1\): scaling its shorter side to 329 px would make",
        address_space=ADDRESS_SPACE),
    "validate-a-yaml-alias-bomb": Cli(
        2, lambda c: ["validate", "--config", _alias_bomb(c.tmp / "bomb.yaml")],
        r"found the alias \*a; aliases are not allowed in a dmlkit config", address_space=ADDRESS_SPACE,
        max_stderr=1000),
    "a-huge-value-is-quoted-by-a-short-prefix": Cli(
        2, lambda c: ["validate", "--config", _file(c.tmp / "big.yaml", f"name: {list(range(100000))}\n")],
        r"name must be str\. Got \[0, 1, 2, 3, 4, 5, \.\.\.\] \(list\)", max_stderr=300),
    # --- data loss -------------------------------------------------------------------------------
    "train-into-a-folder-of-the-users-files": Cli(
        3, lambda c: ["train", "--out", str(_user_folder(c.tmp / "mine")), *TINY],
        r"--out '.*mine' is not empty and is not a dmlkit train run: it holds checkpoints/, config\.yaml, notes\.txt"),
    "train-out-dot-next-to-the-users-config": Cli(
        4, lambda c: ["train", "--config", "config.yaml", "--out", ".", *TINY],
        r"--out '\.' is not empty and is not a dmlkit train run: it holds .*config\.yaml",
        cwd=lambda c: _user_folder(c.tmp / "proj")),
    "train-over-a-finished-run-whose-last-checkpoint-was-deleted": Cli(
        5, lambda c: ["train", "--out", str(_without_last_checkpoint(c.run)), *TINY],
        r"already holds a run; use --resume .* or choose another --out", protect=lambda c: c.run),
    "sweep-onto-a-training-run": Cli(
        7, lambda c: ["sweep", "--out", str(c.run), "--param", "optimizer.lr=float:0.001:0.01", "--trials", "1"],
        r"--out '.*run' is not empty and is not a dmlkit sweep run", protect=lambda c: c.run),
    # --- silent wrong answers --------------------------------------------------------------------
    "validate-an-unknown-model-name": Cli(
        10, lambda c: ["validate", *_set("model.name=nonexistent_model_xyz")],
        r"model\.name: Unknown model 'nonexistent_model_xyz'"),
    "index-query-with-a-nan-alpha": Cli(
        13, lambda c: ["index", "query", str(c.index_copy()), str(write_png(c.tmp / "q.png", size=(8, 8), mode="L")),
                       "--query-expansion", "2", "--alpha", "nan"],
        r"The 'alpha' parameter of Index\.query must be a float >= 0\. Got nan"),
    "resume-with-a-seed": Cli(
        14, lambda c: ["train", "--resume", str(c.run), "--seed", "5"],
        r"--resume continues the run in .* with its own seed and folder; --seed cannot be combined",
        protect=lambda c: c.run),
    "resume-with-another-out": Cli(
        14, lambda c: ["train", "--resume", str(c.run), "--out", str(c.tmp / "other")],
        r"--out cannot be combined with it",
        also=lambda c, p: None if not (c.tmp / "other").exists() else pytest.fail("--out folder was created")),
    # --- tracebacks instead of a message ---------------------------------------------------------
    "validate-a-seed-beyond-a-c-int": Cli(
        15, lambda c: ["validate", *_set("seed=2147483648")],
        r"seed must be an int in the range \[0, 2147483647\]\. Got 2147483648"),
    "search-an-empty-gallery-file": Cli(
        16, lambda c: _search(c, _file(c.tmp / "gallery.npz", b"")), r"gallery\.npz' is empty \(0 bytes\)"),
    "search-a-half-copied-gallery-file": Cli(
        16, lambda c: _search(c, _truncated(Path(_gallery(c, embeddings=np.ones((50, 4), np.float32))))),
        r"gallery\.npz' is not a readable \.npz file \(truncated or corrupted\?\)"),
    "query-a-half-copied-index": Cli(
        16, lambda c: ["index", "query", _truncated(c.index_copy()), str(write_png(c.tmp / "q.png", mode="L"))],
        r"index file '.*digits\.index' is not a readable \.npz file"),
    "query-an-index-whose-ids-are-shorter-than-its-vectors": Cli(
        16, lambda c: ["index", "query", _edited_index(c, ids=np.arange(7)), str(write_png(c.tmp / "q.png", mode="L"))],
        r"is damaged: its arrays do not describe the same items \(ids 7, paths 8"),
    "query-an-index-whose-header-has-no-params": Cli(
        16, lambda c: ["index", "query", _edited_index(c, header=_header_without_params(c)),
                       str(write_png(c.tmp / "q.png", mode="L"))],
        r"edited\.index' has a damaged header \(KeyError"),
    "validate-a-latin-1-config": Cli(
        17, lambda c: ["validate", "--config", _file(c.tmp / "c.yaml", "seed: 1\nname: caf\xe9\n".encode("latin-1"))],
        r"c\.yaml' is not utf-8 text \(byte 17 is b'\\xe9'\); save it as UTF-8"),
    "disk-full-while-training": Cli(
        18, lambda c: ["train", "--out", str(c.tmp / "full"), "--quiet", "--no-report", *TINY],
        r"cannot write '.*full/checkpoints/\w+\.pt': file-size limit reached \(\d[\d,]* bytes needed, .*Nothing was "
        r"lost", file_size=100_000),
    "disk-full-while-adding-to-an-index": Cli(
        18, lambda c: ["index", "add", str(c.index_copy()), "--images",
                       str(write_png(c.tmp / "more" / "d0" / "new.png", size=(8, 8), mode="L").parent.parent)],
        r"cannot write '.*digits\.index': file-size limit reached",
        file_size=0),  # set per case below: the index's own size
    "train-out-naming-a-file": Cli(
        19, lambda c: ["train", "--out", _file(c.tmp / "notes.txt", "mine\n"), *TINY],
        r"--out '.*notes\.txt' is a file, not a folder"),
    "index-build-out-naming-a-folder": Cli(
        19, lambda c: ["index", "build", str(c.run), "--images", str(write_png(c.tmp / "g" / "a.png", mode="L")),
                       "--out", str((c.tmp / "folder").mkdir() or c.tmp / "folder")],
        r"--out '.*folder' is a folder; --out names the file to write", protect=lambda c: c.run),
    "compare-out-naming-a-folder": Cli(
        19, lambda c: ["compare", str(c.run), "--out", str((c.tmp / "folder").mkdir() or c.tmp / "folder")],
        r"--out '.*folder' is a folder", protect=lambda c: c.run),
    "export-out-naming-a-folder": Cli(
        19, lambda c: ["export", str(c.run), "--out", str((c.tmp / "folder").mkdir() or c.tmp / "folder")],
        r"--out '.*folder' is a folder", also=_no_tmp_left),
    "export-over-a-file-it-did-not-write": Cli(
        19, lambda c: ["export", str(c.run), "--out", _file(c.tmp / "model.pt", b"my model")],
        r"--out '.*model\.pt' already exists and is not a model written by `dmlkit export`", also=_no_tmp_left),
    "gallery-with-fewer-labels-than-embeddings": Cli(
        20, lambda c: _search(c, _gallery(c, embeddings=np.ones((10, 4), np.float32), labels=np.arange(3))),
        r"'embeddings' has 10 rows but 'labels' has shape \(3,\)"),
    "gallery-with-more-labels-than-embeddings": Cli(
        20, lambda c: _search(c, _gallery(c, embeddings=np.ones((3, 4), np.float32), labels=np.arange(10))),
        r"'embeddings' has 3 rows but 'labels' has shape \(10,\)"),
    "gallery-with-string-labels": Cli(
        20, lambda c: _search(c, _gallery(c, embeddings=np.ones((3, 4), np.float32), labels=np.array(["a", "b", "c"]))),
        r"'labels' must hold integer class ids\. Got dtype <U1"),
    "gallery-with-1d-embeddings": Cli(
        20, lambda c: _search(c, _gallery(c, embeddings=np.ones(4, np.float32))),
        r"'embeddings' must be a non-empty \[N, D\] array of numbers\. Got shape \(4,\)"),
}


@pytest.mark.parametrize("case_id", list(CASES))
def test_a_mistake_gets_a_message_and_keeps_every_file(case_id, tmp_path, request, snap):
    case = CASES[case_id]
    holder: list[Path] = []

    def get_run() -> Path:
        if not holder:
            holder.append(request.getfixturevalue("run_copy"))
        return holder[0]

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ctx = Ctx(scratch, get_run, request.getfixturevalue)
    args = case.args(ctx)  # creates the user's files: they are the "before" state
    file_size = case.file_size
    if case_id == "disk-full-while-adding-to-an-index":
        file_size = ctx.index_copy().stat().st_size  # the index may not grow: adding must fail
    protected = case.protect(ctx)
    before = snap(protected)
    proc = run_dmlkit(*args, cwd=case.cwd(ctx), address_space=case.address_space, file_size=file_size)
    assert proc.returncode == case.code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(case.match, proc.stderr), proc.stderr[-3000:]
    assert len(proc.stderr) < case.max_stderr, f"{len(proc.stderr)} characters on stderr"
    after = snap(protected)
    assert after.keys() >= before.keys(), f"files removed: {sorted(before.keys() - after.keys())}"
    changed = [k for k in before if before[k] != after[k]]
    assert not changed, f"files changed: {changed}"
    case.also(ctx, proc)


def test_every_numbered_item_of_the_issue_has_a_case():
    covered = {case.item for case in CASES.values()} | {6, 8, 9, 11, 12, 14}  # the rest: tests below
    assert covered == set(range(1, 21))


# ----------------------------------------------------------------------------- CLI cases that succeed


def test_two_trainings_with_one_out_never_mix_their_files(tmp_path):
    """Item 6: two trainings started together on one --out: one trains, the other is refused."""
    procs = [subprocess.Popen([sys.executable, "-m", "dmlkit", "train", "--out", "run", "--quiet", "--no-report",
                               *TINY, "--seed", str(seed)], cwd=tmp_path, env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert re.search(r"is being written by another dmlkit process|already holds a run", refused), refused
    assert "Traceback" not in refused
    winner = next(seed for (code, _), seed in zip(results, (1, 2)) if code == 0)
    assert f"seed: {winner}\n" in (tmp_path / "run" / "config.yaml").read_text()
    proc = run_dmlkit("evaluate", "run", cwd=tmp_path)  # the checkpoint belongs to the config beside it
    assert proc.returncode == 0, proc.stderr


def test_validate_checks_the_preset_train_runs(tmp_path):
    """Item 10: without --preset, validate resolves what train resolves (the mnist-proxy-anchor preset)."""
    bare = run_dmlkit("validate", "--print", cwd=tmp_path)
    preset = run_dmlkit("validate", "--preset", "mnist-proxy-anchor", "--print", cwd=tmp_path)
    assert bare.returncode == preset.returncode == 0, bare.stderr + preset.stderr
    assert bare.stdout == preset.stdout
    assert "name: mnist-proxy-anchor" in bare.stdout


def test_a_utf16_config_with_its_byte_order_mark_is_read(tmp_path):
    """Item 17: UTF-16 with a byte-order mark (what Windows editors write) is a readable config."""
    (tmp_path / "c.yaml").write_bytes("seed: 3\n".encode("utf-16"))
    proc = run_dmlkit("validate", "--config", "c.yaml", "--print", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "\nseed: 3\n" in proc.stdout


def test_a_run_name_with_a_slash_makes_one_folder(tmp_path):
    """Item 19: --set name=exp/one without --out trains into runs/<timestamp>-exp-one."""
    proc = run_dmlkit("train", "--quiet", "--no-report", *TINY, *_set("name=exp/one", "train.max_steps=1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-exp-one") and (run / "metrics.json").is_file()


def test_a_run_claimed_by_train_is_resumed_and_refused_to_others(tmp_path, snap):
    """Items 3-7: the claim marks the folder as a train run: --resume continues it, sweep is refused."""
    first = run_dmlkit("train", "--out", "run", "--quiet", "--no-report", *TINY, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads((tmp_path / "run" / ".dmlkit-claim.json").read_text())["kind"] == "train"
    before = snap(tmp_path / "run")
    sweep = run_dmlkit("sweep", "--out", "run", "--param", "optimizer.lr=float:0.001:0.01", "--trials", "1",
                       cwd=tmp_path)
    assert sweep.returncode == 2 and "holds a train folder, not a sweep run" in sweep.stderr, sweep.stderr
    assert snap(tmp_path / "run") == before
    again = run_dmlkit("train", "--resume", "run", "--quiet", "--no-report", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]


# ----------------------------------------------------------------------------- API cases


def test_images_are_read_as_their_pixels_say(tmp_path):
    """Item 8: 16-bit grey images are scaled to 8 bits, not clipped to white; item 14: EXIF orientation applied."""
    from dmlkit.data.base import load_image

    arrays = []
    for seed in range(5):
        pixels = np.random.default_rng(seed).integers(0, 65536, size=(6, 7), dtype=np.uint16)
        Image.fromarray(pixels).save(tmp_path / f"{seed}.png")
        image = load_image(str(tmp_path / f"{seed}.png")).convert("RGB")
        arrays.append(np.asarray(image)[..., 0].astype(np.int64))
        assert np.abs(arrays[-1] - np.rint(pixels / 257)).max() == 0
    assert all(not np.array_equal(arrays[0], a) for a in arrays[1:])

    upright = np.zeros((10, 30, 3), np.uint8)
    upright[:, :5] = 255  # a white band on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: the viewer turns it 90 degrees clockwise
    Image.fromarray(upright).save(tmp_path / "rotated.jpg", exif=exif.tobytes(), quality=95)
    image = load_image(str(tmp_path / "rotated.jpg"))
    assert image.size == (10, 30)  # width x height after the rotation EXIF asks for
    top = np.asarray(image)[:5].mean()
    assert top > 200  # the band is on top once turned clockwise


def test_an_image_whose_view_would_be_huge_is_refused_before_decoding(tmp_path):
    """Item 1 (API): the budget is checked against the view's size, from the header."""
    from dmlkit.data.base import check_image_budget, load_image

    check_image_budget(4000, 3000, "photo.jpg", view_side=329)  # an ordinary photo passes
    with pytest.raises(DataError, match=r"aspect ratio 10000:1\): scaling its shorter side to 329 px"):
        check_image_budget(20000, 2, "strip.png", view_side=329)
    path = write_png(tmp_path / "strip.png", size=(20000, 2), mode="L")
    with pytest.raises(DataError, match=r"refused before decoding"):
        load_image(str(path))


def test_embed_refuses_paths_with_a_line_break_in_the_text_sidecar(tmp_path):
    """Item 11: FILE.paths.txt holds one path per line; a file name with a newline would shift every row."""
    from dmlkit.cli.embed import write_embeddings

    paths = [f"img/{i}.png" for i in range(10)]
    paths[3] = "img/two\nlines.png"
    with pytest.raises(DataError, match=r"holds a line break.* write \.npz or \.parquet instead"):
        write_embeddings(tmp_path / "e.npy", np.zeros((10, 2)), np.arange(10), paths)
    assert list(tmp_path.iterdir()) == []  # nothing written
    (out,) = write_embeddings(tmp_path / "e.npz", np.zeros((10, 2)), np.arange(10), paths)
    with np.load(out) as z:
        assert z["paths"].tolist() == paths  # .npz keeps each path as one value: rows stay aligned


def test_the_recipe_reads_a_true_median_and_warns_without_positive_pairs():
    """Item 12: classes of 1, 1, 5, 5 images have median 3 (torch.median said 1, so m was 1)."""
    from dmlkit.config import load_config
    from dmlkit.recipe.planner import _warn_without_positive_pairs
    from dmlkit.recipe.rules import median_count

    assert median_count(torch.tensor([1, 1, 5, 5])) == 3
    assert median_count(torch.tensor([1, 1, 2, 2])) == 2
    assert median_count(torch.tensor([1, 2, 9])) == 2
    pair = load_config(overrides=["loss.name=contrastive", "sampler.m=1", "sampler.batch_size=8"])
    with pytest.warns(UserWarning, match=r"sampler\.m=1 .* 'contrastive' sees no positive pair"):
        _warn_without_positive_pairs(pair)
    proxy = load_config(overrides=["loss.name=proxy_anchor", "sampler.m=1", "sampler.batch_size=8"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _warn_without_positive_pairs(proxy)  # proxies need no pair of samples


def test_values_that_cannot_apply_are_refused():
    """Items 13 and 14: a NaN re-ranking weight; ProxyAnchorLoss(alpha=inf) (its loss would be NaN)."""
    from dmlkit.index.gallery import Index
    from dmlkit.losses import ProxyAnchorLoss

    index = Index.from_embeddings(np.eye(4, dtype=np.float32))
    with pytest.raises(InvalidParameterError, match=r"'alpha' parameter of Index\.query"):
        index.query_embeddings(np.ones((1, 4), np.float32), 2, query_expansion=2, alpha=float("nan"))
    with pytest.raises(InvalidParameterError, match=r"'alpha' parameter of ProxyAnchorLoss .* Got inf"):
        ProxyAnchorLoss(num_classes=3, embedding_size=4, alpha=float("inf"))


def test_a_threshold_at_a_false_match_rate_the_pairs_cannot_measure_warns():
    """What to build: too few impostor pairs for the asked false match rate."""
    from dmlkit.evaluation.verification import threshold_at_fmr

    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"false match rate of 0\.001 needs at least 1000 impostor pairs"):
        threshold_at_fmr(x, torch.tensor([0, 0, 1, 1, 2, 2]), 1e-3)


def test_a_claimed_folder_is_locked_against_another_process(tmp_path):
    """Item 6: the claim holds an fcntl lock for the life of the process; a second claimant is refused."""
    from dmlkit.engine.run_dir import claim_directory

    code = ("import sys, time; from dmlkit.engine.run_dir import claim_directory; "
            "claim_directory(sys.argv[1], 'train'); print('claimed', flush=True); time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run")], stdout=subprocess.PIPE,
                              text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        from dmlkit.exceptions import ConfigError

        with pytest.raises(ConfigError, match=r"is being written by another dmlkit process"):
            claim_directory(tmp_path / "run", "train", resume=True)
    finally:
        holder.kill()
        holder.wait()
    assert not os.path.exists(tmp_path / "run" / "config.yaml")
