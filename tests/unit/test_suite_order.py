"""The suite's own scheduling table (tests/conftest.py): every file it names exists and is moved to the front."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _suite_conftest():
    spec = importlib.util.spec_from_file_location("dmlkit_tests_root_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_long_first_file_exists_once():
    long_first = _suite_conftest().LONG_FIRST
    assert len(set(long_first)) == len(long_first)
    missing = [path for path in long_first if not (ROOT / path).is_file()]
    assert not missing, f"tests/conftest.py LONG_FIRST names files that do not exist: {missing}"


def test_long_files_move_to_the_front_in_table_order_and_the_rest_keep_theirs():
    conftest = _suite_conftest()
    first, second = conftest.LONG_FIRST[:2]
    ids = ["tests/unit/a.py::t1", f"{second}::t1", "tests/unit/b.py::t1", f"{first}::t1", f"{second}::t2",
           "tests/unit/a.py::t2"]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [f"{first}::t1", f"{second}::t1", f"{second}::t2",
                                               "tests/unit/a.py::t1", "tests/unit/b.py::t1", "tests/unit/a.py::t2"]
