"""Regenerate docs/figures/report-mnist.png and docs/figures/report-photos.png: the top of report.html
of a tiny MNIST run (the default job) and of a tiny photo run (a few pet breeds as a folder data set),
rendered by headless Chromium at 1400 px.

Run: PYTHONPATH=src .venv/bin/python scripts/report_screenshots.py [--steps 20] [--work DIR]
Needs /usr/bin/chromium (scripts/install_chromium.sh) and ../shared/data/pets/images for the photo run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PETS = REPO.parent / "shared" / "data" / "pets" / "images"
FIGURES = REPO / "docs" / "figures"
CHROMIUM = "/usr/bin/chromium"


def train(out: Path, steps: int, *overrides: str) -> Path:
    """A short `dmlkit train` run into ``out`` (report written by the run); a finished run already in
    ``out`` (``--work`` reused) only gets its report rewritten."""
    if (out / "metrics.json").is_file():
        subprocess.run([sys.executable, "-m", "dmlkit", "report", str(out)], check=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
        return out / "report.html"
    command = [sys.executable, "-m", "dmlkit", "train", "--set", f"train.max_steps={steps}",
               "--set", f"train.eval_every={max(1, steps // 4)}", "--set", "train.log_every=1",
               "--quiet", "--no-progress", "--out", str(out)]
    command += [arg for override in overrides for arg in ("--set", override)]
    subprocess.run(command, check=True, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    return out / "report.html"


def screenshot(page: Path, target: Path, work: Path, width: int = 1400, height: int = 2200) -> None:
    """The top ``height`` px of ``page`` at ``width`` px, halved and palette-quantised (small PNG)."""
    from PIL import Image

    raw = work / f"{target.stem}-raw.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--user-data-dir={work / 'chromium-profile'}", f"--window-size={width},{height}",
                    f"--screenshot={raw}", page.as_uri()], check=True, capture_output=True)
    image = Image.open(raw).convert("RGB")
    image = image.resize((image.width // 2, image.height // 2), Image.Resampling.LANCZOS)
    image.quantize(colors=256).save(target, optimize=True)
    print(target, f"{target.stat().st_size // 1024} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps of each run (default 20)")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dmlkit-report-screenshots-"))
    FIGURES.mkdir(parents=True, exist_ok=True)
    screenshot(train(work / "mnist", args.steps), FIGURES / "report-mnist.png", work)
    data = work / "pets"
    for breed in sorted(p.name for p in PETS.iterdir() if p.is_dir())[:10]:
        (data / breed).mkdir(parents=True, exist_ok=True)
        for i, file in enumerate(sorted((PETS / breed).iterdir())[:6]):
            link = data / breed / f"{i}{file.suffix}"
            if not link.exists():
                os.symlink(file, link)
    page = train(work / "photos", args.steps, "data.name=folder", f"data.root={data}", "data.image_size=128")
    screenshot(page, FIGURES / "report-photos.png", work)


if __name__ == "__main__":
    main()
