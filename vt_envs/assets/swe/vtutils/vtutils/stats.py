"""Descriptive statistics of numeric sequences."""


def mean(values):
    """The arithmetic mean; a ValueError for no values."""
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def median(values):
    """The middle value (the mean of the two middle values for an even count)."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def mode(values):
    """The most common value; ties go to the value seen first."""
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    best, best_count = None, 0
    for value in values:
        if counts[value] > best_count:
            best, best_count = value, counts[value]
    return best


def moving_average(values, window):
    """Means of each run of ``window`` consecutive values."""
    if window < 1:
        raise ValueError("window must be at least 1")
    result = []
    for i in range(len(values) - window + 1):
        result.append(sum(values[i : i + window]) / window)
    return result


def percentile(values, q):
    """The ``q``-th percentile (0-100) by linear interpolation between ranks."""
    if not 0 <= q <= 100:
        raise ValueError("q must be between 0 and 100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction
