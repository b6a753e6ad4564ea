"""Build dmlkit's sdist and wheel from a checkout and verify them before they are published.

    python scripts/release_check.py [--out DIR] [--sdist-only]

1. The sdist is built from a copy of the files git tracks (so nothing untracked or built here slips in) and
   its file list checked: every tracked module and preset of ``src/dmlkit``, the C scan's source,
   ``pyproject.toml``, ``setup.py``, ``README.md``; no compiled extension, cache or run folder.
2. The wheel is built from the unpacked sdist (so the sdist is known to build) with the installed setuptools
   (``pip wheel --no-deps --no-build-isolation``: no network) and its file list checked the same way, with
   the ``dmlkit`` command's entry point and the version of ``pyproject.toml``.
3. The wheel is installed with ``--no-deps`` into a fresh virtual environment that sees this interpreter's
   packages (torch and the rest are not downloaded again), and, from outside the checkout, ``dmlkit --help``
   and ``dmlkit presets`` run and ``import dmlkit`` resolves to the installed copy.

``--sdist-only`` stops after step 1 (seconds; the test suite runs it). Exit status 0 when every check holds;
else each failed check is printed and the status is 1. The files are left in ``--out`` (default: a temporary
folder, removed at the end).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Names no distribution may hold: build products, caches and a user's runs.
FORBIDDEN = (".so", ".pyc", "__pycache__/", "/runs/", "/.venv/")


def tracked_files(root: Path = ROOT) -> list[str]:
    """The repository's files as git tracks them (relative, POSIX); every file but build products without git."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True)
        return sorted(name for name in out.stdout.decode().split("\0") if name and (root / name).is_file())
    except (OSError, subprocess.CalledProcessError):
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                      and not any(part in {".git", ".venv", "build", "dist", "__pycache__"} for part in p.parts))


def project_version(root: Path = ROOT) -> str:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def expected_package_files(files: list[str]) -> set[str]:
    """The package's files a distribution must hold, relative to ``src/``: modules, presets, the C source."""
    return {name.removeprefix("src/") for name in files if name.startswith("src/dmlkit/")
            and name.endswith((".py", ".yaml", ".c"))}


def build_sdist(root: Path, out: Path) -> Path:
    """``out/dmlkit-VERSION.tar.gz``, built by setuptools from a copy of ``root``'s tracked files."""
    with tempfile.TemporaryDirectory(prefix="dmlkit-sdist-") as tmp:
        copy = Path(tmp) / "dmlkit"
        for name in tracked_files(root):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, copy / name)
        code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=copy, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"building the sdist failed:\n{done.stdout}{done.stderr}")
        return out / done.stdout.strip().splitlines()[-1]


def sdist_problems(sdist: Path, files: list[str], version: str) -> list[str]:
    """What the sdist lacks or should not hold."""
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    problems = [f"sdist lacks {name}" for name in ("pyproject.toml", "setup.py", "README.md", "PKG-INFO")
                if name not in names]
    problems += [f"sdist lacks src/{name}" for name in sorted(expected_package_files(files))
                 if f"src/{name}" not in names]
    problems += [f"sdist holds {name}" for name in sorted(names) if any(bad in f"/{name}" for bad in FORBIDDEN)]
    if not sdist.name.startswith(f"dmlkit-{version}."):
        problems.append(f"sdist {sdist.name} is not version {version}")
    return problems


def build_wheel(sdist: Path, out: Path) -> Path:
    """The wheel built from the unpacked ``sdist`` with this interpreter's setuptools (no network)."""
    with tempfile.TemporaryDirectory(prefix="dmlkit-wheel-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        source = next(Path(tmp).iterdir())
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                               "-w", str(out), str(source)], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"building the wheel failed:\n{done.stdout}{done.stderr}")
    return next(out.glob("dmlkit-*.whl"))


def wheel_problems(wheel: Path, files: list[str], version: str) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = f"dmlkit-{version}.dist-info"
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode() if f"{dist_info}/entry_points.txt" in names \
            else ""
    problems = [f"wheel lacks {name}" for name in sorted(expected_package_files(files) - {"dmlkit/evaluation/_knn_scan.c"})
                if name not in names]
    problems += [f"wheel holds {name}" for name in sorted(names) if any(bad in f"/{name}" for bad in FORBIDDEN[1:])]
    if "dmlkit = dmlkit.cli.main:main" not in entry_points:
        problems.append(f"wheel's {dist_info}/entry_points.txt lacks the dmlkit command")
    return problems


def install_problems(wheel: Path, workdir: Path) -> list[str]:
    """Install ``wheel`` with --no-deps into a fresh venv that sees this interpreter's packages; run the CLI."""
    env_dir = workdir / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the packages dmlkit depends on, from this interpreter (appended after the venv's own: its dmlkit wins)
    Path(site, "_release_check_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    problems = []
    steps = [[str(python), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
             [str(env_dir / "bin" / "dmlkit"), "--help"],
             [str(env_dir / "bin" / "dmlkit"), "presets"],
             [str(python), "-c", "import dmlkit, sys; sys.exit(not dmlkit.__file__.startswith(sys.argv[1]))", site]]
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    for step in steps:
        done = subprocess.run(step, cwd=workdir, capture_output=True, text=True, env=clean)
        if done.returncode != 0:
            problems.append(f"{Path(step[0]).name} {' '.join(step[1:])[:80]} failed "
                            f"({done.returncode}): {(done.stderr or done.stdout).strip()[-400:]}")
            break
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the sdist and wheel (default: a temporary one)")
    parser.add_argument("--sdist-only", action="store_true", help="build and check the sdist only")
    args = parser.parse_args(argv)
    tmp = None if args.out else tempfile.TemporaryDirectory(prefix="dmlkit-release-")
    out = args.out or Path(tmp.name)
    out.mkdir(parents=True, exist_ok=True)
    try:
        files, version = tracked_files(), project_version()
        sdist = build_sdist(ROOT, out)
        problems = sdist_problems(sdist, files, version)
        print(f"sdist: {sdist.name}" + ("" if problems else ": file list complete"))
        if not args.sdist_only and not problems:
            wheel = build_wheel(sdist, out)
            problems += wheel_problems(wheel, files, version)
            print(f"wheel: {wheel.name}" + ("" if problems else ": file list complete"))
            if not problems:
                problems += install_problems(wheel, out)
                print("installed with --no-deps into a fresh venv: " + ("failed" if problems else "dmlkit runs"))
        for problem in problems:
            print(f"  {problem}")
        return 1 if problems else 0
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
