"""write_comparison: runs as rows, overlaid curves, highlighted config differences."""

from __future__ import annotations

import pytest

from dmlkit.exceptions import InvalidParameterError
from dmlkit.report import MissingRunFileError, write_comparison, write_report
from dmlkit.report.comparison import best_rows, run_labels
from dmlkit.report.run_reader import load_run


@pytest.fixture(scope="module")
def comparison(make_run, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("compare")
    a = make_run(tmp_path, "baseline", embeddings=False, lr=1e-4)
    b = make_run(tmp_path, "higher-lr", embeddings=False, lr=3e-4, seed=1, val=False,
                 extra_metrics={"map_at_r": 0.31, "<odd key>": 0.5})
    c = make_run(tmp_path, "dir-c", embeddings=False, config={"name": "baseline"}, env=False)
    write_report(a)  # only a has a report to link to
    out = write_comparison([a, b, c], tmp_path / "out" / "compare.html")
    return out, out.read_text(encoding="utf-8")


def test_comparison_sections_and_single_png(comparison, page, decode_pngs):
    out, text = comparison
    parsed = page(text)
    assert parsed.section_ids == ["runs", "metrics", "curves", "config", "environment"]
    images = decode_pngs(parsed.image_sources)
    assert len(images) == 1 and images[0].width > 600
    assert out.stat().st_size < 1_500_000


def test_metrics_table_has_runs_as_rows_and_bolds_the_best(comparison, page):
    _, text = comparison
    rows = {cells[0]: cells for _, cells in page(text).rows if len(cells) > 2 and cells[1] in ("val", "last")}
    assert set(rows) == {"baseline (baseline)", "higher-lr", "baseline (dir-c)"}  # clashing names get the dir
    header = next(cells for _, cells in page(text).rows if cells[:2] == ["run", "selected on"])
    map_col = header.index("MAP@R")
    assert rows["higher-lr"][map_col] == "0.3100" and rows["baseline (baseline)"][map_col] == "0.2200"
    assert rows["baseline (baseline)"][header.index("<odd key>")] == "—"
    assert '<td class="num best">0.3100</td>' in text  # best MAP@R in bold
    assert text.count('class="num best"') == 1  # the other metrics tie across runs: nothing bold
    assert rows["higher-lr"][1] == "last"


def test_config_differences_are_highlighted(comparison, page):
    _, text = comparison
    config_part, env_part = text.split('<section id="environment">')
    rows = page(config_part).rows
    differing = {cells[0]: cells[1:] for cls, cells in rows if cls == "differs"}
    assert differing["optimizer.lr"] == ["0.0001", "0.0003", "0.0001"]
    assert differing["seed"] == ["0", "1", "0"]
    assert differing["name"] == ["baseline", "higher-lr", "baseline"]
    assert "loss.name" not in differing and "model.name" not in differing
    identical = [cells for cls, cells in rows if cls == "" and cells[0] == "loss.name"]
    assert identical == [["loss.name", "proxy_anchor", "proxy_anchor", "proxy_anchor"]]
    env_differing = {cells[0]: cells[1:] for cls, cells in page(env_part).rows if cls == "differs"}
    assert env_differing["seed"] == ["0", "1", "(absent)"]
    assert "No environment record (env.json) for: baseline (dir-c)." in env_part


def test_links_to_existing_reports_relative_to_the_page(comparison):
    _, text = comparison
    assert 'href="../baseline/report.html"' in text
    assert text.count(">report</a>") == 1


def test_labels_and_best_rows_helpers(fake_run):
    runs = [load_run(fake_run(d, embeddings=False, config={"name": "same"})) for d in ("x", "y")]
    assert run_labels(runs) == ["same (x)", "same (y)"]
    assert best_rows([0.1, None, 0.3, 0.3]) == {2, 3}
    assert best_rows([0.1]) == set() and best_rows([float("nan"), 0.2, 0.1]) == {1}
    assert best_rows([0.2, 0.2, None]) == set()  # a tie across every run is not highlighted


def test_comparison_errors(fake_run, tmp_path):
    with pytest.raises(InvalidParameterError, match="non-empty list of run directories"):
        write_comparison([], tmp_path / "c.html")
    with pytest.raises(InvalidParameterError, match="non-empty list"):
        write_comparison(str(tmp_path), tmp_path / "c.html")
    good = fake_run("good", embeddings=False)
    broken = fake_run("broken", embeddings=False)
    (broken / "log.jsonl").unlink()
    with pytest.raises(MissingRunFileError, match="log.jsonl"):
        write_comparison([good, broken], tmp_path / "c.html")
    assert not (tmp_path / "c.html").exists()
