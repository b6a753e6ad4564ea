"""The report of a small photo run, rendered in headless Chromium at 1400 and 800 px.

Checked from the page itself (a probe script writes its measurements into the DOM, read back with
``--dump-dom``): no element overflows its container horizontally, every figure has labelled axes, no
text smaller than 10 CSS px at 800 px, the selected step is marked, proxies are not drawn in a test-class
colour, every retrieval thumbnail is shown at no more than 1x its stored pixels; no absolute path of the
machine anywhere in the HTML. Screenshots of both widths go to the test's tmp directory (not the repo).
Real photos: a few breeds of ../shared/data/pets, linked (never copied) into a folder data set.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dmlkit.report import write_comparison, write_report

REPO = Path(__file__).resolve().parents[2]
PETS = REPO.parent / "shared" / "data" / "pets" / "images"
WIDTHS = (1400, 800)

PROBE = """
<script>
window.addEventListener("load", function () {
  function scrolls(el) {  // an ancestor that scrolls or clips horizontally contains the element by design
    for (var p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      var o = getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll" || o === "hidden") { return true; }
    }
    return false;
  }
  function name(el) { return el.tagName.toLowerCase() + (el.className ? "." + el.className : "") + " "
                      + (el.textContent || "").trim().slice(0, 40); }
  var out = {overflow: [], small_text: [], figures: [], thumbnails: [],
             page_width: document.documentElement.scrollWidth, window_width: window.innerWidth};
  Array.prototype.forEach.call(document.body.querySelectorAll("*"), function (el) {
    if (el.tagName === "SCRIPT") { return; }
    var r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) { return; }
    var p = el.parentElement.getBoundingClientRect();
    if (!scrolls(el) && (r.right > p.right + 1 || r.left < p.left - 1)) { out.overflow.push(name(el)); }
    var ownText = Array.prototype.some.call(el.childNodes, function (n) {
      return n.nodeType === 3 && n.textContent.trim().length > 0; });
    if (ownText && parseFloat(getComputedStyle(el).fontSize) < 10) {
      out.small_text.push(name(el) + " " + getComputedStyle(el).fontSize); }
  });
  Array.prototype.forEach.call(document.querySelectorAll("figure.plot"), function (f) {
    var img = f.querySelector("img");
    var scale = img.getBoundingClientRect().width / parseFloat(img.getAttribute("width"));
    out.figures.push({alt: img.alt, axes: f.dataset.axes, min_font_px: parseFloat(f.dataset.minFontPx) * scale,
                      selected_step: f.dataset.selectedStep, class_colors: f.dataset.classColors,
                      proxy_color: f.dataset.proxyColor});
  });
  Array.prototype.forEach.call(document.querySelectorAll(".grid img"), function (img) {
    var r = img.getBoundingClientRect();
    out.thumbnails.push([r.width, r.height, img.naturalWidth, img.naturalHeight]);
  });
  document.body.dataset.probe = JSON.stringify(out);
});
</script>
"""


def _chromium() -> str:
    """Chromium's path, as the project's browser test finds it (failing with the install hint)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dmlkit_tests_report_browser", Path(__file__).with_name(
        "test_report_browser.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._chromium()


def _link_breeds(root: Path, first: int, last: int, per_class: int) -> Path:
    for breed in sorted(p.name for p in PETS.iterdir() if p.is_dir())[first:last]:
        (root / breed).mkdir(parents=True)
        for i, file in enumerate(sorted((PETS / breed).iterdir())[:per_class]):
            os.symlink(file, root / breed / f"{i}{file.suffix}")
    return root


def _train(out: Path, *overrides: str) -> Path:
    """``dmlkit train --set OVERRIDES --out OUT`` in this process (2 steps); its report."""
    from dmlkit.cli.main import main

    command = ["train", "--set", "train.max_steps=2", "--set", "train.eval_every=1"]
    command += [arg for override in overrides for arg in ("--set", override)]
    assert main(command + ["--quiet", "--no-report", "--out", str(out)]) == 0
    return write_report(out)


@pytest.fixture(scope="module")
def photo_run(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny photo run: 6 pet breeds x 4 photos through `dmlkit train`, 2 steps; its report."""
    base = tmp_path_factory.mktemp("photo-report")
    data = _link_breeds(base / "data", 0, 6, 4)
    return base / "run", _train(base / "run", "data.name=folder", f"data.root={data}", "data.image_size=96")


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory) -> tuple[Path, Path]:
    """The default job (Proxy-Anchor, a small CNN) on scikit-learn's 8x8 digits, 2 steps, test embeddings without
    shifts (a glyph run's report at a fraction of MNIST-5k's evaluation); its report."""
    out = tmp_path_factory.mktemp("mnist-report") / "run"
    return out, _train(out, "data.name=digits", "model.shift_average=0")


def _probe(page: Path, tmp_path: Path, width: int) -> dict:
    """Render ``page`` plus the probe at ``width`` CSS px; the probe's measurements, and a screenshot."""
    probed = tmp_path / f"probed-{width}-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    common = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
              f"--window-size={width},2000", "--virtual-time-budget=10000"]
    done = subprocess.run(common + ["--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"chromium exited with {done.returncode}: {done.stderr[-2000:]}"
    found = re.search(r'<body[^>]*data-probe="([^"]*)"', done.stdout)
    assert found is not None, "the probe script did not run"
    shot = tmp_path / f"screenshot-{page.stem}-{width}.png"
    subprocess.run(common + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=180)
    assert shot.is_file() and shot.stat().st_size > 0
    return json.loads(html.unescape(found.group(1)))


def _check_layout(result: dict, width: int) -> None:
    assert result["page_width"] <= result["window_width"], f"the page scrolls sideways at {width} px"
    assert result["overflow"] == [], f"elements overflow their container at {width} px: {result['overflow'][:5]}"
    for figure in result["figures"]:
        for axes in figure["axes"].split("|"):
            xlabel, ylabel = axes.split(";")
            assert xlabel.strip() and ylabel.strip(), f"a figure has an unlabelled axis: {figure['alt']!r}"
        if width == 800:
            assert figure["min_font_px"] >= 10, f"{figure['alt']!r}: text of {figure['min_font_px']:.1f} px"
    if width == 800:
        assert result["small_text"] == [], f"text under 10 px at 800 px: {result['small_text'][:5]}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", ["photo_run", "mnist_run"])
def test_report_is_legible_at_1400_and_800_px(kind, width, request, tmp_path):
    run_dir, report = request.getfixturevalue(kind)
    result = _probe(report, tmp_path, width)
    _check_layout(result, width)
    curves = [f for f in result["figures"] if f["alt"].startswith("training curves")]
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    assert len(curves) == 1 and curves[0].get("selected_step") == str(metrics["best_step"])  # the kept step marked
    maps = [f for f in result["figures"] if f.get("class_colors")]
    assert len(maps) == 1 and maps[0]["proxy_color"], "the photo run's proxies are drawn"
    assert maps[0]["proxy_color"] not in maps[0]["class_colors"].split(), "proxies drawn in a test-class colour"
    assert len(result["thumbnails"]) >= 40  # 8 random queries x 5 cells, then the worst queries
    for shown_w, shown_h, natural_w, natural_h in result["thumbnails"]:
        assert 0 < shown_w <= natural_w + 0.01 and 0 < shown_h <= natural_h + 0.01, "a thumbnail is enlarged"
    assert len(result["figures"]) == 3  # curves, embedding map, verification


def test_comparison_is_legible_at_800_px(photo_run, tmp_path):
    run_dir, _ = photo_run
    page = write_comparison([run_dir, run_dir], tmp_path / "compare.html")
    result = _probe(page, tmp_path, 800)
    _check_layout(result, 800)
    assert len(result["figures"]) == 1


def _without_data_uris(text: str) -> str:
    return re.sub(r"data:image/[a-z+]+;base64,[A-Za-z0-9+/=]+", "", text)


def test_no_absolute_machine_path_in_the_report(photo_run, tmp_path):
    run_dir, report = photo_run
    text = _without_data_uris(report.read_text(encoding="utf-8"))
    machine = {str(run_dir.resolve().parent.parent), str(REPO), str(PETS.resolve()), str(Path.home()),
               str(Path(sys.executable).parent)}
    for path in machine:
        assert path not in text, f"the report shows the absolute path {path!r}"
    assert "../data" in text  # data.root is shown, relative to the run directory
    assert "device" in text
    comparison = write_comparison([run_dir], tmp_path / "compare.html")
    text = _without_data_uris(comparison.read_text(encoding="utf-8"))
    for path in machine:
        assert path not in text, f"the comparison shows the absolute path {path!r}"
