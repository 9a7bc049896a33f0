"""The statistics every table is made of (bench/stats.py) and their text (bench/report.py),
on numbers worked out by hand."""

from __future__ import annotations

import pytest

from meshalloc_cli.bench.report import geomean_text, range_text, stat_text
from meshalloc_cli.bench.stats import Geomean, Stat, geomean, geomean_of, paired_ratios, ratio


def test_stat_is_median_and_range_of_the_values_present():
    assert Stat.of([3.0, None, 1.0, 2.0, 10.0]) == Stat(2.5, 1.0, 10.0)
    assert Stat.of([None]) is None
    assert Stat(4.0, 2.0, 8.0).scaled(2.0) == Stat(2.0, 1.0, 4.0)


def test_geomean_and_ratio_of_medians():
    assert geomean([1.0, 4.0, None, 0.0]) == pytest.approx(2.0)
    assert geomean([]) is None
    assert ratio(Stat(3.0, 2.0, 4.0), Stat(2.0, 1.0, 3.0)) == pytest.approx(1.5)
    assert ratio(Stat(3.0, 2.0, 4.0), Stat(0.0, 0.0, 0.0)) is None
    assert ratio(None, Stat(1.0, 1.0, 1.0)) is None


def test_paired_ratios_pair_repetition_with_repetition():
    assert paired_ratios({1: 2.0, 2: 3.0, 3: 5.0}, {1: 1.0, 2: 2.0, 4: 7.0}) == {1: 2.0, 2: 1.5}


def test_geomean_of_rows_with_the_spread_of_the_per_repetition_geomeans():
    # Row x: ratios 2 and 8 in repetitions 1 and 2; row y: 2 and 0.5. Per repetition: sqrt(2*2)=2
    # and sqrt(8*0.5)=2 -> no spread; with y's second at 2: sqrt(16)=4.
    flat = geomean_of([(4.0, {1: 2.0, 2: 8.0}), (1.0, {1: 2.0, 2: 0.5})])
    assert flat.value == pytest.approx(2.0) and flat.rows == 2
    assert (flat.low, flat.high) == (pytest.approx(2.0), pytest.approx(2.0))
    spread = geomean_of([(4.0, {1: 2.0, 2: 8.0}), (1.0, {1: 2.0, 2: 2.0})])
    assert (spread.low, spread.high) == (pytest.approx(2.0), pytest.approx(4.0))


def test_geomean_of_has_no_spread_when_a_row_is_missing():
    partial = geomean_of([(4.0, {1: 2.0, 2: 8.0}), (None, {})])
    assert partial.value == pytest.approx(4.0) and partial.rows == 1
    assert partial.low is None and partial.high is None


def test_texts_show_a_range_only_when_it_shows_at_that_precision():
    assert stat_text(Stat(1.234, 1.1, 1.31)) == "1.23 (1.10–1.31)"
    assert stat_text(Stat(1.234, 1.231, 1.2349)) == "1.23"
    assert stat_text(Stat(1.234, 1.1, 1.31), show_range=False) == "1.23"
    assert stat_text(Stat(3 << 20, 2 << 20, 4 << 20), 1, 1 << 20, " MiB") == "3.0 MiB (2.0–4.0)"
    assert stat_text(None) == "—"
    assert range_text(1234.0, None, None, 0, thousands=True) == "1,234"
    assert geomean_text(Geomean(0.5, 0.4, 0.6)) == "0.50 (0.40–0.60)"
