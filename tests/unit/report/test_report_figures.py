"""2-D projection, subsampling, smoothing, colours, HTML escaping."""

from __future__ import annotations

import html as std_html

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.decomposition import PCA

from dmlkit.report.embedding_map import class_colors, pca_2d, subsample_indices
from dmlkit.report.figures import moving_average, time_axis
from dmlkit.report.html import esc, format_value, table


def test_pca_matches_sklearn_up_to_sign_and_maps_extra_points_the_same_way():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 9)) @ np.diag(np.linspace(3, 0.5, 9))
    extra = rng.standard_normal((4, 9))
    coords, extra_coords = pca_2d(x, extra)
    reference = PCA(n_components=2).fit(x)
    expected = reference.transform(x)
    signs = np.sign((coords * expected).sum(axis=0))
    np.testing.assert_allclose(coords, expected * signs, atol=1e-9)
    np.testing.assert_allclose(extra_coords, reference.transform(extra) * signs, atol=1e-9)


def test_pca_handles_one_dimension():
    coords, _ = pca_2d(np.arange(5, dtype=np.float64)[:, None])
    assert coords.shape == (5, 2)
    np.testing.assert_allclose(coords[:, 1], 0.0)
    np.testing.assert_allclose(np.abs(coords[:, 0]), [2, 1, 0, 1, 2])


def test_subsample_is_deterministic_sorted_and_bounded():
    a = subsample_indices(10_000, 2000, seed=3)
    assert a.shape == (2000,) and (np.diff(a) > 0).all() and a.max() < 10_000
    np.testing.assert_array_equal(a, subsample_indices(10_000, 2000, seed=3))
    assert not np.array_equal(a, subsample_indices(10_000, 2000, seed=4))
    np.testing.assert_array_equal(subsample_indices(7, 2000, seed=0), np.arange(7))


def test_moving_average_matches_loop_and_skips_nans():
    values = np.array([1.0, 2.0, np.nan, 4.0, 5.0, 6.0])
    window = 3
    expected = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        expected.append(np.nanmean(chunk))
    np.testing.assert_allclose(moving_average(values, window), expected)


@pytest.mark.parametrize(("seconds", "divisor"), [(100.0, 1.0), (600.0, 60.0), (50_000.0, 3600.0)])
def test_time_axis_picks_readable_units(seconds, divisor):
    assert time_axis(seconds)[0] == divisor


def test_class_colours_are_distinct_for_many_classes():
    for n in (3, 15, 150):
        colours = class_colors(np.arange(n) * 7)
        assert len(colours) == n and len(set(colours.values())) == n


@settings(max_examples=40, deadline=None)
@given(text=st.text(max_size=40))
def test_escaping_round_trips_and_removes_markup(text):
    escaped = esc(text)
    assert std_html.unescape(escaped) == text
    assert not any(ch in escaped for ch in "<>\"'")


def test_table_escapes_cells_and_formats_numbers():
    out = table(("k", "v"), [("<a>", 0.123456), ("lr", 1e-4), ("flag", True), ("list", [1, "x"])],
                numeric_columns=(1,))
    assert "<th>&lt;a&gt;</th>" in out and '<td class="num">0.1235</td>' in out
    assert ">0.0001<" in out and ">true<" in out and "[1, &quot;x&quot;]" in out
    assert format_value(float("nan")) == "nan" and format_value(3) == "3"
