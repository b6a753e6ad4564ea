"""Data set downloads and extraction against a hostile server, a damaged or crowded root and an unlucky disk.

Every case ends in one DataError naming what is at fault (exit 2 through the CLI, no traceback) and
removes or replaces nothing the user had. The server is the suite's loopback one on 127.0.0.1; a full or
read-only disk is the same code path reached with a patched ``OSError`` or free-space figure (the tests
may run as root, for whom permission bits do not hold).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from dmlkit.cli.main import main
from dmlkit.data import _archive
from dmlkit.data import download as dl
from dmlkit.data._archive import extract_archive
from dmlkit.exceptions import DataError
from tests.unit.data.test_download import published_source, run_download


def tar_of(path: Path, members: dict[str, bytes | None]) -> Path:
    """A gzipped tar at ``path`` of ``members`` (None: a folder)."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullFile:
    """A file whose writes fail as on a full disk (opened for real, so the path exists as it would)."""

    def __init__(self, path, mode="r", *args, **kwargs):
        self._f = open(path, mode, *args, **kwargs)

    def write(self, data):
        full_disk()

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def free_space(monkeypatch, free: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=free))


# --- extraction never removes or replaces what the target holds -------------------------------------------

@pytest.mark.parametrize("mine, members, said", [
    ({"notes/keep.txt": b"mine"}, {"notes": b"archive"}, "root/notes' is a folder where the archive has a file"),
    ({"notes": b"mine"}, {"notes/a.txt": b"archive"}, "root/notes' is a file where the archive has a folder"),
    ({"top/a.txt": b"mine"}, {"top/a.txt": b"archive", "top/b.txt": b"b"}, "top/a.txt' differs from the archive's"),
], ids=["file-over-a-folder", "folder-over-a-file", "other-bytes"])
def test_extraction_refuses_to_replace_the_users_paths_and_names_them(tmp_path, mine, members, said):
    root = tmp_path / "root"
    for name, data in mine.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    before = tree(root)
    with pytest.raises(DataError, match=said) as caught:
        extract_archive(tar_of(tmp_path / "a.tgz", members), root)
    assert "Nothing was extracted and nothing removed" in str(caught.value)
    assert tree(root) == before  # the user's files, and no staging folder left


def test_extraction_over_files_with_the_same_bytes_keeps_them_and_adds_the_rest(tmp_path):
    root = tmp_path / "root"
    (root / "top").mkdir(parents=True)
    (root / "top" / "a.txt").write_bytes(b"same")
    extract_archive(tar_of(tmp_path / "a.tgz", {"top/a.txt": b"same", "top/b.txt": b"new"}), root)
    assert tree(root) == {"top": None, "top/a.txt": b"same", "top/b.txt": b"new"}


def test_stale_staging_folders_of_killed_extractions_are_removed_by_the_next_one(tmp_path):
    root = tmp_path / "root"
    archive = tar_of(tmp_path / "a.tgz", {"top/a.txt": b"a"})
    dead = root / ".a.tgz.999999999.x1.extracting"  # no such process
    older = root / ".a.tgz.k3j_2abc.extracting"  # named before staging folders held the pid
    live = root / f".a.tgz.{os.getpid()}.x2.extracting"  # a running extraction of the same archive
    other = root / ".b.tgz.999999999.x3.extracting"  # another archive's: not this extraction's business
    for folder in (dead, older, live, other):
        (folder / "top").mkdir(parents=True)
        (folder / "top" / "half.bin").write_bytes(b"\0" * 100)
    extract_archive(archive, root)
    assert sorted(p.name for p in root.iterdir()) == sorted([live.name, other.name, "top"])


def test_extraction_checks_the_declared_size_against_the_free_space(tmp_path, monkeypatch):
    archive = tar_of(tmp_path / "a.tgz", {"top/big.bin": b"\0" * 5000})
    free_space(monkeypatch, 1000)
    with pytest.raises(DataError, match="declares 5,000 bytes of members: 5,000 bytes are needed but .* has only "
                                        "1,000 bytes free"):
        extract_archive(archive, tmp_path / "root")
    assert list((tmp_path / "root").iterdir()) == []


def test_a_full_disk_during_extraction_is_said_not_a_damaged_archive(tmp_path, monkeypatch):
    archive = tar_of(tmp_path / "a.tgz", {"top/a.bin": b"\0" * 100})
    monkeypatch.setattr(_archive, "open", _FullFile, raising=False)  # the module's open(): the members' files
    with pytest.raises(DataError) as caught:
        extract_archive(archive, tmp_path / "root")
    message = str(caught.value)
    assert "is full (no space left on device; 100 bytes needed" in message and "damaged" not in message
    assert list((tmp_path / "root").iterdir()) == []


