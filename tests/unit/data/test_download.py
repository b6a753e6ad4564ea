"""Downloads against a server on 127.0.0.1 that the test starts, serving archives built here in each
benchmark's real layout: fetch + extract + counts, resume after a cut, wrong checksum, path traversal,
links, size caps, terms, and the CLI verb. Nothing here reaches the internet."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest

from dmlkit.cli.main import main
from dmlkit.data import download as dl
from dmlkit.data._archive import extract_archive
from dmlkit.data.sources import DOWNLOADS, ArchiveSource
from dmlkit.exceptions import DataError

#: What each test-built tree holds, counted by hand from tests/unit/data/conftest.py's builders.
EXPECTED = {
    "cub200": {"train": (9, 3), "test": (6, 2)},   # classes 1, 2, 3 | 101, 102; 3 images each
    "cars196": {"train": (6, 3), "test": (4, 2)},  # classes 1, 2, 98 | 99, 196; 2 images each
    "sop": {"train": (6, 3), "test": (4, 2)},      # products 1-3 | 4-5; 2 images each
}
#: The archive each data set's images come in (the one the bad members are added to) and what it holds.
MAIN_ARCHIVE = {"cub200": ("CUB_200_2011.tgz", "CUB_200_2011"), "cars196": ("car_ims.tgz", "car_ims"),
                "sop": ("Stanford_Online_Products.zip", "Stanford_Online_Products")}
NAMES = sorted(EXPECTED)


def tgz(tree: Path, top: str, extra=()) -> bytes:
    """A gzipped tar of ``tree/top`` (members named ``top/...``) plus ``extra`` TarInfo members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(tree / top, arcname=top)
        for info, data in extra:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return buf.getvalue()


def zipped(tree: Path, top: str, extra=()) -> bytes:
    """A zip of ``tree/top`` plus ``extra`` (ZipInfo, bytes) members."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path in sorted((tree / top).rglob("*")):
            zf.write(path, path.relative_to(tree).as_posix())
        for info, data in extra:
            zf.writestr(info, data)
    return buf.getvalue()


def bad_member(kind: str, archive: str):
    """One refused member for a tar or zip archive: traversal, absolute path, symlink or hard link."""
    if archive.endswith(".zip"):
        if kind == "symlink":
            info = zipfile.ZipInfo("Stanford_Online_Products/link")
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            return info, b"/etc/passwd"
        return zipfile.ZipInfo({"traversal": "../evil.txt", "absolute": "/tmp/evil.txt"}[kind]), b"x"
    info = tarfile.TarInfo({"traversal": "../evil.txt", "absolute": "/tmp/evil.txt"}.get(kind, "link"))
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        return info, None
    if kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, "../../etc/passwd"
        return info, None
    info.size = 1
    return info, b"x"


def published_source(name: str, tmp_path: Path, loopback, layout_makers, extra=(), md5_of=None):
    """The data set's DOWNLOADS entry with its files built here, served by ``loopback``, with their md5s."""
    tree = layout_makers[name](tmp_path / "built")
    archive_name, top = MAIN_ARCHIVE[name]
    files = {archive_name: (zipped if archive_name.endswith(".zip") else tgz)(tree, top, extra)}
    if name == "cars196":
        files["cars_annos.mat"] = (tree / "cars_annos.mat").read_bytes()
    archives = []
    for filename, data in files.items():
        loopback.files[f"/{filename}"] = data
        md5 = (md5_of or {}).get(filename, hashlib.md5(data).hexdigest())
        archives.append(ArchiveSource(filename, (loopback.url(f"/{filename}"),), md5=md5,
                                      extract=filename != "cars_annos.mat", origin="test server"))
    return dataclasses.replace(DOWNLOADS.get(name), archives=tuple(archives), expected=EXPECTED[name]), files


def run_download(name, root, source, lines=None, **kwargs):
    return dl.download_dataset(name, root, source=source, progress=False,
                               echo=(lines if lines is not None else []).append, **kwargs)


