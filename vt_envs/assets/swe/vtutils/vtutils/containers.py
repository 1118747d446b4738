"""Small containers: a bounded LRU cache and a min-stack."""


class LRUCache:
    """At most ``capacity`` items; the least recently used one is evicted first."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._items = {}

    def get(self, key, default=None):
        if key not in self._items:
            return default
        value = self._items.pop(key)
        self._items[key] = value
        return value

    def put(self, key, value):
        if key in self._items:
            self._items.pop(key)
        elif len(self._items) >= self.capacity:
            oldest = next(iter(self._items))
            del self._items[oldest]
        self._items[key] = value

    def __len__(self):
        return len(self._items)

    def keys(self):
        """Keys from least to most recently used."""
        return list(self._items)


class MinStack:
    """A stack that also answers its minimum in constant time."""

    def __init__(self):
        self._items = []
        self._minimums = []

    def push(self, value):
        self._items.append(value)
        if not self._minimums or value <= self._minimums[-1]:
            self._minimums.append(value)

    def pop(self):
        value = self._items.pop()
        if value == self._minimums[-1]:
            self._minimums.pop()
        return value

    def minimum(self):
        if not self._minimums:
            raise IndexError("minimum of an empty stack")
        return self._minimums[-1]

    def __len__(self):
        return len(self._items)
