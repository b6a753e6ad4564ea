"""Render reports in headless Chromium: every image decodes and the expected sections exist.

Chromium comes from Debian's ``chromium`` package; ``scripts/install_chromium.sh`` installs it
(the Makefile runs it before the tests). Without it this test fails, saying so.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dmlkit.report import write_comparison, write_report

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
FAKE_RUN_MODULE = REPO / "tests" / "unit" / "report" / "conftest.py"

# Counts decoded images after load; a deliberately broken control image proves a failed decode is seen.
PROBE = """
<img id="probe-broken-control" alt="" src="data:image/png;base64,iVBORw0KGgoAAAAA">
<script>
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var decoded = images.filter(function (img) { return img.complete && img.naturalWidth > 0; });
  var control = document.getElementById("probe-broken-control");
  document.body.dataset.imagesTotal = String(images.length);
  document.body.dataset.imagesLoaded = String(decoded.length);
  document.body.dataset.controlWidth = String(control.naturalWidth);
  document.body.dataset.sectionIds = Array.prototype.map.call(
    document.querySelectorAll("section[id]"), function (s) { return s.id; }).join(" ");
  // grid captions: rendered boxes must not intersect, and no caption may spill past its cell
  var captions = Array.prototype.slice.call(document.querySelectorAll(".grid figcaption"));
  var boxes = captions.map(function (c) { return c.getBoundingClientRect(); });
  var overlaps = 0;
  for (var i = 0; i < boxes.length; i++) {
    for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i], b = boxes[j];
      if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) { overlaps++; }
    }
  }
  var spilling = captions.filter(function (c) {
    return c.getBoundingClientRect().width > c.parentElement.getBoundingClientRect().width + 0.5;
  }).length;
  var cut = captions.filter(function (c) { return c.scrollWidth > c.clientWidth; }).length;
  document.body.dataset.captions = String(captions.length);
  document.body.dataset.captionOverlaps = String(overlaps);
  document.body.dataset.captionsSpilling = String(spilling);
  document.body.dataset.captionsCut = String(cut);
});
</script>
"""


def _make_fake_run():
    spec = importlib.util.spec_from_file_location("dmlkit_tests_report_fake_run", FAKE_RUN_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_fake_run


def _chromium() -> str:
    if not Path(CHROMIUM).is_file() and shutil.which("chromium") is None:
        pytest.fail(f"{CHROMIUM} not found: run scripts/install_chromium.sh (as root) to install Debian's chromium.")
    return CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")


def _rendered_body_data(page: Path, tmp_path: Path) -> dict[str, str]:
    """Load ``page`` plus the probe in headless Chromium; return the probe's ``data-*`` results."""
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    command = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--virtual-time-budget=10000", "--dump-dom", probed.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"chromium exited with {done.returncode}: {done.stderr[-2000:]}"
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body is not None, f"no <body> in the dumped DOM: {done.stdout[:500]!r}"
    data = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1)))
    assert "images-loaded" in data, f"the probe script did not run; body attributes: {body.group(1)!r}"
    return data


def test_report_and_comparison_render_with_every_image_decoded(tmp_path):
    make_fake_run = _make_fake_run()
    asap = make_fake_run(tmp_path, "asap", proxies=True, projections=3, thumbnails="rgb", class_names=True,
                         class_separation=0.5)  # overlapping classes: there are worst queries to show
    plain = make_fake_run(tmp_path, "plain", seed=1, thumbnails=None, image_paths=True, env=False)
    report = write_report(asap)
    comparison = write_comparison([asap, plain], tmp_path / "compare.html")

    data = _rendered_body_data(report, tmp_path)
    assert data["section-ids"].split() == [
        "metrics", "curves", "embedding-map", "retrieval-grid", "verification", "projections", "config", "environment"
    ]
    images = report.read_text(encoding="utf-8").count("<img ")
    assert data["images-total"] == str(images + 1)  # the report's figures and grid tiles + the broken control
    assert data["images-loaded"] == str(images), "a report image failed to decode in Chromium"
    assert data["control-width"] == "0"  # the probe does detect an undecodable image
    # two grids of 5-cell rows whose long class names (Pileated_Woodpecker_003) are cut, never overlapping
    assert int(data["captions"]) >= 45 and int(data["captions"]) % 5 == 0
    assert data["caption-overlaps"] == "0", "grid captions overlap one another"
    assert data["captions-spilling"] == "0", "a grid caption is wider than its cell"
    assert int(data["captions-cut"]) > 0  # the probe sees names cut by the ellipsis

    data = _rendered_body_data(comparison, tmp_path)
    assert data["section-ids"].split() == ["runs", "metrics", "curves", "config", "environment"]
    assert (data["images-total"], data["images-loaded"]) == ("2", "1")
