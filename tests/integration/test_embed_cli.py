"""`dmlkit embed`: .npz, .npy and .parquet outputs hold the same embeddings, labels and paths."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dmlkit.cli.embed import output_format, write_embeddings
from dmlkit.cli.main import main
from dmlkit.config import load_config
from dmlkit.exceptions import ConfigError
from dmlkit.recipe import Trainer


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """An 8-wide CNN on scikit-learn's 8x8 digits, 2 steps, embedding without shifts (each embed is one pass)."""
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(overrides=[
        "data.name=digits", "model.shift_average=0", "train.max_steps=2", "train.progress=false", "eval.clustering=false", "eval.save_embeddings=false",
        "model.args={width: 8}", "sampler.batch_size=32", "sampler.m=8",
    ])
    Trainer(cfg, run_dir, echo=lambda _: None).fit()
    return run_dir


def test_parquet_round_trips_the_npz_output(tiny_run, tmp_path, capsys):
    assert main(["embed", str(tiny_run), "--out", str(tmp_path / "test.npz")]) == 0
    assert main(["embed", str(tiny_run), "--out", str(tmp_path / "test.parquet")]) == 0
    assert "embeddings of size 64 (test split)" in capsys.readouterr().out
    ref = np.load(tmp_path / "test.npz")
    table = pq.read_table(tmp_path / "test.parquet")
    assert table.column_names == ["label", "path", "embedding"]
    kind = table.schema.field("embedding").type
    assert pa.types.is_fixed_size_list(kind) and kind.list_size == 64 and kind.value_type == pa.float32()
    assert table.schema.field("label").type == pa.int64()
    emb = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    assert emb.dtype == np.float32 and np.array_equal(emb, ref["embeddings"])
    assert np.array_equal(table.column("label").to_numpy(), ref["labels"])
    assert table.column("path").null_count == table.num_rows  # the digits are in memory: no files


def test_format_flag_overrides_the_extension_and_paths_are_kept(tmp_path):
    emb = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    paths = ["a/1.png", "b/2.png", "b/3.png"]
    [out] = write_embeddings(tmp_path / "gallery.bin", emb, [0, 1, 1], paths, fmt="parquet")
    table = pq.read_table(out)
    assert table.column("path").to_pylist() == paths
    assert table.column("label").to_pylist() == [0, 1, 1]
    got = np.stack([np.asarray(v, dtype=np.float32) for v in table.column("embedding").to_pylist()])
    assert np.array_equal(got, emb.astype(np.float32))


def test_unknown_extension_without_format_fails_before_embedding(tiny_run, tmp_path, capsys):
    assert main(["embed", str(tiny_run), "--out", str(tmp_path / "emb.csv")]) == 2
    assert "--out must end in .npz or .npy or .parquet" in capsys.readouterr().err
    assert not (tmp_path / "emb.csv").exists()
    assert output_format("x.csv", "npy") == "npy"


def test_missing_pyarrow_is_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=r"needs the 'pyarrow' package.*pip install pyarrow"):
        output_format("emb.parquet")


def embed_rank(rank: int, port: int, run_dir: str, out: str) -> None:
    """One torchrun rank of `dmlkit embed` in a forked child: torchrun's environment variables, then the CLI."""
    import os
    import sys

    import torch

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    code = main(["embed", run_dir, "--out", out])
    from dmlkit.engine.distributed import cleanup_distributed

    cleanup_distributed()
    sys.exit(code)


def embed_with_two_ranks(run_dir, out) -> None:
    """Two gloo ranks forked from this process, as torchrun would start them (a free loopback port)."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=embed_rank, args=(rank, port, str(run_dir), str(out))) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]


def test_two_processes_write_parts_whose_union_is_the_one_process_embedding(tiny_run, tmp_path):
    import json

    from dmlkit.engine.embed_parts import check_folder

    assert main(["embed", str(tiny_run), "--out", str(tmp_path / "one.parquet")]) == 0
    one = pq.read_table(tmp_path / "one.parquet")
    out = tmp_path / "two.parquet"
    embed_with_two_ranks(tiny_run, out)
    manifest = json.loads((out / "_manifest.json").read_text())
    n = one.num_rows
    assert manifest["rows"] == n and manifest["world_size"] == 2 and manifest["dim"] == 64
    assert manifest["parts"] == [{"file": "part-00000-of-00002.parquet", "rows": [0, n // 2]},
                                 {"file": "part-00001-of-00002.parquet", "rows": [n // 2, n]}]
    both = pq.read_table(out).sort_by("row")  # the folder reads as one table; the manifest is not data
    assert both.column("row").to_pylist() == list(range(n))
    assert both.column("label").to_pylist() == one.column("label").to_pylist()

    def matrix(table):
        return table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)

    np.testing.assert_allclose(matrix(both), matrix(one), atol=1e-5)

    first, second = out / "part-00000-of-00002.parquet", out / "part-00001-of-00002.parquet"
    kept = first.stat().st_mtime_ns
    second.unlink()  # as if rank 1 was stopped before writing its part
    (out / "_manifest.json").unlink()
    embed_with_two_ranks(tiny_run, out)
    assert first.stat().st_mtime_ns == kept and second.exists() and (out / "_manifest.json").exists()
    np.testing.assert_array_equal(matrix(pq.read_table(out).sort_by("row")), matrix(both))
    with pytest.raises(ConfigError, match="split over another number of processes"):
        check_folder(out, 3)
