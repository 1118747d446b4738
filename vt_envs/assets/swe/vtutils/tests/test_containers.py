import pytest
from vtutils.containers import LRUCache, MinStack


def test_lru_cache_evicts_the_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.keys() == ["a", "c"]
    assert len(cache) == 2


def test_lru_cache_update_keeps_the_size():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("a", 5)
    assert len(cache) == 1 and cache.get("a") == 5
    assert cache.get("missing", 0) == 0


def test_lru_cache_refuses_no_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_min_stack_tracks_the_minimum():
    stack = MinStack()
    for value in (5, 3, 7, 3, 1):
        stack.push(value)
    assert stack.minimum() == 1
    assert stack.pop() == 1 and stack.minimum() == 3
    assert stack.pop() == 3 and stack.minimum() == 3
    stack.pop()
    stack.pop()
    assert stack.minimum() == 5 and len(stack) == 1


def test_min_stack_minimum_of_nothing():
    with pytest.raises(IndexError):
        MinStack().minimum()
