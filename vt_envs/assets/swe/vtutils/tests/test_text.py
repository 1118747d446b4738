import pytest
from vtutils.text import camel_to_snake, count_words, slugify, truncate, wrap


def test_slugify():
    assert slugify("Hello, World! 2024") == "hello-world-2024"
    assert slugify("  Many   spaces ", sep="_") == "many_spaces"


def test_truncate_keeps_short_text():
    assert truncate("short", 10) == "short"
    assert truncate("exactly ten", 11) == "exactly ten"


def test_truncate_cuts_with_an_ellipsis():
    assert truncate("a long sentence", 8) == "a lon..."
    assert len(truncate("x" * 50, 12)) == 12


def test_truncate_refuses_a_width_below_the_ellipsis():
    with pytest.raises(ValueError):
        truncate("text", 2)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("parseHTTPResponse", "parse_http_response"),
        ("simple", "simple"),
        ("getV2Data", "get_v_2_data"),
    ],
)
def test_camel_to_snake(name, expected):
    assert camel_to_snake(name) == expected


def test_count_words():
    assert count_words("The cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}


def test_wrap():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]
    assert wrap("supercalifragilistic is long", 5) == ["supercalifragilistic", "is", "long"]
    assert wrap("", 5) == []
