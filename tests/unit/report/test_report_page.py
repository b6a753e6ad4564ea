"""write_report: sections, inline PNGs, size, escaping, notes for missing optional pieces."""

from __future__ import annotations

import html as std_html
import json

import numpy as np
import pytest

from dmlkit.exceptions import DataError, InvalidParameterError
from dmlkit.report import MissingRunFileError, write_report
from dmlkit.report.retrieval_grid import WRONG_COLOR

ALL_SECTIONS = ["metrics", "curves", "embedding-map", "retrieval-grid", "verification", "projections", "config",
                "environment"]


def test_asap_report_has_every_section_in_order(asap_report, page):
    run_dir, text = asap_report
    assert page(text).section_ids == ALL_SECTIONS
    assert (run_dir / "report.html").is_file()


def test_every_image_is_an_inline_png_that_decodes(asap_report, page, decode_pngs):
    _, text = asap_report
    parsed = page(text)
    images = decode_pngs(parsed.image_sources)
    figures = [image for image in images if image.width >= 200 and image.height >= 150]
    tiles = [image for image in images if image.size == (12, 12)]  # the stored thumbnails, never enlarged
    assert len(figures) == 4  # curves, embedding map, verification, projections
    assert all(image.width == 1440 for image in figures)  # 2x PNG of a 7.5-inch (720 CSS px) figure
    # the retrieval grids: 8 random queries (and the worst ones with the true matches they missed), 1 + 4 cells each
    assert len(figures) + len(tiles) == len(images) and len(tiles) >= 40
    assert "<h3>Random queries</h3>" in text


def test_counts_print_as_integers_and_far_proxies_sit_on_the_edge(fake_run, page):
    run_dir = fake_run("counts", proxies=True, extra_metrics={"num_queries_excluded": 1343}, class_separation=0.3)
    with np.load(run_dir / "embeddings" / "test.npz") as saved:
        arrays = dict(saved)
    arrays["proxies"] = arrays["proxies"] * 50.0  # unnormalised proxies far outside the test points
    np.savez(run_dir / "embeddings" / "test.npz", **arrays)
    text = write_report(run_dir).read_text(encoding="utf-8")
    rows = {cells[0]: cells for _, cells in page(text).rows if len(cells) == 2}
    assert rows["queries without a true match (excluded)"][1] == "1,343" and rows["MAP@R"][1] == "0.2200"
    assert "more lie outside it and are not drawn" in text
    # overlapping classes: the worst queries (one per class, first neighbour wrong) beside the random ones
    worst = text.split("<h3>Worst queries</h3>")[1].split("</div></div>")[0]
    first_neighbours = worst.split("<b>\u2717 #1</b>")[0:-1]
    assert 1 <= len(first_neighbours) <= 5  # every #1 is wrong: a cross, never a tick
    assert "<b>\u2713 #1</b>" not in worst
    assert worst.count(f"border-color:{WRONG_COLOR}") >= len(first_neighbours)
    assert "true matches the query missed" in worst and "<b>\u2713 rank " in worst


def test_report_is_self_contained_and_small(asap_report, page):
    run_dir, text = asap_report
    parsed = page(text)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert "http://" not in text and "https://" not in text
    assert (run_dir / "report.html").stat().st_size < 1_500_000


def test_metrics_table_shows_standard_and_extra_keys(asap_report, page):
    _, text = asap_report
    rows = {cells[0]: cells for _, cells in page(text).rows if len(cells) == 2}
    assert rows["MAP@R"] == ["MAP@R", "0.2200"]
    assert rows["P@1 = R@1"] == ["P@1 = R@1", "0.6100"] and "R@1" not in rows  # equal: shown once, explained
    assert "P@1 and R@1 are the same number here" in text
    assert rows["covering radius"][1] == "0.4200"  # an extra float key is shown too, by display name
    metrics = text.split('<section id="metrics">')[1].split("</section>")[0]
    assert not any("_" in cells[0] for _, cells in page(metrics).rows)  # display names only, no raw keys
    assert "Test MAP@R 0.220 and P@1 0.610 with the kept weights" in text  # the answer opens the page


def test_projection_table_lists_each_projection(asap_report, page):
    _, text = asap_report
    projection_rows = [cells for _, cells in page(text).rows if len(cells) == 6 and cells[0].isdigit()
                       and cells[1] == "20"]
    assert [row[0] for row in projection_rows] == ["0", "1", "2", "3"]
    assert projection_rows[1][4] == "0.6000"  # covering_radius_after of projection 1


def test_report_is_byte_identical_when_rewritten(asap_report, tmp_path):
    run_dir, text = asap_report
    again = write_report(run_dir, out_path=tmp_path / "again.html")
    assert again == tmp_path / "again.html"
    assert again.read_text(encoding="utf-8") == text


def test_user_strings_are_escaped(fake_run, page):
    hostile = '<script>alert("x")</script> & \'quoted\''
    run_dir = fake_run(
        "esc",
        embeddings=False,
        config={"name": hostile, "data": {"name": "<b>cub</b>"}, "notes": "<img src=x onerror=alert(1)>"},
        extra_metrics={"selected_on": "<i>val</i>"},
    )
    text = write_report(run_dir).read_text(encoding="utf-8")
    parsed = page(text)
    assert "script" not in parsed.tags and "b" not in parsed.tags and "i" not in parsed.tags
    assert all(src.startswith("data:image/png;base64,") for src in parsed.image_sources)
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;quoted&#x27;" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert f"dmlkit run: {hostile}" in std_html.unescape(text)  # the title unescapes back to the original


