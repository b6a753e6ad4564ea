"""Where each benchmark's files come from: URLs, published checksums, terms of use.

One table (``DOWNLOADS``) that ``dmlkit datasets download``, ``data.download=true``, the
PML-named data sets and ``docs/datasets.md`` all read. A data set without an archive that can be
fetched by URL with a published checksum (In-Shop) has ``manual`` instructions instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dmlkit.core.registry import Registry


@dataclass(frozen=True)
class ArchiveSource:
    """One file to fetch: its name, the URLs tried in order, its published checksum.

    ``extract=False`` leaves the file as it is in the root (an annotation file); ``origin`` says
    whose URLs they are (``"official"``, or which mirror) and who publishes the checksum.
    """

    filename: str
    urls: tuple[str, ...]
    md5: str | None = None
    sha256: str | None = None
    extract: bool = True
    origin: str = "official"


@dataclass(frozen=True)
class DatasetSource:
    """How to get data set ``name``: its terms of use, its archives, or manual instructions.

    ``expected`` overrides the registered data set's published counts for the final check
    (``{split: (images, classes)}``; None: the registry's).
    """

    name: str
    title: str
    homepage: str
    terms: str
    archives: tuple[ArchiveSource, ...] = ()
    manual: str = ""
    expected: dict[str, tuple[int, int]] | None = field(default=None)


DOWNLOADS: Registry[DatasetSource] = Registry("downloadable data set")


def register_source(source: DatasetSource) -> DatasetSource:
    """Add ``source`` to :data:`DOWNLOADS` under ``source.name``."""
    DOWNLOADS.register(source.name)(source)
    return source


register_source(DatasetSource(
    name="cub200",
    title="Caltech-UCSD Birds-200-2011 (Wah et al., Caltech technical report CNS-TR-2011-001, 2011)",
    homepage="https://www.vision.caltech.edu/datasets/cub_200_2011/",
    terms=(
        "The photographs were collected from Flickr and belong to their owners. Caltech distributes the\n"
        "data set for non-commercial research and educational use; cite Wah et al. (2011) when you use it."
    ),
    archives=(ArchiveSource(
        filename="CUB_200_2011.tgz",
        urls=("https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",),
        md5="97eceeb196236b17998738112f37df78",
        origin="official (CaltechDATA record 65de6-vp158); md5 of the original Caltech archive as torchvision-based "
               "loaders publish it (the record page lists its own; not compared here, no internet)",
    ),),
))

register_source(DatasetSource(
    name="cars196",
    title="Stanford Cars / Cars196 (Krause et al., 3DRR workshop at ICCV 2013)",
    homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
    terms=(
        "The car photographs come from the web and belong to their owners. Stanford released the data set\n"
        "for non-commercial research use only; cite Krause et al. (2013) when you use it. The original\n"
        "Stanford download links no longer answer: the URLs below are tried in order and every file is\n"
        "checked against the md5 that metric-learning loaders have published for the original files."
    ),
    archives=(
        ArchiveSource(
            filename="car_ims.tgz",
            urls=("http://ai.stanford.edu/~jkrause/car196/car_ims.tgz",
                  "http://imagenet.stanford.edu/internal/car196/car_ims.tgz"),
            md5="d5c8f0aa497503f355e17dc7886c3f14",
            origin="the original Stanford locations (no longer served); md5 published by metric-learning loaders",
        ),
        ArchiveSource(
            filename="cars_annos.mat",
            urls=("http://ai.stanford.edu/~jkrause/car196/cars_annos.mat",
                  "http://imagenet.stanford.edu/internal/car196/cars_annos.mat"),
            md5="b407c6086d669747186bd1d764ff9dbc",
            extract=False,
            origin="the original Stanford locations (no longer served); md5 published by metric-learning loaders",
        ),
    ),
))

register_source(DatasetSource(
    name="sop",
    title="Stanford Online Products (Oh Song et al., CVPR 2016)",
    homepage="https://cvgl.stanford.edu/projects/lifted_struct/",
    terms=(
        "The product photographs were collected from eBay listings and belong to their owners. The data set\n"
        "is released for academic research (see the LICENSE file inside the archive); cite Oh Song et al.\n"
        "(2016) when you use it."
    ),
    archives=(ArchiveSource(
        filename="Stanford_Online_Products.zip",
        urls=("ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
              "https://drive.usercontent.google.com/download?id=1TclrpQOF_ullUP99wk_gjGN8pKvtErG8"
              "&export=download&authuser=0&confirm=t"),
        md5="7f73d41a2f44250d4779881525aea32e",
        origin="official (Stanford FTP, then the Google Drive copy the authors' README links and PML uses); "
               "md5 published by torchvision-based loaders",
    ),),
))

register_source(DatasetSource(
    name="inshop",
    title="DeepFashion In-Shop Clothes Retrieval (Liu et al., CVPR 2016)",
    homepage="https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html",
    terms=(
        "DeepFashion is available for non-commercial research and educational purposes only, under the\n"
        "agreement on its project page; the images belong to their owners."
    ),
    manual=(
        "In-Shop is distributed through a Google Drive folder linked from the DeepFashion page (after its\n"
        "agreement), with no direct-download URL and no published checksum, so dmlkit does not fetch it.\n"
        "Download 'Img/img.zip' and 'Eval/list_eval_partition.txt' from that folder, then lay them out as\n"
        "  ROOT/Eval/list_eval_partition.txt\n"
        "  ROOT/img/...            (unzip img.zip in ROOT: it holds the img/ folder)\n"
        "and check the copy with `dmlkit datasets info inshop --root ROOT`."
    ),
))

register_source(DatasetSource(
    name="inaturalist2018",
    title="iNaturalist 2018 (Van Horn et al., CVPR 2018) with the Smooth-AP retrieval splits (Brown et al., ECCV 2020)",
    homepage="https://github.com/visipedia/inat_comp/tree/master/2018",
    terms=(
        "The iNaturalist images carry their observers' licences (most are Creative Commons); the competition\n"
        "data is provided for research use. Cite Van Horn et al. (2018) and, for the splits, Brown et al. (2020)."
    ),
    manual=(
        "No checksum is published for the 2018 archives or for the Smooth-AP split files (a Google Drive\n"
        "link), so dmlkit does not fetch them. Download and extract into ROOT:\n"
        "  https://ml-inat-competition-datasets.s3.amazonaws.com/2018/train_val2018.tar.gz  (about 120 GB)\n"
        "  https://ml-inat-competition-datasets.s3.amazonaws.com/2018/train2018.json.tar.gz\n"
        "  https://ml-inat-competition-datasets.s3.amazonaws.com/2018/val2018.json.tar.gz\n"
        "  https://drive.google.com/uc?id=1sXfkBTFDrRU3__-NUs1qBP3sf_0uMB98  (Inat_dataset_splits/)\n"
        "so that ROOT holds train_val2018/, train2018.json, val2018.json and\n"
        "Inat_dataset_splits/Inaturalist_train_set1.txt and Inaturalist_test_set1.txt."
    ),
))
