"""Paths in reports are relative to the run directory; `dmlkit report --map` choices."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dmlkit.report.paths import relative_paths, shown_environment


def test_absolute_paths_become_relative_to_the_run_and_the_rest_is_untouched():
    run = Path("/runs/exp/a")
    config = {"data": {"root": "/data/pets", "name": "folder"}, "lr": 0.1, "notes": "a / b, see http://x.org/y",
              "list": ["/runs/exp/a/embeddings/test.npz", "--set", "data.root=/data/pets"]}
    shown = relative_paths(config, run)
    assert shown["data"] == {"root": "../../../data/pets", "name": "folder"}
    assert shown["lr"] == 0.1 and shown["notes"] == "a / b, see http://x.org/y"  # no path in there
    assert shown["list"] == ["embeddings/test.npz", "--set", "data.root=../../../data/pets"]


def test_environment_command_starts_with_the_program_name_not_its_file():
    env = {"command": ["/opt/venv/lib/python3.11/site-packages/dmlkit/__main__.py", "train", "--out", "/runs/b"],
           "python": "3.11"}
    shown = shown_environment(env, Path("/runs/b"))
    assert shown == {"command": "dmlkit train --out .", "python": "3.11"}
    assert shown_environment(None, Path("/x")) is None


def test_report_cli_map_umap_without_the_package_is_a_clear_error(fake_run, capsys):
    from dmlkit.cli.main import main

    run_dir = fake_run("cli", embedding_size=6)
    assert main(["report", str(run_dir), "--map", "tsne", "--no-proxies"]) == 0
    assert "t-SNE of the 6-D embeddings" in (run_dir / "report.html").read_text(encoding="utf-8")
    if importlib.util.find_spec("umap") is None:
        assert main(["report", str(run_dir), "--map", "umap"]) == 2
        assert "--map umap needs the umap-learn package" in capsys.readouterr().err