def test_missing_optional_pieces_become_notes(fake_run, page, decode_pngs):
    run_dir = fake_run("bare", embeddings=False, env=False, val=False)
    text = write_report(run_dir).read_text(encoding="utf-8")
    parsed = page(text)
    assert parsed.section_ids == ["metrics", "curves", "embedding-map", "retrieval-grid", "verification", "config",
                                  "environment"]
    assert "No embedding map: embeddings/test.npz is missing." in text
    assert "No retrieval grid: embeddings/test.npz is missing." in text
    assert "env.json is missing; no environment record." in text
    assert "No validation evaluations were logged; the curves show the test split." in text
    assert len(decode_pngs(parsed.image_sources)) == 1  # only the curves


def test_log_without_records_gives_a_note(fake_run, page):
    run_dir = fake_run("empty-log", embeddings=False)
    (run_dir / "log.jsonl").write_text("", encoding="utf-8")
    text = write_report(run_dir).read_text(encoding="utf-8")
    assert "log.jsonl has no train or eval records; no curves to draw." in text
    assert page(text).image_sources == []


def test_without_images_the_grid_is_a_label_table_with_wrong_ones_red(fake_run, page):
    run_dir = fake_run("no-thumbs", thumbnails=None, class_separation=0.3, seed=3)
    text = write_report(run_dir, num_queries=5).read_text(encoding="utf-8")
    assert "showing class labels only" in text
    grid_rows = [cells for _, cells in page(text).rows if len(cells) == 5 and cells[0].startswith("class ")]
    assert len(grid_rows) == 5
    wrong_cells = sum(
        cell.split(" (")[0][2:] != row[0].split(" (")[0] for row in grid_rows for cell in row[1:]
    )
    assert wrong_cells == sum(cell.startswith("\u2717") for row in grid_rows for cell in row[1:])  # crosses
    assert wrong_cells > 0  # overlapping classes: some neighbours are wrong...
    assert text.count(f'style="color:{WRONG_COLOR}"') == wrong_cells  # ...and exactly those are red


def test_image_paths_two_dim_embeddings_and_tsne(fake_run, page, decode_pngs):
    run_dir = fake_run("paths", thumbnails=None, image_paths=True, embedding_size=2)
    text = write_report(run_dir, embedding_method="tsne").read_text(encoding="utf-8")
    assert "the 2-D embeddings themselves" in text  # 2-D wins over the requested t-SNE
    assert "showing class labels only" not in text
    images = decode_pngs(page(text).image_sources)
    assert sum(image.width >= 200 for image in images) == 3 and len(images) > 3  # curves, map, verification, tiles
    run_dir = fake_run("tsne", thumbnails="gray", embedding_size=6, num_classes=3, per_class=5)
    text = write_report(run_dir, embedding_method="tsne").read_text(encoding="utf-8")
    assert "t-SNE of the 6-D embeddings" in text


def test_malformed_optional_file_is_a_note_not_a_crash(fake_run, page):
    run_dir = fake_run("bad-npz", env=False)
    np.savez(run_dir / "embeddings" / "test.npz", embeddings=np.zeros((4, 3), np.float32),
             labels=np.zeros(5, np.int64))
    (run_dir / "env.json").write_text("[1, 2]", encoding="utf-8")
    text = write_report(run_dir).read_text(encoding="utf-8")
    assert "embeddings has 4 rows but labels has 5." in text
    assert "must hold a JSON object. Got list." in text
    assert "embedding-map" in page(text).section_ids


@pytest.mark.parametrize("missing", ["config.yaml", "metrics.json", "log.jsonl"])
def test_missing_required_file_raises_naming_it(fake_run, missing):
    run_dir = fake_run("incomplete", embeddings=False)
    (run_dir / missing).unlink()
    with pytest.raises(MissingRunFileError, match=missing.replace(".", r"\.")) as info:
        write_report(run_dir)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, DataError)
    assert not (run_dir / "report.html").exists()


def test_missing_run_directory_raises(tmp_path):
    with pytest.raises(MissingRunFileError, match="does not exist"):
        write_report(tmp_path / "nowhere")


def test_malformed_required_file_raises_data_error(fake_run):
    run_dir = fake_run("broken", embeddings=False)
    (run_dir / "metrics.json").write_text(json.dumps([0.5]), encoding="utf-8")
    with pytest.raises(DataError, match=r"metrics\.json.*must hold a JSON object"):
        write_report(run_dir)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embedding_method": "isomap"}, "The 'embedding_method' parameter of write_report must be one of {'pca', 'tsne', 'umap'}. Got 'isomap' instead."),
        ({"max_points": 0}, "The 'max_points' parameter of write_report must be an int >= 1. Got 0 instead."),
        ({"distance": "l1"}, "The 'distance' parameter of write_report must be one of {'cosine', 'euclidean'}. Got 'l1' instead."),
        ({"num_neighbours": 2.5}, "The 'num_neighbours' parameter of write_report must be an int in the range [1, 16]. Got 2.5 instead."),
    ],
)
def test_invalid_parameters_are_rejected_up_front(tmp_path, kwargs, message):
    with pytest.raises(InvalidParameterError) as info:
        write_report(tmp_path / "not-even-read", **kwargs)
    assert str(info.value) == message
