"""Text helpers."""

import re


def slugify(text, sep="-"):
    """Lowercase words of ``text`` joined by ``sep``; other characters dropped."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return sep.join(words)


def truncate(text, width, ellipsis="..."):
    """``text`` cut to at most ``width`` characters, ending with ``ellipsis`` when cut."""
    if width < len(ellipsis):
        raise ValueError("width is smaller than the ellipsis")
    if len(text) <= width:
        return text
    return text[: width - len(ellipsis)] + ellipsis


def camel_to_snake(name):
    """``"parseHTTPResponse"`` -> ``"parse_http_response"``."""
    words = re.findall(r"[A-Z]+(?=[A-Z][a-z]|\d|$)|[A-Z]?[a-z]+|\d+", name)
    return "_".join(word.lower() for word in words)


def count_words(text):
    """A dict of each lowercase word's count."""
    counts = {}
    for word in re.findall(r"[a-z']+", text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts


def wrap(text, width):
    """``text``'s words in lines of at most ``width`` characters (long words alone)."""
    lines, current = [], ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = current + " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines
