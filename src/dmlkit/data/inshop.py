"""In-Shop Clothes Retrieval (Liu et al. 2016): train 3,997 items; query 14,218 / gallery 12,612 of 3,985 items."""

from __future__ import annotations

from pathlib import Path

from dmlkit.data._files import find_root, missing_file_error, read_table
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset
from dmlkit.exceptions import DataError

LAYOUT = (
    "<root>/Eval/list_eval_partition.txt (line 1: image count, line 2: 'image_name item_id evaluation_status', "
    "rows like 'img/WOMEN/Blouses_Shirts/id_00000001/02_1_front.jpg id_00000001 train') and <root>/img/..."
)
HEADER = "image_name item_id evaluation_status"


def read_inshop(root, label="class", eval_label="class") -> dict[str, SplitSource]:
    """Parse list_eval_partition.txt into train / query / gallery (labels are item ids)."""
    base = find_root(root, "Eval/list_eval_partition.txt", ("In-shop Clothes Retrieval Benchmark", "inshop", "InShop"))
    path = base / "Eval" / "list_eval_partition.txt"
    if not path.is_file():
        raise missing_file_error("inshop", Path(root) / "Eval" / "list_eval_partition.txt", LAYOUT)
    rows = read_table(path, "inshop", LAYOUT, 3, header=HEADER, skip=1)
    out = {s: ([], []) for s in ("train", "query", "gallery")}
    for image, item, status in rows:
        if status not in out:
            raise DataError(f"inshop: '{path}' has evaluation_status {status!r}; expected train, query or gallery.")
        out[status][0].append(str(base / image))
        out[status][1].append(item)
    return {k: SplitSource(names={"class": n}, paths=p) for k, (p, n) in out.items()}


INSHOP = register_dataset(
    DatasetSpec(
        name="inshop",
        read=read_inshop,
        eval_mode="query_gallery",
        published={"train": (25882, 3997), "query": (14218, 3985), "gallery": (12612, 3985)},
        layout=LAYOUT,
    )
)