@pytest.mark.parametrize("name", NAMES)
def test_download_extracts_the_official_layout_and_checks_the_counts(name, tmp_path, loopback, layout_makers):
    source, files = published_source(name, tmp_path, loopback, layout_makers)
    lines: list[str] = []
    info = run_download(name, tmp_path / "data", source, lines)
    assert {k: (v["images"], v["classes"]) for k, v in info["splits"].items()} == EXPECTED[name]
    assert info["matches_published"] is True and info["problems"] == []
    assert "Terms of use" in lines[0] and source.terms in lines[0]  # printed before anything is fetched
    assert sorted(p for p, _ in loopback.requests) == sorted(f"/{f}" for f in files)
    assert not (tmp_path / "data" / dl.DOWNLOAD_DIR).exists()  # archives removed, nothing left over
    loopback.requests.clear()
    again: list[str] = []
    run_download(name, tmp_path / "data", source, again)  # a complete copy: nothing is fetched again
    assert loopback.requests == [] and "already holds a complete copy" in again[0]


@pytest.mark.parametrize("name", NAMES)
def test_a_cut_transfer_resumes_with_a_range_request(name, tmp_path, loopback, layout_makers):
    source, files = published_source(name, tmp_path, loopback, layout_makers)
    archive_name = MAIN_ARCHIVE[name][0]
    cut = len(files[archive_name]) // 3
    loopback.drop_after[f"/{archive_name}"] = cut
    info = run_download(name, tmp_path / "data", source)
    assert info["matches_published"] is True
    asked = [rng for path, rng in loopback.requests if path == f"/{archive_name}"]
    assert asked == [None, f"bytes={cut}-"]  # the second request asks only for the missing bytes


def test_a_server_that_ignores_range_sends_the_whole_file_again(tmp_path, loopback, layout_makers):
    source, files = published_source("sop", tmp_path, loopback, layout_makers)
    path = "/Stanford_Online_Products.zip"
    loopback.drop_after[path], loopback.ignore_range = len(files[path[1:]]) // 2, {path}
    assert run_download("sop", tmp_path / "data", source)["matches_published"] is True  # not half + whole
    assert [r for p, r in loopback.requests if p == path] == [None, f"bytes={len(files[path[1:]]) // 2}-"]


@pytest.mark.parametrize("name", NAMES)
def test_an_interrupted_download_is_resumed_by_the_next_call(name, tmp_path, loopback, layout_makers, monkeypatch):
    source, files = published_source(name, tmp_path, loopback, layout_makers)
    archive_name = MAIN_ARCHIVE[name][0]
    cut = len(files[archive_name]) // 2
    loopback.drop_after[f"/{archive_name}"] = cut
    monkeypatch.setattr(dl, "fetch", _without_retries(dl.fetch))
    with pytest.raises(DataError, match="is kept; run again to resume"):
        run_download(name, tmp_path / "data", source)
    part = tmp_path / "data" / dl.DOWNLOAD_DIR / f"{archive_name}.part"
    assert part.stat().st_size == cut
    loopback.requests.clear()
    run_download(name, tmp_path / "data", source)
    assert (f"/{archive_name}", f"bytes={cut}-") in loopback.requests
    assert not part.exists()


def _without_retries(fetch):
    def once(*args, **kwargs):
        return fetch(*args, **{**kwargs, "retries": 0})
    return once


@pytest.mark.parametrize("name", NAMES)
def test_a_wrong_checksum_is_refused_and_the_file_deleted_nothing_extracted_lost(name, tmp_path, loopback,
                                                                                 layout_makers):
    archive_name = MAIN_ARCHIVE[name][0]
    source, _ = published_source(name, tmp_path, loopback, layout_makers, md5_of={archive_name: "0" * 32})
    root = tmp_path / "data"
    earlier = root / MAIN_ARCHIVE[name][1] / "extracted-before.txt"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("kept")
    with pytest.raises(DataError, match=f"the published md5 of {archive_name} is 0{{32}}.*deleted"):
        run_download(name, root, source)
    assert earlier.read_text() == "kept"
    assert not (root / dl.DOWNLOAD_DIR / archive_name).exists()
    assert not (root / dl.DOWNLOAD_DIR / f"{archive_name}.part").exists()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["traversal", "absolute", "symlink"])
