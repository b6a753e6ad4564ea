"""Embedding parts of a torchrun job: rows cover the split once in order, a part is reused only by its own job."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from dmlkit.engine.embed_parts import (
    MANIFEST,
    RowsOf,
    existing_part,
    job_description,
    part_name,
    part_rows,
    write_manifest,
    write_part,
)
from dmlkit.exceptions import DataError


@pytest.mark.parametrize("n", [0, 1, 7, 12])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_the_parts_cover_every_row_once_in_order(n, world_size):
    rows = [list(part_rows(n, rank, world_size)) for rank in range(world_size)]
    assert sum(rows, []) == list(range(n))
    assert max(map(len, rows)) - min(map(len, rows)) <= 1  # balanced


def test_rows_of_reads_through_get_batch_with_the_split_rows():
    class Split:
        paths = [f"{i}.png" for i in range(10)]

        def __len__(self):
            return 10

        def __getitem__(self, i):
            return i, i % 3

        def get_batch(self, indices):
            return list(indices), [i % 3 for i in indices]

    part = RowsOf(Split(), range(4, 8))
    assert len(part) == 4 and part[1] == (5, 2) and part.paths == ["4.png", "5.png", "6.png", "7.png"]
    assert part.get_batch([0, 3]) == ([4, 7], [1, 1])


def test_a_part_is_reused_by_its_own_job_only_and_the_manifest_needs_every_part(tmp_path):
    job = job_description(fingerprint={"config": "a", "weights": "b"}, split="test", rows=5, world_size=2)
    rows = part_rows(5, 0, 2)
    path = tmp_path / part_name(0, 2)
    assert not existing_part(path, job, rows)
    write_part(path, job, rows, np.ones((2, 3)), [1, 2], ["a.png", "b.png"])
    assert existing_part(path, job, rows)
    table = pq.read_table(path)
    assert table.column("row").to_pylist() == [0, 1] and table.column("path").to_pylist() == ["a.png", "b.png"]
    other = {**job, "split": "train"}
    with pytest.raises(DataError, match="a part of another embedding job"):
        existing_part(path, other, rows)
    with pytest.raises(DataError, match="part-00001-of-00002.parquet' is missing: rank 1 did not finish"):
        write_manifest(tmp_path, job, "runs/x")
    write_part(tmp_path / part_name(1, 2), job, part_rows(5, 1, 2), np.zeros((3, 3)), [0, 0, 0], None)
    manifest = json.loads(write_manifest(tmp_path, job, "runs/x").read_text())
    assert manifest["dim"] == 3 and manifest["run_dir"] == "runs/x" and (tmp_path / MANIFEST).exists()
    assert [p["rows"] for p in manifest["parts"]] == [[0, 2], [2, 5]]
    (tmp_path / "part-00000-of-00002.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="is not a part written by `dmlkit embed`"):
        existing_part(path, job, rows)
