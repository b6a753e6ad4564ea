"""The suite's own scheduling table (tests/conftest.py): every file it names exists and is moved to the front."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _suite_conftest(pytestconfig):
    """tests/conftest.py as pytest loaded it (a plugin named by its path)."""
    module = pytestconfig.pluginmanager.get_plugin(str(ROOT / "tests" / "conftest.py"))
    assert module is not None, "tests/conftest.py is not loaded"
    return module


def test_every_long_first_file_exists_once(pytestconfig):
    long_first = _suite_conftest(pytestconfig).LONG_FIRST
    assert len(set(long_first)) == len(long_first)
    missing = [path for path in long_first if not (ROOT / path).is_file()]
    assert not missing, f"tests/conftest.py LONG_FIRST names files that do not exist: {missing}"


def test_long_files_move_to_the_front_in_table_order_and_the_rest_keep_theirs(pytestconfig):
    conftest = _suite_conftest(pytestconfig)
    first, second = conftest.LONG_FIRST[:2]
    ids = ["tests/unit/a.py::t1", f"{second}::t1", "tests/unit/b.py::t1", f"{first}::t1", f"{second}::t2",
           "tests/unit/a.py::t2"]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [f"{first}::t1", f"{second}::t1", f"{second}::t2",
                                               "tests/unit/a.py::t1", "tests/unit/b.py::t1", "tests/unit/a.py::t2"]


def test_make_test_deals_whole_files_in_the_conftest_order():
    """Without --no-loadscope-reorder, xdist re-sorts the files by their number of tests and LONG_FIRST is lost."""
    (command,) = [line for line in (ROOT / "Makefile").read_text().splitlines() if " -m pytest " in line]
    assert "-n 2" in command and "--dist loadfile" in command and "--no-loadscope-reorder" in command, command
