"""Where the CLI's tables go: stdout at the terminal's width, or, in a CI log (not a terminal), wide
enough that a table of engines, levels and fused ops is not cut to "fusionwa…" at 80 columns."""

from __future__ import annotations

import os
import sys

from rich.console import Console

LOG_WIDTH = 160


def stdout_console() -> Console:
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=LOG_WIDTH)
