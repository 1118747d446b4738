import pytest
from vtutils.intervals import gaps, merge, normalize, overlaps, total_length


def test_normalize_orders_the_ends():
    assert normalize((5, 2)) == (2, 5)
    assert normalize((2, 5)) == (2, 5)


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((1, 3), (3, 6), True),
        ((1, 2), (3, 4), False),
        ((5, 1), (2, 2), True),
        ((0, 0), (1, 9), False),
    ],
)
def test_overlaps(a, b, expected):
    assert overlaps(a, b) is expected
    assert overlaps(b, a) is expected


def test_merge_joins_overlapping_and_touching_intervals():
    assert merge([(5, 8), (1, 3), (2, 4), (9, 9), (12, 14)]) == [(1, 9), (12, 14)]
    assert merge([(1, 2), (4, 5)]) == [(1, 2), (4, 5)]


def test_merge_of_nested_intervals_keeps_the_outer_end():
    assert merge([(1, 10), (2, 3)]) == [(1, 10)]


def test_merge_of_nothing():
    assert merge([]) == []


def test_total_length_counts_each_integer_once():
    assert total_length([(1, 3), (2, 5)]) == 5
    assert total_length([(4, 4)]) == 1
    assert total_length([]) == 0


def test_gaps_inside_a_range():
    assert gaps([(3, 4), (8, 9)], 1, 10) == [(1, 2), (5, 7), (10, 10)]
    assert gaps([(0, 20)], 1, 10) == []
    assert gaps([], 1, 3) == [(1, 3)]