def test_members_leaving_the_folder_or_links_refuse_the_archive(name, kind, tmp_path, loopback, layout_makers):
    archive_name, top = MAIN_ARCHIVE[name]
    source, _ = published_source(name, tmp_path, loopback, layout_makers, extra=[bad_member(kind, archive_name)])
    root = tmp_path / "data" / "root"
    with pytest.raises(DataError, match="refused, nothing was extracted"):
        run_download(name, root, source)
    assert not (root / top).exists()
    assert not list((tmp_path / "data").rglob("evil.txt")) and not list(root.glob(".*.extracting"))


def test_a_hard_link_in_a_tar_is_refused(tmp_path, loopback, layout_makers):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers,
                                 extra=[bad_member("hardlink", "x.tgz")])
    with pytest.raises(DataError, match="hard link"):
        run_download("cub200", tmp_path / "data", source)
    assert not (tmp_path / "data" / "CUB_200_2011").exists()


@pytest.mark.parametrize("name", NAMES)
def test_archives_over_the_size_caps_are_refused(name, tmp_path, loopback, layout_makers):
    source, files = published_source(name, tmp_path, loopback, layout_makers)
    archive_name, top = MAIN_ARCHIVE[name]
    with pytest.raises(DataError, match="would expand to .* more than the 1,000 allowed"):
        run_download(name, tmp_path / "a", source, max_extracted_bytes=1000)
    assert not (tmp_path / "a" / top).exists()
    with pytest.raises(DataError, match=f"{archive_name} is .* bytes, more than the 100 a download may have"):
        run_download(name, tmp_path / "b", source, max_download_bytes=100)
    with pytest.raises(DataError, match="members, more than the 2 allowed"):
        run_download(name, tmp_path / "c", source, max_members=2)


