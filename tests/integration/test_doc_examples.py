"""Every ``dmlkit ...`` command in a fenced code block of README.md and docs/**/*.md runs, shortened.

Pages are found by glob, so a new page's examples run without touching this file. Commands are
the lines of fenced blocks (any language, the ``--help`` text of docs/cli included) that start
with ``dmlkit `` (after an optional ``$ `` prompt or ``.venv/bin/``); a trailing ``\\`` joins the
next line and ``#`` starts a comment. They run in one temporary directory, in page order except
that a command runs after the commands whose ``--out`` it names (``runs/ms`` is trained before the
pages that evaluate, embed, export or report it), in-process through ``dmlkit.cli.main.main``.

Shortened form: ``train`` (except ``--resume``: its saved config is capped already), ``crossval``
and ``sweep`` get :data:`CAP` appended (2 steps, one model, no clustering, one thread) and, unless they name
their own data, :data:`SMALL_DATA`; ``--seeds`` keeps its
first seed, ``--trials`` becomes 2 and ``crossval`` runs fold 0 only. The commands that name the Pets
folder (``../shared/data/pets/images``: 37 breeds x 10 photos, every photo embedded at 224+ px by each
``train`` evaluation and each ``index build``) read :func:`small_pets` instead: the first
:data:`PETS_BREEDS` breeds with :data:`PETS_PHOTOS` photos each, same folder layout and file names (the
queried ``Abyssinian/Abyssinian_12.jpg`` among them). Files the examples read but no example writes are
made by :data:`FIXTURES`.

Python: a ```` ```python ```` block whose fence is preceded by the line ``<!-- runs in CI -->`` runs
as written (``../shared/`` made absolute), in a temporary directory; the blocks of one page share
one namespace, in page order (docs/python-api.md: its complete example).

A user's own folder of images (``path/to/images``, one sub-folder per class) is the same small copy of the
Pets folder. Shell lines of README.md that are not ``dmlkit`` commands (installing, ``make``) do not run here;
each is listed with its reason in :data:`README_NOT_RUN`, and a new one fails the test until it is.

``dmlkit push`` uploads to a stand-in Hub, a folder of the test's directory (``local_hub``).

Opting out: a block whose fence is preceded by the line ``<!-- not run in CI: REASON -->`` is
skipped. Only for what cannot run on a CI machine (benchmark images, a GPU); every marker must
give a reason and the list of markers is checked below (:data:`KNOWN_OPT_OUTS`).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<marker><!-- not run in CI: (?P<reason>[^>]*?) -->\n)?```[^\n]*\n(?P<body>.*?)^```", re.S | re.M)
COMMAND = re.compile(r"^\s*(?:\$ )?(?:\.venv/bin/)?dmlkit\s")

#: Appended to every training command: two steps, one model, no clustering, one torch thread (the cpu-*
#: presets ask for 2; the commands run in the test process, which stays slower after a 2-thread run).
CAP = ["--set", "train.max_steps=2", "--set", "train.eval_every=1", "--set", "model.ensemble=1",
       "--set", "model.shift_average=0", "--set", "eval.clustering=false", "--set", "train.num_threads=1"]

#: Appended unless the command names its own data: sklearn's digits (1,797 8x8 images, embedded) for the
#: embedded MNIST-5k, whose 500-image test classes make exact MAP@R the slowest part of a 2-step run.
SMALL_DATA = ["--set", "data.name=digits"]

#: Why each opted-out block cannot run here (the test fails when a marker is added without a row).
KNOWN_OPT_OUTS = {
    "needs a CUDA GPU",
    "continues the GPU run above",
    "needs the CUB-200-2011 images",
    "needs the Stanford Online Products images",
    "needs the internet or the benchmark images",
    "needs a Hugging Face account and the internet",
}


#: Why a block holding no ``dmlkit`` command (Python, other shell lines) is not run; every such block of
#: README.md and docs/ runs (``runs in CI``) or carries one of these or of :data:`KNOWN_OPT_OUTS`.
SNIPPET_REASONS = {
    "a template to fill in, not a complete program",
    "a fragment: its variables come from the reader's own loop",
    "a fragment: the Pets run and query photos of the commands above",
    "a benchmark: minutes of timing on a quiet machine",
    "needs several processes or machines (torchrun)",
    "runs in tests/integration/test_cluster_embed.py on a local Ray instance",
    "needs Spark and a Java runtime, which dmlkit does not install",
    "downloads wheels from the internet",
    "needs PML's own test suite checked out",
    "needs a Hugging Face account and the internet",
}

#: Pages whose Python blocks are being reworked with ``dmlkit.fit``'s accepted forms (checked once they are).
SNIPPETS_PENDING = {"docs/python-api.md"}


@dataclass
class Example:
    page: str
    line: str
    argv: list[str]
    skipped: str | None = None


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples() -> list[Example]:
    """Every ``dmlkit`` command of every fenced block, in page order."""
    found = []
    for page in pages():
        for block in FENCE.finditer(page.read_text()):
            lines = block["body"].replace("\\\n", " ").splitlines()
            for line in lines:
                if COMMAND.match(line):
                    argv = shlex.split(line, comments=True)
                    argv = argv[argv.index("dmlkit") + 1 if "dmlkit" in argv else 1:]
                    found.append(Example(str(page.relative_to(ROOT)), line.strip(), argv, block["reason"]))
    return found


#: The line before a Python block that the documented-examples test runs.
RUNS_IN_CI = "<!-- runs in CI -->"
PYTHON_BLOCK = re.compile(r"^" + re.escape(RUNS_IN_CI) + r"\n```python\n(?P<body>.*?)^```", re.S | re.M)


def python_examples() -> dict[str, list[str]]:
    """``{page: [code, ...]}``: the Python blocks marked to run, in page order."""
    found = {}
    for page in pages():
        blocks = [m["body"] for m in PYTHON_BLOCK.finditer(page.read_text())]
        if blocks:
            found[str(page.relative_to(ROOT))] = blocks
    return found


def _outputs(argv: list[str]) -> set[str]:
    return {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--out", "--to")}  # a file, or a database URI


def in_dependency_order(items: list[Example]) -> list[Example]:
    """Page order, except that a command follows every command whose ``--out`` (or fixture source) it names."""
    producers = {out: i for i, ex in enumerate(items) for out in _outputs(ex.argv)}
    for name, (source, _) in FIXTURES.items():
        if source in producers:
            producers.setdefault(name, producers[source])
    done: list[int] = []

    def visit(i: int, stack: tuple[int, ...] = ()) -> None:
        if i in done or i in stack:
            return
        for token in items[i].argv:
            j = producers.get(token)
            if j is not None and j != i:
                visit(j, stack + (i,))
        done.append(i)

    for i in range(len(items)):
        visit(i)
    return [items[i] for i in done]


def shorten(argv: list[str]) -> list[str]:
    """The CI form of a command (see the module docstring)."""
    out = list(argv)
    if "--seeds" in out:
        i = out.index("--seeds") + 1
        j = i + 1
        while j < len(out) and not out[j].startswith("-"):
            j += 1
        out[i:j] = out[i:i + 1]
    if "--trials" in out:
        out[out.index("--trials") + 1] = "2"
    if out[0] == "crossval" and "--folds" not in out:
        out += ["--folds", "0"]
    if out[0] in ("train", "crossval", "sweep") and "--resume" not in out and "--plan" not in out:
        own_data = any(a.startswith(("data.name=", "data.root=")) for a in out)
        out += CAP + ([] if own_data else SMALL_DATA) + (["--quiet"] if out[0] in ("train", "crossval") else [])
    return out


def _copy(source: str):
    def make(workdir: Path, name: str) -> None:
        src = workdir / source
        if src.exists():  # otherwise the example that wrote it failed, and is reported
            (shutil.copytree if src.is_dir() else shutil.copy)(src, workdir / name)
    return make


def _digit_png(workdir: Path, name: str) -> None:
    pixels = np.zeros((28, 28), dtype=np.uint8)
    pixels[6:22, 12:16] = 255  # a "1"
    Image.fromarray(pixels, mode="L").save(workdir / name)


#: Inputs the examples read but no example writes: ``{file: (what it is made from, maker)}``.
FIXTURES = {
    "queries.npz": ("test.npz", _copy("test.npz")),
    "gallery.npz": ("test.npz", _copy("test.npz")),
    "runs/pa": ("runs/ms", _copy("runs/ms")),
    "query1.png": ("", _digit_png),
    "query2.png": ("", _digit_png),
}


#: The Pets folder the docs name, and the part of it the shortened commands read (see :func:`small_pets`).
PETS = "../shared/data/pets/images"
PETS_BREEDS = 8
PETS_PHOTOS = 4


#: The placeholder of a user's own image folder in README.md and the docs; the small Pets copy stands in.
OWN_IMAGES = "path/to/images"

#: README.md's shell lines that are not ``dmlkit`` commands, and why this test does not run them.
README_NOT_RUN = {
    "pip install .": "what `make env` runs (as `pip install -e '.[test]'`) before this test",
    'pip install ".[hub,onnx]"': "the extras are in `.[test]`, which `make env` installs before this test",
    "make train": "the default job itself, run by CI's own `make train`",
    "make test": "runs this test",
}


def small_pets(workdir: Path) -> Path:
    """``workdir/pets``: a copy of the first :data:`PETS_BREEDS` breeds of the Pets folder (sorted),
    :data:`PETS_PHOTOS` photos each (sorted names; Abyssinian's include ``Abyssinian_12.jpg``)."""
    small = workdir / "pets"
    if not small.exists():
        source = ROOT.parent / PETS.removeprefix("../")
        for breed in sorted(p for p in source.iterdir() if p.is_dir())[:PETS_BREEDS]:
            (small / breed.name).mkdir(parents=True)
            for photo in sorted(breed.glob("*.jpg"))[:PETS_PHOTOS]:
                shutil.copy(photo, small / breed.name / photo.name)
    return small


def run_example(argv: list[str], workdir: Path) -> tuple[int, str]:
    from dmlkit.cli.main import main

    if any(PETS in token or OWN_IMAGES in token for token in argv):
        small = str(small_pets(workdir))
        argv = [token.replace(PETS, small).replace(OWN_IMAGES, small) for token in argv]
    # the docs name the shared data as seen from the repository root; the examples run elsewhere
    argv = [token.replace("../shared/", f"{ROOT.parent / 'shared'}/") for token in argv]

    for token in argv:
        if token in FIXTURES and not (workdir / token).exists():
            FIXTURES[token][1](workdir, token)
    out = io.StringIO()
    threads = torch.get_num_threads()  # a preset may set train.num_threads for the whole process
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code
        finally:
            torch.set_num_threads(threads)
    return int(code or 0), out.getvalue()


def test_the_examples_are_found():
    found = examples()
    lines = [ex.line for ex in found]
    assert any("--out runs/ms" in line and line.startswith("dmlkit train") for line in lines)
    assert any(line.startswith("dmlkit evaluate runs/ms") for line in lines)
    assert sum(ex.skipped is None for ex in found) >= 15
    reasons = {ex.skipped for ex in found if ex.skipped}
    assert reasons <= KNOWN_OPT_OUTS, f"opt-outs without a known reason: {reasons - KNOWN_OPT_OUTS}"
    assert sum(ex.skipped is not None for ex in found) <= 8, "opt-outs are for what cannot run here only"


def readme_shell_lines() -> list[str]:
    """README.md's lines of shell blocks that are not ``dmlkit`` commands (comments dropped)."""
    lines = []
    for block in FENCE.finditer((ROOT / "README.md").read_text()):
        if not block.group(0).startswith(("```bash", "```sh")):
            continue
        for line in block["body"].replace("\\\n", " ").splitlines():
            command = line.split("#", 1)[0].strip()
            if command and not COMMAND.match(command):
                lines.append(command)
    return lines


def test_readme_shell_lines_run_or_say_why_not():
    lines = readme_shell_lines()
    assert "make test" in lines and any(line.startswith("pip install") for line in lines)
    unexplained = [line for line in lines if line not in README_NOT_RUN]
    assert not unexplained, f"README.md shell lines neither run by this test nor in README_NOT_RUN: {unexplained}"
    readme = (ROOT / "README.md").read_text()
    assert "../shared/" not in readme, "README examples must use paths a user has (path/to/images)"
    assert RUNS_IN_CI + "\n```python" in readme, "README's Python example must run in CI"


def unexplained_snippets() -> list[str]:
    """Blocks of README.md and docs/ (the generated docs/cli pages aside) that neither run nor say why.

    A Python block runs when marked ``runs in CI``; a shell block runs when its lines are ``dmlkit``
    commands (README's other lines: :data:`README_NOT_RUN`); any other needs a ``not run in CI`` marker
    whose reason is listed here."""
    found = []
    for page in pages():
        name = str(page.relative_to(ROOT))
        if name.startswith("docs/cli/") or name in SNIPPETS_PENDING:
            continue
        text = page.read_text()
        for block in re.finditer(r"^(?P<before>[^\n]*)\n```(?P<lang>\w*)\n(?P<body>.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, block.start()) + 2
            marker = re.fullmatch(r"<!-- not run in CI: (?P<reason>[^>]*?) -->", block["before"])
            if marker:
                if marker["reason"] not in SNIPPET_REASONS | KNOWN_OPT_OUTS:
                    found.append(f"{name}:{line}: reason not listed: {marker['reason']}")
                continue
            if block["lang"] == "python":
                if block["before"] != RUNS_IN_CI:
                    found.append(f"{name}:{line}: Python block neither runs in CI nor says why not")
            elif block["lang"] in ("bash", "sh"):
                for command in block["body"].replace("\\\n", " ").splitlines():
                    command = command.split("#", 1)[0].strip()
                    if command and not COMMAND.match(command) and not (name == "README.md" and command in README_NOT_RUN):
                        found.append(f"{name}:{line}: shell line not run here: {command}")
    return found


def test_every_snippet_runs_or_says_why_not():
    assert not unexplained_snippets(), "\n".join(unexplained_snippets())


def test_dependency_order_and_shortening():
    items = [Example("b", "", ["evaluate", "runs/x"]), Example("a", "", ["train", "--out", "runs/x"])]
    assert [ex.page for ex in in_dependency_order(items)] == ["a", "b"]
    assert shorten(["crossval", "--seeds", "0", "1", "2", "--out", "d"])[:5] == ["crossval", "--seeds", "0", "--out", "d"]
    assert shorten(["train", "--resume", "runs/x"]) == ["train", "--resume", "runs/x"]
    assert shorten(["train", "--plan", "runs/x", "--dry-run"]) == ["train", "--plan", "runs/x", "--dry-run"]
    assert "train.max_steps=2" in shorten(["train"])


def test_every_documented_command_runs(tmp_path, monkeypatch, local_hub):
    # `dmlkit push` uploads to a Hub that is a folder of tmp_path (conftest.LocalHub), not the network
    monkeypatch.chdir(tmp_path)
    failures = []
    for ex in in_dependency_order([ex for ex in examples() if ex.skipped is None]):
        argv = shorten(ex.argv)
        code, output = run_example(argv, tmp_path)
        if code != 0:
            failures.append(f"{ex.page}: {ex.line}\n  ran: dmlkit {' '.join(argv)}\n  exit {code}: {output[-600:]}")
    assert not failures, "documented commands that fail:\n" + "\n".join(failures)


#: What a page's Python blocks use without defining it (the placeholders of docs/python-api.md's signature line:
#: ``model``, ``loss``, ``train_data``, ``sections``), made tiny; run in the page's namespace before its blocks.
PYTHON_SETUP = {
    "docs/python-api.md": """
import dmlkit
import torch
from torch import nn
from dmlkit.losses import ProxyAnchorLoss
_g = torch.Generator().manual_seed(0)
train_data = [(torch.randn(1, 4, 4, generator=_g) + c, c) for c in range(6) for _ in range(6)]
model, loss = nn.Sequential(nn.Flatten(), nn.Linear(16, 8)), ProxyAnchorLoss(num_classes=6, embedding_size=8)
sections = {"train": {"max_steps": 2, "progress": False}, "sampler": {"batch_size": 8, "m": 2},
            "eval": {"clustering": False}}
""",
}

#: The shortened form of a page's Python blocks, as :data:`CAP` is of commands: ``(as written, as run)``; each
#: must be found (``{features}``: a copy of 2 photos of every Pets breed, for the frozen backbone's 224 px pass).
PYTHON_SHORTENED = {
    "docs/python-api.md": [
        ('root = Path("../shared/data/pets/images")', 'root = Path("{features}")'),
        ('train={"max_steps": 200})', 'train={"max_steps": 2, "progress": False}, eval={"clustering": False})'),
        ('overrides=["train.max_steps=100"]', 'overrides=["train.max_steps=2", "data.name=digits", "model.ensemble=1", '
         '"model.shift_average=0", "eval.clustering=false", "train.num_threads=1", "train.progress=false"]'),
    ],
}


def pets_for_features(workdir: Path, photos: int = 2) -> Path:
    """``workdir/pets-features``: the first ``photos`` photos (sorted) of every breed of the Pets folder."""
    small = workdir / "pets-features"
    source = ROOT.parent / PETS.removeprefix("../")
    for breed in sorted(p for p in source.iterdir() if p.is_dir()):
        (small / breed.name).mkdir(parents=True)
        for photo in sorted(breed.glob("*.jpg"))[:photos]:
            shutil.copy(photo, small / breed.name / photo.name)
    return small


def shortened_python(page: str, code: str, workdir: Path) -> str:
    """``code`` as it runs here: the page's :data:`PYTHON_SHORTENED` applied, ``../shared/`` made absolute."""
    for written, run in PYTHON_SHORTENED.get(page, []):
        if written in code:
            if "{features}" in run and not (workdir / "pets-features").exists():
                pets_for_features(workdir)
            code = code.replace(written, run.replace("{features}", str(workdir / "pets-features")))
    return code.replace("../shared/", f"{ROOT.parent / 'shared'}/")


def test_every_python_block_of_the_api_page_runs():
    """docs/python-api.md's snippets are all marked to run (or opted out with a known reason), and each shortening
    still finds its text, so a snippet that changes is run as written, never silently skipped."""
    text = (ROOT / "docs" / "python-api.md").read_text()
    fences = re.findall(r"^(.*)\n```python\n", text, re.M)
    assert fences and all(line == RUNS_IN_CI or line.removeprefix("<!-- not run in CI: ").removesuffix(" -->")
                          in KNOWN_OPT_OUTS for line in fences), fences
    code = "\n".join(python_examples()["docs/python-api.md"])
    assert all(written in code for written, _ in PYTHON_SHORTENED["docs/python-api.md"])


def test_documented_python_runs(tmp_path, monkeypatch):
    found = python_examples()
    assert len(found.get("docs/python-api.md", [])) >= 4
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, whatever a page's trackers do
    threads = torch.get_num_threads()
    try:
        for page, blocks in found.items():
            namespace: dict = {"__name__": "__doc_example__"}
            exec(PYTHON_SETUP.get(page, ""), namespace)
            for code in blocks:
                with contextlib.redirect_stdout(io.StringIO()):
                    exec(compile(shortened_python(page, code, tmp_path), page, "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "runs" / "mine" / "metrics.json").exists()
    assert (tmp_path / "runs" / "pets-python" / "report.html").exists()
    assert (tmp_path / "runs" / "pets-arcface" / "metrics.json").exists()
    assert (tmp_path / "runs" / "pets-head" / "metrics.json").exists()
    assert (tmp_path / "runs" / "engine" / "metrics.json").exists()
