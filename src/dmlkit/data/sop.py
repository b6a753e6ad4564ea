"""Stanford Online Products (Oh Song et al. 2016): Ebay_train.txt / Ebay_test.txt, 11,318 / 11,316 classes."""

from __future__ import annotations

from pathlib import Path

from dmlkit.data._files import find_root, missing_file_error, read_table, to_int
from dmlkit.data.registry import DatasetSpec, SplitSource, register_dataset

LAYOUT = (
    "<root>/Stanford_Online_Products/Ebay_train.txt and Ebay_test.txt (header 'image_id class_id super_class_id path', "
    "rows like '1 1 1 bicycle_final/111085122871_0.JPG') and the <category>_final/ folders"
)
HEADER = "image_id class_id super_class_id path"


def read_sop(root, label="class", eval_label="class") -> dict[str, SplitSource]:
    """Parse the official train/test lists; labels are the product (class_id) ids."""
    base = find_root(root, "Ebay_train.txt", ("Stanford_Online_Products",))
    out = {}
    for split, file in (("train", "Ebay_train.txt"), ("test", "Ebay_test.txt")):
        path = base / file
        if not path.is_file():
            raise missing_file_error("sop", Path(root) / "Stanford_Online_Products" / file, LAYOUT)
        rows = read_table(path, "sop", LAYOUT, 4, header=HEADER)
        out[split] = SplitSource(
            names={"class": [f"{to_int(r[1], path, 'sop', 'class_id'):05d}" for r in rows]},
            paths=[str(base / r[3]) for r in rows],
        )
    return out


SOP = register_dataset(
    DatasetSpec(
        name="sop",
        read=read_sop,
        published={"train": (59551, 11318), "test": (60502, 11316)},
        layout=LAYOUT,
    )
)
