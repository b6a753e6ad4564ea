"""`dmlkit index build --kind compressed` end to end: parameters from the command line recorded in the
index, the float vectors beside it, a gallery image found first, options for another kind refused."""

from __future__ import annotations

import numpy as np
from PIL import Image

from dmlkit.cli.main import main
from dmlkit.index import Index
from dmlkit.index.compressed import vectors_path


def test_build_query_add_remove_a_compressed_index(tmp_path, capsys):
    rng = np.random.default_rng(0)
    rows = []
    for c in range(6):
        for k in range(6):
            img = (np.array([c * 40, 255 - c * 40, 90]) + rng.integers(0, 60, (24, 24, 3))).clip(0, 255)
            path = tmp_path / "data" / f"class{c}" / f"{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img.astype(np.uint8)).save(path)
            rows.append(f"{path},class{c}")
    run_dir = tmp_path / "run"
    assert main(["train", "--set", "data.name=folder", "--set", f"data.root={tmp_path / 'data'}", "--quiet",
                 "--no-report", "--set", "eval.clustering=false", "--set", "data.image_size=16",
                 "--set", "train.max_steps=2", "--out", str(run_dir)]) == 0
    gallery = tmp_path / "gallery.csv"
    gallery.write_text("path,label\n" + "".join(f"{r}\n" for r in rows))
    index = tmp_path / "g.index"
    capsys.readouterr()
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(index), "--kind", "compressed",
                 "--nlist", "4", "--shortlist", "20", "--opq", "off"]) == 0
    out = capsys.readouterr().out
    assert "indexed 36 images (compressed" in out and "recall@10 against exact search: 1.0000" in out
    loaded = Index.load(index)
    assert (loaded.params["nlist"], loaded.params["shortlist"], loaded.params["opq"]) == (4, 20, False)
    assert vectors_path(index).stat().st_size == 36 * loaded.dim * 4
    query = rows[12].split(",")[0]
    assert main(["index", "query", str(index), query, "-k", "1"]) == 0
    first = capsys.readouterr().out.splitlines()[1]
    assert first.startswith(f"  1. {query} ") and "distance=0.0000" in first
    assert main(["index", "remove", str(index), "12", "42"]) == 0 and "holds 35" in capsys.readouterr().out
    assert len(Index.load(index)) == 35

    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(tmp_path / "f.index"),
                 "--code-size", "8"]) == 2
    assert "--code-size: not used by --kind flat" in capsys.readouterr().err
    assert main(["index", "build", str(run_dir), "--images", str(gallery), "--out", str(tmp_path / "c.index"),
                 "--kind", "compressed", "--code-size", "7"]) == 2
    assert "'code_size' parameter of Index must divide the embedding size" in capsys.readouterr().err
    assert not (tmp_path / "f.index").exists() and not (tmp_path / "c.index").exists()
