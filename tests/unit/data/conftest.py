"""Fixtures: tiny trees in each benchmark's exact on-disk layout."""

from __future__ import annotations

import pytest

from dmlkit_data_fixtures import make_cars, make_cub, make_inshop, make_omniglot, make_sop


@pytest.fixture
def cub_root(tmp_path):
    return make_cub(tmp_path / "cub")


@pytest.fixture
def cars_root(tmp_path):
    return make_cars(tmp_path / "cars")


@pytest.fixture
def sop_root(tmp_path):
    return make_sop(tmp_path / "sop")


@pytest.fixture
def inshop_root(tmp_path):
    return make_inshop(tmp_path / "inshop")


@pytest.fixture
def omniglot_root(tmp_path):
    return make_omniglot(tmp_path / "omni")