def test_a_zip_whose_index_understates_a_member_is_refused(tmp_path):
    """A zip whose central directory says 10 bytes for a 5,000-byte member: refused, nothing written."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("a.bin", b"\0" * 5000)
    data = bytearray(buf.getvalue())
    index = data.rfind(b"PK\x01\x02")  # central directory entry: uncompressed size at offset 24
    data[index + 24:index + 28] = (10).to_bytes(4, "little")
    archive = tmp_path / "lying.zip"
    archive.write_bytes(bytes(data))
    with pytest.raises(DataError, match="is damaged"):
        extract_archive(archive, tmp_path / "out", max_bytes=100)
    assert list((tmp_path / "out").iterdir()) == []


def test_zip_members_without_unix_file_types_extract(tmp_path):
    """Zips written without a file type (only permission bits, or by Windows tools) are plain files."""
    archive = tmp_path / "plain.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("top/a.txt", b"a")  # external_attr = 0o600 << 16, no S_IFREG bits
        windows = zipfile.ZipInfo("top/b.txt")
        windows.create_system, windows.external_attr = 0, 0x20  # MS-DOS "archive" attribute
        zf.writestr(windows, b"b")
    assert extract_archive(archive, tmp_path / "out") == ["top"]
    assert [(tmp_path / "out" / "top" / n).read_bytes() for n in ("a.txt", "b.txt")] == [b"a", b"b"]


def test_counts_that_differ_from_the_published_ones_fail_the_download(tmp_path, loopback, layout_makers):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    wrong = dataclasses.replace(source, expected={"train": (5864, 100), "test": (5924, 100)})
    with pytest.raises(DataError, match="train has 9 images of 3 classes but the published split has 5,864"):
        run_download("cub200", tmp_path / "data", wrong)


def test_terms_refused_fetch_nothing(tmp_path, loopback, layout_makers):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    with pytest.raises(DataError, match="terms of use were not accepted"):
        run_download("cub200", tmp_path / "data", source, confirm=lambda: False)
    assert loopback.requests == []


def test_an_archive_put_in_the_root_is_used_after_its_checksum(tmp_path, loopback, layout_makers):
    source, files = published_source("sop", tmp_path, loopback, layout_makers)
    root = tmp_path / "data"
    root.mkdir()
    (root / "Stanford_Online_Products.zip").write_bytes(files["Stanford_Online_Products.zip"])
    assert run_download("sop", root, source)["matches_published"] is True
    assert loopback.requests == []  # offline: the user's copy was verified and extracted
    (root / "Stanford_Online_Products" / "Ebay_test.txt").unlink()
    (root / "Stanford_Online_Products.zip").write_bytes(b"not the archive")
    with pytest.raises(DataError, match="Stanford_Online_Products.zip' has md5"):
        run_download("sop", root, source)


def test_the_mirror_is_tried_first_and_dead_urls_fall_through(tmp_path, loopback, layout_makers):
    source, files = published_source("cub200", tmp_path, loopback, layout_makers)
    loopback.files["/mirror/CUB_200_2011.tgz"] = files["CUB_200_2011.tgz"]
    run_download("cub200", tmp_path / "a", source, mirror=loopback.url("/mirror"))
    assert [p for p, _ in loopback.requests] == ["/mirror/CUB_200_2011.tgz"]
    dead = dataclasses.replace(source.archives[0], urls=(loopback.url("/gone.tgz"), *source.archives[0].urls))
    loopback.requests.clear()
    run_download("cub200", tmp_path / "b", dataclasses.replace(source, archives=(dead,)))
    assert [p for p, _ in loopback.requests] == ["/gone.tgz", "/CUB_200_2011.tgz"]


def test_inshop_prints_its_terms_and_the_manual_layout(tmp_path, capsys):
    assert main(["datasets", "download", "inshop", "--root", str(tmp_path / "inshop"), "--yes"]) == 2
    out = capsys.readouterr()
    assert "non-commercial research" in out.out
    assert "Eval/list_eval_partition.txt" in out.err and "no published checksum" in out.err
    assert not (tmp_path / "inshop").exists()


def test_the_cli_verb_downloads_with_yes_and_reports_the_counts(tmp_path, loopback, layout_makers, monkeypatch,
                                                               capsys):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    monkeypatch.setattr(dl, "_source", lambda name: source)
    assert main(["datasets", "download", "cub200", "--root", str(tmp_path / "cub"), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "research and educational use" in out and '"images": 9' in out
    assert main(["datasets", "info", "cub200", "--root", str(tmp_path / "cub")]) == 1  # not the published 11,788


def test_data_download_true_fetches_before_the_first_read(tmp_path, loopback, layout_makers, monkeypatch, capsys):
    from dmlkit.config import load_config
    from dmlkit.recipe.survey import survey_data

    source, _ = published_source("sop", tmp_path, loopback, layout_makers)
    monkeypatch.setattr(dl, "_source", lambda name: source)
    root = tmp_path / "sop"
    overrides = ["data.name=sop", f"data.root={root}", "data.download=true"]
    assert main(["validate", *[a for o in overrides for a in ("--set", o)]]) == 0  # missing root is fine
    splits = survey_data(load_config(overrides=overrides))
    assert (len(splits.train), len(splits.test)) == (6, 4)
    assert "Stanford Online Products" in capsys.readouterr().out
    loopback.requests.clear()
    survey_data(load_config(overrides=overrides[:2]))  # data.download=false reads the copy, fetches nothing
    assert loopback.requests == []


def test_the_cli_asks_on_a_terminal_and_proceeds_without_one(tmp_path, loopback, layout_makers, monkeypatch, capsys):
    import sys

    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    monkeypatch.setattr(dl, "_source", lambda name: source)
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    assert main(["datasets", "download", "cub200", "--root", str(tmp_path / "asked")]) == 2
    assert "terms of use were not accepted" in capsys.readouterr().err and loopback.requests == []
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # not a terminal: terms printed, then the download
    assert main(["datasets", "download", "cub200", "--root", str(tmp_path / "piped")]) == 0
    out = capsys.readouterr().out
    assert out.index("Terms of use") < out.index("stdin is not a terminal: proceeding") < out.index('"images": 9')
