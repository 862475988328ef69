"""Bounded field types for request bodies: every string and list has a maximum length, every number a
range its column can hold, and nothing a path join, a shell or PostgreSQL's text type reads twice
(path separators, '..', NUL and other control characters).

A hostile client posts what it likes; a value outside these bounds is a 422 naming the field, never a
500 from the database (an integer too large for its column, NUL in a text column) or a number that
makes no sense stored as data (NaN or 1e300 milliseconds).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

INT32_MAX = 2**31 - 1  # an Integer column
INT64_MAX = 2**63 - 1  # a BigInteger column
MAX_MS = 86_400_000.0  # one day: no timed run of a model takes longer
# The largest finite float32 (3.4e38): an fp32 model's error can be no larger; the client reports an
# infinite one as no value.
MAX_ERROR = 3.5e38

_NO_CONTROL = r"[^\x00-\x1f\x7f]"

# Free text (commit messages keep their newlines and tabs; NUL and the other controls go).
Text = Annotated[str, StringConstraints(max_length=10_000, pattern=r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$")]


def line(max_length: int, min_length: int = 0) -> Any:
    """One line of at most `max_length` characters, no control characters."""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length,
                                            pattern=f"^{_NO_CONTROL}*$")]


# A commit: letters, digits, '.', '_', '-', starting with a letter or digit (so never '..' or '-x').
Sha = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
# A model: a file's name, never a path (no '/', '\\'), never hidden, '.' or '..'.
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=255,
                                             pattern=r"^[^/\\\x00-\x1f\x7f.][^/\\\x00-\x1f\x7f]*$")]
ProjectName = line(200, min_length=1)
# An op key ("com.microsoft.BiasGelu"), a rule's name, a feed's name.
Key = line(300, min_length=1)
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Milliseconds = Annotated[float, Field(gt=0, le=MAX_MS, allow_inf_nan=False)]
# A share of a run (a rule's or a kernel's time), which rounds to 0 for the quick ones.
ShareMs = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]
Error = Annotated[float, Field(ge=0, le=MAX_ERROR, allow_inf_nan=False)]
