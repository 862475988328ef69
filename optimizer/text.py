"""Bounded text for anything a user sees (near misses, errors, logs, stored reports).

Models are hostile input: a node name can be megabytes long and a tensor's values can be a
file's contents. Whatever quotes them goes through here, so no reply or stored row carries
more than a short name or a few values.
"""

from __future__ import annotations

import numpy as np

MAX_NAME_CHARS = 200
MAX_VALUES_SHOWN = 4


def shorten(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """`text`, cut to `limit` characters with a marker saying how much was dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[+{len(text) - limit} chars]"


def preview(values, limit: int = MAX_VALUES_SHOWN) -> str:
    """At most `limit` values of an array or sequence, e.g. "[1, 2, 3, 4, … 8 values]"."""
    flat = np.asarray(values).reshape(-1)
    shown = ", ".join(str(v) for v in flat[:limit].tolist())
    if flat.size <= limit:
        return f"[{shown}]"
    return f"[{shown}, … {flat.size} values]"
