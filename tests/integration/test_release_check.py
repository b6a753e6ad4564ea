"""scripts/release_check.py: the sdist built from the tracked files holds the package, and the check sees what is
missing or stray (the wheel and the fresh-venv install are the script's slower steps, run before a release)."""

from __future__ import annotations

import tarfile


def test_the_sdist_holds_every_module_preset_and_the_c_source_and_the_check_sees_gaps(script_loader, tmp_path):
    check = script_loader("release_check")
    files, version = check.tracked_files(), check.project_version()
    sdist = check.build_sdist(check.ROOT, tmp_path)
    assert sdist.name == f"dmlkit-{version}.tar.gz"
    assert check.sdist_problems(sdist, files, version) == []
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
    assert f"dmlkit-{version}/src/dmlkit/config/presets/mnist-proxy-anchor.yaml" in names
    assert f"dmlkit-{version}/src/dmlkit/evaluation/_knn_scan.c" in names

    # the check names what is missing or stray
    problems = check.sdist_problems(sdist, [*files, "src/dmlkit/not_shipped.py"], "9.9")
    assert "sdist lacks src/dmlkit/not_shipped.py" in problems
    assert any(p.startswith("sdist dmlkit-") and "is not version 9.9" in p for p in problems)
    bad = tmp_path / "bad" / sdist.name
    bad.parent.mkdir()
    with tarfile.open(sdist) as src, tarfile.open(bad, "w:gz") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
        stray = tmp_path / "x.so"
        stray.write_bytes(b"")
        dst.add(stray, arcname=f"dmlkit-{version}/src/dmlkit/evaluation/_knn_scan.so")
    assert check.sdist_problems(bad, files, version) == ["sdist holds src/dmlkit/evaluation/_knn_scan.so"]