def test_a_target_that_refuses_writes_is_said(tmp_path, monkeypatch):
    archive = tar_of(tmp_path / "a.tgz", {"top/a.bin": b"a"})

    def read_only(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_archive.tempfile, "mkdtemp", read_only)
    with pytest.raises(DataError, match="root' cannot be written \\(Permission denied\\); nothing was extracted"):
        extract_archive(archive, tmp_path / "root")


# --- the root --------------------------------------------------------------------------------------------

def _root_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "afile").write_text("x")
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / ".dmlkit-downloads").write_text("x")
    return {"a file": (tmp_path / "afile", "'.*afile' is a file, not a folder"),
            "under a file": (tmp_path / "afile" / "data", "data' cannot be created: '.*afile' is a file"),
            "downloads folder a file": (crowded, "dmlkit-downloads' is a file, not a folder")}


@pytest.mark.parametrize("case", ["a file", "under a file", "downloads folder a file"])
def test_a_root_that_cannot_hold_the_download_is_one_message(case, tmp_path, loopback, layout_makers):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    root, said = _root_cases(tmp_path)[case]
    with pytest.raises(DataError, match=said):
        run_download("cub200", root, source)
    assert loopback.requests == []
    assert (tmp_path / "afile").read_text() == "x"


def test_a_read_only_root_is_one_message(tmp_path, loopback, layout_makers, monkeypatch):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path / "ro")
    with pytest.raises(DataError, match="'.*ro' is not writable by this user. Choose a root"):
        run_download("cub200", tmp_path / "ro", source)
    real_mkdir = Path.mkdir

    def refusing(self, *args, **kwargs):
        if self == tmp_path / "ro2":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refusing)
    with pytest.raises(DataError, match="ro2' cannot be created \\(Permission denied\\)"):
        run_download("cub200", tmp_path / "ro2", source)
    assert loopback.requests == []


def test_a_bad_root_through_the_cli_data_download_and_the_pml_class(tmp_path, loopback, layout_makers,
                                                                    monkeypatch, capsys):
    from dmlkit.config import load_config
    from dmlkit.data.pml_datasets import Cars196
    from dmlkit.recipe.survey import survey_data

    source, _ = published_source("cars196", tmp_path, loopback, layout_makers)
    monkeypatch.setattr(dl, "_source", lambda name: source)
    root = tmp_path / "afile"
    root.write_text("x")
    assert main(["datasets", "download", "cars196", "--root", str(root), "--yes"]) == 2
    err = capsys.readouterr().err
    assert "afile' is a file, not a folder" in err and "Traceback" not in err
    overrides = ["data.name=cars196", f"data.root={root / 'cars'}", "data.download=true"]
    with pytest.raises(DataError, match="cars' cannot be created: '.*afile' is a file"):
        survey_data(load_config(overrides=overrides))
    monkeypatch.setattr(Cars196, "source", source)
    with pytest.raises(DataError, match="afile' is a file, not a folder"):
        Cars196(str(root), download=True)
    assert root.read_text() == "x" and loopback.requests == []


@pytest.mark.parametrize("mirror", ["", "http://[::1/x", "not a url", "http://host:port/x"])
def test_a_malformed_mirror_is_one_message_through_the_cli(mirror, tmp_path, loopback, layout_makers, monkeypatch,
                                                            capsys):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    monkeypatch.setattr(dl, "_source", lambda name: source)
    assert main(["datasets", "download", "cub200", "--root", str(tmp_path / "r"), "--yes", "--mirror", mirror]) == 2
    err = capsys.readouterr().err
    assert f"The mirror URL {mirror!r} is" in err and "Traceback" not in err
    assert loopback.requests == [] and not (tmp_path / "r").exists()


# --- the server -----------------------------------------------------------------------------------------

def test_a_content_length_that_is_not_a_number_is_read_to_the_end_and_checked(tmp_path, loopback, layout_makers):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    loopback.headers["/CUB_200_2011.tgz"] = {"Content-Length": "abc"}
    assert run_download("cub200", tmp_path / "data", source)["matches_published"] is True


def test_an_endless_body_is_cut_at_the_cap_deleted_and_the_next_url_tried(tmp_path, loopback, layout_makers):
    source, files = published_source("cub200", tmp_path, loopback, layout_makers)
    good = files["CUB_200_2011.tgz"]
    loopback.files["/endless.tgz"] = b"\0" * (len(good) * 4)
    loopback.headers["/endless.tgz"] = {"Content-Length": None}  # no length announced: the cap must cut it
    archive = source.archives[0]
    endless = dataclasses.replace(archive, urls=(loopback.url("/endless.tgz"),))
    with pytest.raises(DataError, match="endless.tgz sent more than the .* bytes a download may have; refused; "
                                        "the partial file was deleted"):
        run_download("cub200", tmp_path / "a", dataclasses.replace(source, archives=(endless,)),
                     max_download_bytes=len(good) + 10)
    assert list((tmp_path / "a").iterdir()) == []  # no .part, no downloads folder
    both = dataclasses.replace(archive, urls=(loopback.url("/endless.tgz"), *archive.urls))
    info = run_download("cub200", tmp_path / "b", dataclasses.replace(source, archives=(both,)),
                        max_download_bytes=len(good) + 10)
    assert info["matches_published"] is True and not (tmp_path / "b" / dl.DOWNLOAD_DIR).exists()


def test_the_free_space_is_checked_before_a_transfer(tmp_path, loopback, layout_makers, monkeypatch):
    source, files = published_source("cub200", tmp_path, loopback, layout_makers)
    free_space(monkeypatch, 100)
    size = len(files["CUB_200_2011.tgz"])
    with pytest.raises(DataError, match=f"announces {size:,} bytes: {size:,} bytes are needed but .* has only 100 "
                                        "bytes free. Free some space"):
        run_download("cub200", tmp_path / "data", source)
    assert list((tmp_path / "data").iterdir()) == []


def test_a_disk_that_fills_up_during_a_transfer_gets_its_space_back(tmp_path, loopback, layout_makers, monkeypatch):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    monkeypatch.setattr(dl, "open", _FullFile, raising=False)  # the module's open(): the .part file
    with pytest.raises(DataError, match="is full \\(no space left on device.*The partial file was deleted"):
        run_download("cub200", tmp_path / "data", source)
    assert list((tmp_path / "data").iterdir()) == []


def test_a_redirect_to_another_host_is_said_and_errors_name_where_it_led(tmp_path, loopback, layout_makers):
    source, _ = published_source("cub200", tmp_path, loopback, layout_makers)
    port = loopback.server.server_address[1]
    loopback.redirects["/moved.tgz"] = f"http://localhost:{port}/CUB_200_2011.tgz"
    loopback.redirects["/lost.tgz"] = f"http://localhost:{port}/gone.tgz"
    archive = source.archives[0]
    moved = dataclasses.replace(archive, urls=(loopback.url("/moved.tgz"),))
    lines: list[str] = []
    run_download("cub200", tmp_path / "a", dataclasses.replace(source, archives=(moved,)), lines)
    assert any(f"moved.tgz redirected to another host: http://localhost:{port}/CUB_200_2011.tgz" in line
               for line in lines)
    lost = dataclasses.replace(archive, urls=(loopback.url("/lost.tgz"),))
    with pytest.raises(DataError, match=f"lost.tgz -> http://localhost:{port}/gone.tgz: Not Found"):
        run_download("cub200", tmp_path / "b", dataclasses.replace(source, archives=(lost,)))


# --- the readers ----------------------------------------------------------------------------------------

def test_a_pml_class_given_a_file_as_root_says_so(tmp_path):
    from dmlkit.data.pml_datasets import CUB

    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match="root '.*afile' is a file, not a folder"):
        CUB(str(tmp_path / "afile"))


@pytest.mark.parametrize("content, said", [
    ('{"images": [', "val2018.json' is not valid JSON"),
    ('{"images": []}', "val2018.json' lacks the key 'annotations'"),
    ('{"images": [{"id": 1}], "annotations": [{"image_id": 1, "category_id": 3}]}', "lacks the key 'file_name'"),
    ("[1, 2]", "val2018.json' has an entry of the wrong type"),
])
def test_inaturalist_names_a_damaged_or_keyless_annotation_file(content, said, tmp_path):
    from dmlkit.data.pml_datasets import INaturalist2018

    (tmp_path / "val2018.json").write_text(content)
    (tmp_path / "train2018.json").write_text(json.dumps({"images": [], "annotations": []}))
    with pytest.raises(DataError, match=said):
        INaturalist2018(str(tmp_path))
