import pytest
from vtutils.stats import mean, median, mode, moving_average, percentile


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    with pytest.raises(ValueError):
        mean([])


def test_median_odd_and_even():
    assert median([5, 1, 3]) == 3
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_mode_prefers_the_first_seen_on_ties():
    assert mode([3, 1, 3, 2, 1]) == 3
    assert mode(["b", "a", "a"]) == "a"
    assert mode([]) is None


def test_moving_average():
    assert moving_average([1, 2, 3, 4, 5], 2) == [1.5, 2.5, 3.5, 4.5]
    assert moving_average([1, 2, 3], 3) == [2.0]
    assert moving_average([1, 2], 3) == []
    with pytest.raises(ValueError):
        moving_average([1], 0)


@pytest.mark.parametrize("q, expected", [(0, 10), (50, 25), (100, 40), (25, 17.5)])
def test_percentile(q, expected):
    assert percentile([40, 10, 20, 30], q) == pytest.approx(expected)


def test_percentile_refuses_q_outside_0_100():
    with pytest.raises(ValueError):
        percentile([1, 2], 101)
