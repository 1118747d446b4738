"""Closed integer intervals as ``(start, end)`` pairs with ``start <= end``."""


def normalize(interval):
    """``interval`` with its ends in order."""
    start, end = interval
    if start > end:
        start, end = end, start
    return (start, end)


def overlaps(a, b):
    """Whether closed intervals ``a`` and ``b`` share at least one point."""
    a, b = normalize(a), normalize(b)
    return a[0] <= b[1] and b[0] <= a[1]


def merge(intervals):
    """The union of ``intervals`` as sorted, disjoint intervals; touching ones merge."""
    ordered = sorted(normalize(i) for i in intervals)
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1] + 1:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    """How many integers the union of ``intervals`` covers."""
    total = 0
    for start, end in merge(intervals):
        total += end - start + 1
    return total


def gaps(intervals, lo, hi):
    """The intervals inside ``[lo, hi]`` that no interval of ``intervals`` covers."""
    result = []
    cursor = lo
    for start, end in merge(intervals):
        if end < lo or start > hi:
            continue
        if start > cursor:
            result.append((cursor, start - 1))
        cursor = max(cursor, end + 1)
    if cursor <= hi:
        result.append((cursor, hi))
    return result
